"""Batch-invariant linear against cuBLAS (torch.nn.functional.linear) at the engine's Qwen3 shapes.

For every projection shape and M in {1, 16, 64, 256, 1024, 4096, 8192} (bf16) we time both and
print microseconds, TFLOP/s, GB/s and ours/cuBLAS. Times are medians over CUDA-graph replays
(so launch overhead, which CUDA graphs remove in the engine too, does not swamp small M) of a
graph that cycles through enough weight copies to spill L2: in a forward each layer reads a
weight that is not in cache. A "forward" summary weights each shape by how often a forward runs
it (per layer x layers, plus lm_head once), which is what the <= 10% budget is about.

Then, within --sweep-budget-s seconds, a sweep times other fixed tilings per shape at a few M
(tile sizes, pipeline depth, persistent or one-tile grid, pointer or TMA operand loads), checks
each stays bitwise row invariant, and picks per (N, K) a family of interchangeable tilings (same
split_k: they sum every row in the same order, see shardinfer/kernels/matmul.py) with its fastest
member at each sweep M serving a range of M (BUCKETS). Families are ranked by a weighted geometric
mean of ours/cuBLAS over the sweep's M values, weighted like a throughput run spends its GEMM time
(SWEEP_WEIGHTS: mostly decode steps at batch 256, then prefill chunks).

    python bench/kernels/bench_matmul.py [--out DIR] [--sweep-budget-s 240] [--models 0.6b,8b]
    python bench/kernels/bench_matmul.py --from-sweep results/kernels-matmul-sweep-....json --write-configs
        (re-pick the winners of a saved sweep, e.g. after changing the weights; no timing)
    python bench/kernels/bench_matmul.py --models 8b --refine-m 32 [--write-configs]
        (one more range of M ending at 32: every candidate of each shape's shipped family timed
        at M = 32 against the tiling that serves it now; a speculative step at batch 16 runs 32 rows)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.workloads import bench_commit
from shardinfer.kernels import matmul as mm
from shardinfer.kernels import tuning

ROOT = Path(__file__).resolve().parents[2]

MODELS = {  # name: (layers, {projection: (N, K)})
    "0.6b": (
        28,
        {
            "qkv": (4096, 1024),
            "gate_up": (6144, 1024),
            "o": (1024, 2048),
            "down": (1024, 3072),
            "lm_head": (151936, 1024),
        },
    ),
    "8b": (
        36,
        {
            "qkv": (6144, 4096),
            "gate_up": (24576, 4096),
            "o": (4096, 4096),
            "down": (4096, 12288),
            "lm_head": (151936, 4096),
        },
    ),
    # DeepSeek-V3 architecture at Moonlight-16B-A3B size: attention and shared-expert projections
    # (the routed experts run in the fused MoE kernel, the one dense layer is left out).
    "moe-16b": (
        27,
        {
            "q": (3072, 2048),
            "kv_a": (576, 2048),
            "o": (2048, 2048),
            "shared_gate_up": (5632, 2048),
            "shared_down": (2048, 2816),
            "lm_head": (163840, 2048),
        },
    ),
}
MS = (1, 16, 64, 256, 1024, 4096, 8192)
SWEEP_MS = (1, 64, 256, 4096)
# How a throughput run's GEMM time splits over batch sizes (bench/RESULTS.md: decode at batch
# ~256 takes about two thirds of the wall time, prefill chunks most of the rest). A single
# tiling serves every M, so it should be fastest where the time goes; an M=1 win that costs
# M=256 time is a loss for this engine.
SWEEP_WEIGHTS = {1: 0.05, 64: 0.15, 256: 0.5, 4096: 0.3}
CANDIDATES = {
    "128x128x64_w8_s4": mm.TileConfig(128, 128, 64, num_warps=8, num_stages=4),
    "128x128x64_w8_s3": mm.TileConfig(128, 128, 64, num_warps=8, num_stages=3),
    "128x256x64_w8_s3": mm.TileConfig(128, 256, 64, num_warps=8, num_stages=3),
    "128x64x64_w8_s4": mm.TileConfig(128, 64, 64, num_warps=8, num_stages=4),
    "128x64x64_w4_s4": mm.TileConfig(128, 64, 64, num_warps=4, num_stages=4),
    "128x32x64_w4_s4": mm.TileConfig(128, 32, 64, num_warps=4, num_stages=4),
    "64x128x64_w4_s4": mm.TileConfig(64, 128, 64, num_warps=4, num_stages=4),
    "64x256x64_w4_s3": mm.TileConfig(64, 256, 64, num_warps=4, num_stages=3),
    "64x64x64_w4_s4_2persm": mm.TileConfig(64, 64, 64, num_warps=4, num_stages=4, programs_per_sm=2),
    "64x32x64_w4_s5": mm.TileConfig(64, 32, 64, num_warps=4, num_stages=5),
    "64x64x64_w4_s4": mm.TileConfig(64, 64, 64, num_warps=4, num_stages=4),
    "64x32x128_w4_s3": mm.TileConfig(64, 32, 128, num_warps=4, num_stages=3),
    "64x64x128_w4_s3": mm.TileConfig(64, 64, 128, num_warps=4, num_stages=3),
    # Fixed split-K: short K loops for decode; each is still one tiling for every M.
    "64x128x64_w4_s4_tma_sk2": mm.TileConfig(64, 128, 64, num_warps=4, num_stages=4, tma=True, split_k=2),
    "64x128x64_w4_s4_tma_sk4": mm.TileConfig(64, 128, 64, num_warps=4, num_stages=4, tma=True, split_k=4),
    "64x64x64_w4_s4_sk4": mm.TileConfig(64, 64, 64, num_warps=4, num_stages=4, split_k=4),
    "64x64x64_w4_s4_sk2": mm.TileConfig(64, 64, 64, num_warps=4, num_stages=4, split_k=2),
    "64x32x64_w4_s5_sk2": mm.TileConfig(64, 32, 64, num_warps=4, num_stages=5, split_k=2),
    "64x64x64_w4_s4_tma_sk2": mm.TileConfig(64, 64, 64, num_warps=4, num_stages=4, tma=True, split_k=2),
    "128x128x64_w8_s4_tma_sk2": mm.TileConfig(128, 128, 64, num_warps=8, num_stages=4, tma=True, split_k=2),
    "128x128x64_w8_s4_grid": mm.TileConfig(128, 128, 64, num_warps=8, num_stages=4, persistent=False),
    "128x128x64_w8_s3_tma": mm.TileConfig(128, 128, 64, num_warps=8, num_stages=3, tma=True),
    "128x128x64_w8_s4_tma": mm.TileConfig(128, 128, 64, num_warps=8, num_stages=4, tma=True),
    "128x256x64_w8_s3_tma": mm.TileConfig(128, 256, 64, num_warps=8, num_stages=3, tma=True),
    "128x64x64_w8_s4_tma": mm.TileConfig(128, 64, 64, num_warps=8, num_stages=4, tma=True),
    "64x128x64_w4_s4_tma": mm.TileConfig(64, 128, 64, num_warps=4, num_stages=4, tma=True),
}
DTYPE = torch.bfloat16
L2_SPILL_BYTES = 150 << 20  # weight copies cycled per graph: well past the H200's 60 MB L2
GRAPH_OUT_BYTES = 2 << 30  # cap on outputs a graph keeps alive


def time_us(call: Callable[[int], object], copies: int, out_bytes: int, reps: int = 15) -> float:
    """Median microseconds per call of `call(i)` (i picks the weight copy), replayed as a CUDA graph."""
    inner = max(1, min(max(copies, 20), GRAPH_OUT_BYTES // max(out_bytes, 1)))
    call(0)  # compile outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(inner):
            call(i % copies)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(inner):
            call(i % copies)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / inner)
    del graph
    torch.cuda.empty_cache()
    return sorted(times)[len(times) // 2]


def weights(n: int, k: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(n, k, device="cuda", generator=gen) * k**-0.5).to(DTYPE)
    copies = max(1, min(64, math.ceil(L2_SPILL_BYTES / (w.numel() * w.element_size()))))
    return [w] + [w.clone() for _ in range(copies - 1)]


def activations(m: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(m, k, device="cuda", generator=gen).to(DTYPE)


def measure(x: torch.Tensor, ws: list[torch.Tensor], config: mm.TileConfig | None) -> float:
    """Microseconds per call of ours: the shipped tiling (config None) or an explicit one."""
    n = ws[0].shape[0]
    out_bytes = x.shape[0] * n * x.element_size()
    if config is None:
        return time_us(lambda i: mm.linear_batch_invariant(x, ws[i]), len(ws), out_bytes)
    return time_us(lambda i: mm.linear_with_config(x, ws[i], None, config), len(ws), out_bytes)


def cublas_us(x: torch.Tensor, ws: list[torch.Tensor]) -> float:
    return time_us(lambda i: F.linear(x, ws[i]), len(ws), x.shape[0] * ws[0].shape[0] * x.element_size())


def row(model: str, proj: str, n: int, k: int, m: int, ours: float, cublas: float) -> dict[str, Any]:
    flop = 2 * m * n * k
    nbytes = (m * k + n * k + m * n) * 2
    return {
        "model": model,
        "proj": proj,
        "N": n,
        "K": k,
        "M": m,
        "ours_us": ours,
        "cublas_us": cublas,
        "ratio": ours / cublas,
        "ours_tflops": flop / ours / 1e6,
        "cublas_tflops": flop / cublas / 1e6,
        "ours_GBs": nbytes / ours / 1e3,
        "cublas_GBs": nbytes / cublas / 1e3,
    }


def main_table(models: list[str]) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    rows: list[dict[str, Any]] = []
    print(
        f"{'model':>5} {'proj':>8} {'N':>6} {'K':>5} {'M':>5} {'ours us':>9} {'cuBLAS us':>9} {'ratio':>6} "
        f"{'ours TF/s':>9} {'cuBLAS TF/s':>11} {'ours GB/s':>9}"
    )
    for model in models:
        for proj, (n, k) in MODELS[model][1].items():
            ws = weights(n, k, seed=n + k)
            for m in MS:
                x = activations(m, k, seed=m)
                r = row(model, proj, n, k, m, measure(x, ws, None), cublas_us(x, ws))
                rows.append(r)
                print(
                    f"{model:>5} {proj:>8} {n:>6} {k:>5} {m:>5} {r['ours_us']:>9.1f} {r['cublas_us']:>9.1f} "
                    f"{r['ratio']:>6.2f} {r['ours_tflops']:>9.1f} {r['cublas_tflops']:>11.1f} {r['ours_GBs']:>9.0f}"
                )
            del ws
            torch.cuda.empty_cache()
    forward: dict[str, dict[str, float]] = {}
    print("\nforward-weighted (per layer x layers + lm_head once): ours / cuBLAS")
    for model in models:
        layers = MODELS[model][0]
        for m in MS:
            sel = [r for r in rows if r["model"] == model and r["M"] == m]
            weight = {r["proj"]: (1 if r["proj"] == "lm_head" else layers) for r in sel}
            ours = sum(weight[r["proj"]] * float(r["ours_us"]) for r in sel)
            cub = sum(weight[r["proj"]] * float(r["cublas_us"]) for r in sel)
            body = [r for r in sel if r["proj"] != "lm_head"]
            ours_l = sum(float(r["ours_us"]) for r in body)
            cub_l = sum(float(r["cublas_us"]) for r in body)
            forward[f"{model}_M{m}"] = {
                "ours_us": ours,
                "cublas_us": cub,
                "ratio": ours / cub,
                "layers_only_ratio": ours_l / cub_l,
            }
            print(
                f"  {model:>5} M={m:>5}: {ours / 1e3:8.2f} ms vs {cub / 1e3:8.2f} ms  ratio {ours / cub:5.3f}"
                f"  (layers only {ours_l / cub_l:5.3f})"
            )
    return rows, forward


def invariant(x: torch.Tensor, w: torch.Tensor, config: mm.TileConfig) -> bool:
    full = mm.linear_with_config(x, w, None, config)
    return all(
        torch.equal(mm.linear_with_config(x[s : s + r], w, None, config), full[s : s + r])
        for s, r in [(0, 1), (129, 1), (300, 7), (1000, 64)]
    )


def compile_candidates() -> tuple[dict[str, mm.TileConfig], list[dict[str, Any]]]:
    """Compile every candidate once (all engine shapes share one specialisation); drop failures."""
    x = activations(1, 1024, seed=0)
    w = weights(256, 1024, seed=0)[0]
    ok: dict[str, mm.TileConfig] = {}
    failed: list[dict[str, Any]] = []
    for name, cfg in CANDIDATES.items():
        t0 = time.monotonic()
        try:
            mm.linear_with_config(x, w, None, cfg)
            torch.cuda.synchronize()
        except Exception as exc:  # a tiling that does not fit (shared memory, registers): record it
            failed.append({"config": name, **asdict(cfg), "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            print(f"  {name:<26} failed to compile or run: {failed[-1]['error']}")
            continue
        ok[name] = cfg
        print(f"  {name:<26} compiled in {time.monotonic() - t0:.1f} s")
    return ok, failed


def sweep(
    models: list[str], rows: list[dict[str, Any]], budget_s: float, extra_ms: tuple[int, ...] = ()
) -> list[dict[str, Any]]:
    """Time the candidates per shape at SWEEP_MS (pick_tilings then chooses from the records) and
    at `extra_ms`, which are recorded and printed but not scored (e.g. prefill chunk sizes)."""
    sweep_ms = tuple(sorted(set(SWEEP_MS) | set(extra_ms)))
    deadline = time.monotonic() + budget_s
    print(
        f"\nsweep (budget {budget_s:.0f} s): geometric-mean ours/cuBLAS over M in {SWEEP_MS}; timed at {sweep_ms}"
    )
    candidates, results = compile_candidates()
    shapes = [(model, proj, nk) for model in models for proj, nk in MODELS[model][1].items()]
    for idx, (model, proj, (n, k)) in enumerate(shapes):
        # Split what is left evenly over the shapes still to do, so a slow shape cannot starve the rest.
        shape_deadline = time.monotonic() + (deadline - time.monotonic()) / (len(shapes) - idx)
        ws = weights(n, k, seed=n + k)
        xs = {m: activations(m, k, seed=m) for m in sweep_ms}
        x_inv = activations(4096, k, seed=7)
        cub = {
            int(r["M"]): float(r["cublas_us"])
            for r in rows
            if r["N"] == n and r["K"] == k and r["M"] in sweep_ms
        }
        shipped = mm.tile_config(n, k, DTYPE)
        for name, cfg in candidates.items():
            if time.monotonic() > shape_deadline:
                print(f"  {model} {proj:>8}: shape budget spent; skipped {name} and later candidates")
                break
            rec: dict[str, Any] = {
                "model": model,
                "proj": proj,
                "N": n,
                "K": k,
                "config": name,
                "shipped": cfg == shipped,
                **asdict(cfg),
            }
            try:
                rec["invariant"] = invariant(x_inv, ws[0], cfg)
                us = {m: measure(xs[m], ws, cfg) for m in sweep_ms}
            except Exception as exc:  # e.g. out of memory at this shape: record it, keep sweeping
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                results.append(rec)
                print(f"  {model} {proj:>8} {name:<26} failed: {rec['error']}")
                continue
            score = weighted_score(us, cub)
            rec.update({"us": us, "score": score})
            results.append(rec)
            print(
                f"  {model} {proj:>8} {name:<26} {'*' if rec['shipped'] else ' '} score {score:5.3f}  "
                + " ".join(f"M{m}:{us[m] / cub[m]:.2f}" for m in sweep_ms if m in cub)
                + ("" if rec["invariant"] else "  NOT INVARIANT")
            )
        del ws, xs, x_inv
        torch.cuda.empty_cache()
    return results


def weighted_score(us: dict[int, float], cublas_us: dict[int, float]) -> float:
    """exp(sum_M w_M log(ours_M / cuBLAS_M)): 1.0 means cuBLAS's speed where the time goes."""
    return math.exp(sum(w * math.log(us[m] / cublas_us[m]) for m, w in SWEEP_WEIGHTS.items()))


# Which sweep point's winner serves which batch sizes: M <= 16 the M=1 winner, <= 128 the M=64
# one, <= 1024 the M=256 one, larger M the M=4096 one. Any split is invariant; only speed moves.
BUCKETS = ((16, 1), (128, 64), (1024, 256))
REST_M = 4096


def _family(rec: dict[str, Any], buckets: bool) -> tuple[Any, ...]:
    """Records whose tilings are interchangeable (mm.check_interchangeable) share a family;
    without buckets every tiling is a family of its own (one tiling for every M)."""
    if not buckets:
        return (rec["config"],)
    if rec["split_k"] == 1 and rec["K"] % 128 == 0:
        return (1,)
    return (rec["split_k"], rec["block_k"])


def _us(rec: dict[str, Any], m: int) -> float:
    return float(rec["us"][str(m)] if str(m) in rec["us"] else rec["us"][m])


def _config(rec: dict[str, Any]) -> mm.TileConfig:
    return mm.TileConfig(**{f: rec[f] for f in mm.TileConfig.__dataclass_fields__})


def _ranged(
    nk: tuple[int, int],
    rest: dict[str, Any],
    winners: dict[int, dict[str, Any]],
    buckets: tuple[tuple[int, int], ...],
    cub: dict[int, float],
) -> tuple[float, mm.Tiling, list[str]]:
    """A Tiling with winners[m] for each (max_m, m) range and `rest` beyond, its score and names."""
    by_m = [(max_m, _config(winners[m])) for max_m, m in buckets]
    while by_m and by_m[-1][1] == _config(rest):  # ranges that use the rest's tiling anyway
        by_m.pop()
    tiling = mm.Tiling(_config(rest), tuple(by_m))
    mm.check_interchangeable(nk[1], DTYPE, tiling.configs)
    us = {m: _us(winners[m], m) for _, m in buckets} | {REST_M: _us(rest, REST_M)}  # every SWEEP_MS point
    names = [f"M<={max_m}:{winners[m]['config']}" for max_m, m in buckets] + [f"rest:{rest['config']}"]
    return weighted_score(us, cub), tiling, names


def pick_tilings(
    records: list[dict[str, Any]],
    cub: dict[tuple[int, int], dict[int, float]],
    buckets: bool = True,
    decode_ranges_only: bool = False,
) -> dict[tuple[int, int], tuple[float, mm.Tiling, list[str]]]:
    """Per (N, K): the family of interchangeable tilings whose per-M winners give the best
    weighted score, as a Tiling with one winner per range of M, the score and the names.

    buckets=False: one tiling for every M (the best weighted score of a single tiling).
    decode_ranges_only: that single tiling for M > 256 (prefill keeps it), and its family's
    winners at M = 1, 64, 256 for M <= 16, 128, 256.
    """
    by_shape: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for rec in records:
        if rec.get("invariant") and "us" in rec:
            by_shape.setdefault((rec["N"], rec["K"]), []).append(rec)
    chosen: dict[tuple[int, int], tuple[float, mm.Tiling, list[str]]] = {}
    for nk, recs in by_shape.items():
        if decode_ranges_only:
            single = min(recs, key=lambda r: weighted_score({m: _us(r, m) for m in SWEEP_MS}, cub[nk]))
            family = [r for r in recs if _family(r, True) == _family(single, True)]
            winners = {m: min(family, key=lambda r, m=m: _us(r, m)) for m in (1, 64, 256)}
            chosen[nk] = _ranged(nk, single, winners, ((16, 1), (128, 64), (256, 256)), cub[nk])
            continue
        families: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for rec in recs:
            families.setdefault(_family(rec, buckets), []).append(rec)
        for fam in families.values():
            winners = {m: min(fam, key=lambda r, m=m: _us(r, m)) for m in SWEEP_MS}
            pick = _ranged(nk, winners[REST_M], winners, BUCKETS, cub[nk])
            if nk not in chosen or pick[0] < chosen[nk][0]:
                chosen[nk] = pick
    return chosen


def repick(
    sweep_path: Path,
    cublas_rows: list[dict[str, Any]],
    buckets: bool = True,
    decode_ranges_only: bool = False,
) -> dict[tuple[int, int], mm.Tiling]:
    """The best tilings per (N, K) of a saved sweep under the current weights and buckets."""
    cub: dict[tuple[int, int], dict[int, float]] = {}
    for r in cublas_rows:
        cub.setdefault((r["N"], r["K"]), {})[int(r["M"])] = float(r["cublas_us"])
    chosen = pick_tilings(json.loads(sweep_path.read_text())["results"], cub, buckets, decode_ranges_only)
    for (n, k), (score, _, names) in sorted(chosen.items()):
        print(f"  N={n:>6} K={k:>5}: score {score:.3f}  " + "  ".join(names))
    return {nk: t for nk, (_, t, _) in chosen.items()}


def refine(
    models: list[str], m: int, min_gain: float = 0.02
) -> tuple[list[dict[str, Any]], dict[tuple[int, int], mm.Tiling]]:
    """Per shape of `models`: time at M = m every candidate interchangeable with the shipped
    tilings (mm.check_interchangeable), beside the tiling that serves m now; where the fastest
    beats it by more than `min_gain`, a Tiling whose ranges gain one ending at m with it.

    Only M = m is timed: a new range takes sizes from the range that held them, so the other
    sizes keep their tilings and their times."""
    candidates, _ = compile_candidates()
    records: list[dict[str, Any]] = []
    chosen: dict[tuple[int, int], mm.Tiling] = {}
    print(f"\nrefine at M={m}: the tiling serving M={m} now against the fastest interchangeable one (us)")
    for model in models:
        for proj, (n, k) in MODELS[model][1].items():
            shipped = mm.tiling(n, k, DTYPE, torch.cuda.get_device_name())
            now = shipped.for_m(m)
            family = {name: cfg for name, cfg in candidates.items() if _fits(k, [*shipped.configs, cfg])}
            family.setdefault("shipped", now)
            ws = weights(n, k, seed=n + k)
            x = activations(m, k, seed=m)
            x_inv = activations(4096, k, seed=7)
            cub = cublas_us(x, ws)
            times: dict[str, float] = {}
            for name, cfg in family.items():
                if name != "shipped" and cfg == now:
                    continue
                if not invariant(x_inv, ws[0], cfg):
                    print(f"  {model} {proj:>8} {name:<26} NOT INVARIANT: skipped")
                    continue
                times[name] = measure(x, ws, cfg)
            best = min(times, key=lambda name: times[name])
            gain = 1.0 - times[best] / times["shipped"]
            records.append(
                {
                    "model": model,
                    "proj": proj,
                    "N": n,
                    "K": k,
                    "M": m,
                    "cublas_us": cub,
                    "shipped": asdict(now),
                    "us": times,
                    "best": best,
                    "gain": gain,
                }
            )
            print(
                f"  {model} {proj:>8} N={n:>6} K={k:>5}: now {times['shipped']:7.1f} us, best {best} "
                f"{times[best]:7.1f} us ({gain:+.1%}), cuBLAS {cub:7.1f} us"
            )
            if gain > min_gain:
                chosen[(n, k)] = with_range(shipped, m, family[best])
            del ws
            torch.cuda.empty_cache()
    return records, chosen


def with_range(tiling: mm.Tiling, m: int, config: mm.TileConfig) -> mm.Tiling:
    """`tiling` with `config` serving the sizes from the range below m up to m (a range ending at m
    is replaced); a range whose tiling the next range also uses is folded into that one."""
    ranges = sorted(
        [*((max_m, c) for max_m, c in tiling.by_m if max_m != m), (m, config)], key=lambda r: r[0]
    )
    kept = [
        r for r, after in zip(ranges, [*ranges[1:], None], strict=True) if after is None or after[1] != r[1]
    ]
    if kept and kept[-1][1] == tiling.rest:
        kept.pop()
    return mm.Tiling(tiling.rest, tuple(kept))


def _fits(k: int, configs: list[mm.TileConfig]) -> bool:
    try:
        mm.check_interchangeable(k, DTYPE, configs)
    except ValueError:
        return False
    return True


def write(out: Path, name: str, record: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    path.write_text(json.dumps(record, indent=2, default=str))
    print(f"wrote {path}")


def how_picked(one_tiling: bool, decode_ranges_only: bool) -> str:
    """The config file's account of how this run picked its tilings."""
    if one_tiling:
        ranges = "one tiling per shape for every M"
    elif decode_ranges_only:
        ranges = (
            "one tiling per shape for M > 256 (prefill chunks), and the fastest of its family (same split_k) "
            "at M = 1, 64, 256 for M <= 16, 128, 256 (decode batches)"
        )
    else:
        ranges = (
            f"per family of interchangeable tilings (same split_k), the fastest at M = "
            f"{[m for _, m in BUCKETS] + [REST_M]} serves M <= {[b for b, _ in BUCKETS]} and beyond"
        )
    return (
        f"bench/kernels/bench_matmul.py sweep: {ranges}; ranked by the geometric mean of time over cuBLAS "
        f"weighted by M {SWEEP_WEIGHTS}; tilings of one family give bitwise identical rows "
        "(bench/kernels/matmul_equivalence.py); shapes not in this run keep their earlier entries"
    )


def write_configs(
    chosen: dict[tuple[int, int], mm.Tiling], out: Path | None, meta: dict[str, Any], gpu_name: str, how: str
) -> None:
    """Merge the winners into the GPU's config file (entries for other shapes are kept)."""
    path = mm.config_path(gpu_name)
    dtype_name = str(DTYPE).removeprefix("torch.")
    header = {"gpu": meta["gpu"], "triton": meta["triton"], "date": meta["date"], "how": how}
    text = tuning.write_measured(
        path,
        ({"n": n, "k": k, "dtype": dtype_name, **tuning.entry_fields(t)} for (n, k), t in chosen.items()),
        lambda e: (e["n"], e["k"], e["dtype"]),
        header,
    )
    if out is not None:  # a copy beside the run's results, to fetch from a GPU machine
        (out / path.name).write_text(text)
    print(f"wrote {path} ({len(json.loads(text)['entries'])} shapes)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="directory for the JSON results")
    ap.add_argument(
        "--sweep-budget-s", type=float, default=240.0, help="seconds for the tiling sweep; 0 skips it"
    )
    ap.add_argument("--models", default="0.6b,8b", help="comma-separated subset of " + ",".join(MODELS))
    ap.add_argument(
        "--write-configs",
        action="store_true",
        help="write the sweep's winners to shardinfer/kernels/matmul_configs/<gpu>.json (and --out)",
    )
    ap.add_argument(
        "--extra-ms",
        type=int,
        nargs="*",
        default=[],
        help="also time the sweep at these M (recorded, not scored; e.g. 1024 8192 for prefill chunks)",
    )
    choice = ap.add_mutually_exclusive_group()  # how tilings are picked: at most one of these
    choice.add_argument(
        "--one-tiling",
        action="store_true",
        help="one tiling per shape for every M instead of one per range of M (on the Qwen3 shapes "
        "the per-range tilings measured slower end to end: bench/kernels/NOTES.md)",
    )
    choice.add_argument(
        "--decode-ranges-only",
        action="store_true",
        help="keep the best single tiling for M > 256 (prefill) and use its family's winners "
        "only for M <= 16, 128, 256 (decode batches)",
    )
    ap.add_argument(
        "--from-sweep",
        default=None,
        help="re-pick winners from this saved sweep JSON (and the kernels-matmul JSON of the same "
        "run beside it, for cuBLAS times) instead of timing anything",
    )
    ap.add_argument(
        "--refine-m",
        type=int,
        default=None,
        help="only add a range of M ending here to the shipped tilings (see the module docstring)",
    )
    args = ap.parse_args()
    if args.refine_m is not None:
        models = [m for m in args.models.split(",") if m]
        if unknown := [m for m in models if m not in MODELS]:
            ap.error(f"--models: unknown {unknown}; choose from {list(MODELS)}")
        if args.refine_m < 1:
            ap.error(f"--refine-m {args.refine_m}: give a batch size of at least 1")
        if not torch.cuda.is_available():
            ap.error("needs a CUDA device")
        meta = {
            "gpu": torch.cuda.get_device_name(),
            "commit": bench_commit(),
            "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        records, chosen = refine(models, args.refine_m)
        write(
            Path(args.out),
            "kernels-matmul-refine",
            {"workload": "kernels-matmul-refine", **meta, "records": records},
        )
        if args.write_configs and chosen:
            how = json.loads(mm.config_path(meta["gpu"]).read_text())["how"]
            added = f"; a range ending at M = {args.refine_m} added by --refine-m where it gained"
            write_configs(chosen, Path(args.out), meta, meta["gpu"], how if added in how else how + added)
        return
    if args.from_sweep:
        sweep_path = Path(args.from_sweep)
        if not sweep_path.is_file():
            ap.error(
                f"--from-sweep {sweep_path}: no such file; pass a kernels-matmul-sweep-*.json from a sweep run"
            )
        table = sorted(sweep_path.parent.glob("kernels-matmul-2*.json"))
        same_run = [p for p in table if p.name < sweep_path.name.replace("-sweep", "")] or table
        if not same_run:
            ap.error(f"--from-sweep: no kernels-matmul-*.json with cuBLAS times beside {sweep_path}")
        rows = json.loads(same_run[-1].read_text())["rows"]
        print(f"re-picking from {sweep_path.name} with cuBLAS times of {same_run[-1].name}")
        chosen = repick(sweep_path, rows, not args.one_tiling, args.decode_ranges_only)
        if args.write_configs:
            meta = json.loads(sweep_path.read_text())
            write_configs(
                chosen, None, meta, meta["gpu"], how_picked(args.one_tiling, args.decode_ranges_only)
            )
        return
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"--models: unknown {unknown}; choose from {list(MODELS)}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    commit = bench_commit()
    print(f"GPU {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "commit": commit,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "batch_invariant": True,
        "dtype": str(DTYPE),
    }
    rows, forward = main_table(models)
    shipped = {
        f"{n}x{k}": asdict(mm.tile_config(n, k, DTYPE)) for mod in models for n, k in MODELS[mod][1].values()
    }
    write(
        Path(args.out),
        "kernels-matmul",
        {
            "workload": "kernels-matmul",
            **meta,
            "rows": rows,
            "forward_weighted": forward,
            "shipped_configs": shipped,
        },
    )
    if args.sweep_budget_s > 0:
        results = sweep(models, rows, args.sweep_budget_s, tuple(args.extra_ms))
        write(
            Path(args.out),
            "kernels-matmul-sweep",
            {"workload": "kernels-matmul-sweep", **meta, "results": results},
        )
        print("\nfastest interchangeable tilings per shape, by M:")
        chosen = repick(
            sorted(Path(args.out).glob("kernels-matmul-sweep-*.json"))[-1],
            rows,
            not args.one_tiling,
            args.decode_ranges_only,
        )
        if args.write_configs and chosen:
            write_configs(
                chosen,
                Path(args.out),
                meta,
                torch.cuda.get_device_name(),
                how_picked(args.one_tiling, args.decode_ranges_only),
            )


if __name__ == "__main__":
    main()
