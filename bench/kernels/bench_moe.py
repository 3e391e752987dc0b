"""Fused MoE on one GPU at the moe-16b expert shapes, against its floors, with a tile sweep.

Shapes: hidden 2048, moe_intermediate 1408, 64 routed experts, top-6, bf16, routed by the
routing kernel (sigmoid + correction bias, scale 2.446) from random router logits.

* Prefill sizes (T = 1024, 2048, 4096, 8192 tokens) are compute-bound: FLOPs = 2 * T * k * 3HI
  (gate, up and down GEMMs), reported in TFLOP/s and as a fraction of the bf16 matmul rate
  measured in the same run (torch 8192^3).
* Decode sizes (T = 64, 256) are bound by reading the weights of every expert some token chose
  (3HI * 2 bytes each): reported in GB/s and as a fraction of the measured device-to-device
  copy bandwidth (bytes read + written, the convention of the other kernel benchmarks).
* Each size's floor is the slower of the two (FLOPs at the matmul rate, touched weights at copy
  bandwidth); "of floor" is that time over the measured one. Below about 2k tokens the weight
  reads are the larger: 1024 tokens touch nearly every expert for a sixth of the FLOPs of 8192.
* Prefill sizes also time cuBLAS on the same expert GEMMs with the tokens spread evenly (T*k/E
  rows per expert, no routing, no padding, no combine: two torch.bmm), an anchor for what the
  hardware gives these shapes.

Every time is the median of CUDA-event timings after warm-up, each size eager (one call between
two events, the host launching its kernels inside the timing), as 20 eager calls in a row (per
call: the host's launches overlap the GPU's work, as in a model's forward) and as a CUDA-graph
replay: the kernels' device time, which is what a step sees when the host runs ahead of the
GPU (graphed decode steps, and prefill steps, whose host work is shorter than their kernels).
The host's own launch time per call is recorded beside them. The fractions are of the graph
time. Each tiling is checked first: close to a float32 reference, and a token computed alone
bitwise equal to the same token in the batch.

    python bench/kernels/bench_moe.py [--out DIR] [--sweep]    (DIR defaults to $OUT, else .)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import ceilings, graph_ms, median_ms
from bench.workloads import bench_commit
from shardinfer.kernels import moe, moe_routing, reference_moe
from shardinfer.kernels.moe import MoeTiles

BF16 = torch.bfloat16
HIDDEN, INTER, EXPERTS, TOP_K, SCALE = 2048, 1408, 64, 6, 2.446
PREFILL = (512, 1024, 2048, 4096, 8192)
DECODE = (64, 256)
# The shipped choice first (None: moe_tiles picks by batch size, as the engine runs it); --sweep
# adds fixed tilings (each checked for the default tiling's bits, which a per-size choice needs).
TILINGS: list[MoeTiles | None] = [None]
SWEEP = [
    moe.DEFAULT_TILES,
    moe.HOPPER_SMALL_TILES,
    moe.HOPPER_LARGE_TILES,
    # The pointer tilings shipped before the expert-sorted layout (NOTES.md, 2026-11-30 06:17).
    MoeTiles(128, 128, 64, 8, 3, group_m=8),
    # Around the Hopper tilings (NOTES.md, "The expert-sorted layout"): stages, the down GEMM's
    # width, TMA per operand.
    MoeTiles(128, 128, 64, 8, 3, tma=True, group_m=8, tma_rows=True, down_block_n=256),
    MoeTiles(128, 128, 64, 8, 4, tma=True, group_m=8, tma_rows=True),
    MoeTiles(128, 128, 64, 8, 4, group_m=8, tma_rows=True, down_block_n=256),
    MoeTiles(128, 128, 64, 8, 4, tma=True, group_m=8, down_block_n=256),
    MoeTiles(64, 64, 64, 4, 3, tma=True, group_m=8, tma_rows=True, down_block_n=128, down_num_stages=4),
    MoeTiles(64, 128, 64, 4, 4, tma=True, group_m=8, tma_rows=True, down_block_n=128),
]


class Problem:
    """Weights shared by every size; per-size tokens routed by the routing kernel."""

    def __init__(self) -> None:
        gen = torch.Generator(device="cuda").manual_seed(9)
        self.gen = gen
        self.wgu = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, device="cuda", generator=gen) * HIDDEN**-0.5).to(
            BF16
        )
        self.wd = (torch.randn(EXPERTS, HIDDEN, INTER, device="cuda", generator=gen) * INTER**-0.5).to(BF16)
        self.bias = torch.randn(EXPERTS, device="cuda", generator=gen) * 0.1

    def tokens(self, t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.randn(t, HIDDEN, device="cuda", generator=self.gen).to(BF16)
        logits = torch.randn(t, EXPERTS, device="cuda", generator=self.gen)
        w, ids = moe_routing.grouped_topk(logits, self.bias, TOP_K, 1, 1, True, SCALE)
        return x, ids, w, logits


def _tiles_row(tiles: MoeTiles | None) -> dict[str, Any] | str:
    return asdict(tiles) if tiles is not None else "shipped (by batch size)"


def check(p: Problem, tiles: MoeTiles | None) -> dict[str, Any]:
    """Accuracy against the float32 reference, bitwise batch invariance for one tiling, and whether
    it computes the default tiling's bits (then the two may serve different batch sizes)."""
    # 1000 tokens: ~94 rows per expert, so the shipped choice runs the large tiles on the batch and
    # the small ones on each token alone.
    x, ids, w, _ = p.tokens(1000)
    out = moe.fused_moe(x, ids, w, p.wgu, p.wd, tiles=tiles)
    ref = reference_moe.moe_experts(x.float(), ids, w, p.wgu.float(), p.wd.float())
    rel = float((out.double() - ref.double()).norm() / ref.double().norm())
    invariant = all(
        torch.equal(
            moe.fused_moe(x[i : i + 1], ids[i : i + 1], w[i : i + 1], p.wgu, p.wd, tiles=tiles),
            out[i : i + 1],
        )
        for i in (0, 497, 999)
    )
    same_bits = torch.equal(out, moe.fused_moe(x, ids, w, p.wgu, p.wd, tiles=moe.DEFAULT_TILES))
    return {"rel_err_vs_fp32": rel, "token_alone_bitwise": invariant, "bits_equal_default": same_bits}


def measure(p: Problem, tiles: MoeTiles | None, t: int, bw: float, flops: float) -> dict[str, Any]:
    x, ids, w, logits = p.tokens(t)

    def run() -> torch.Tensor:
        return moe.fused_moe(x, ids, w, p.wgu, p.wd, tiles=tiles)

    ms = median_ms(run)
    touched = int(torch.unique(ids).numel())
    weight_bytes = touched * 3 * HIDDEN * INTER * 2
    fl = 2 * t * TOP_K * 3 * HIDDEN * INTER
    # The floor: the slower of doing the FLOPs at the matmul rate and reading the touched experts'
    # weights at copy bandwidth (below ~2k tokens the weights dominate).
    floor_ms = max(fl / flops, weight_bytes / bw) * 1e3
    row: dict[str, Any] = {
        "tiles": _tiles_row(tiles),
        "tokens": t,
        "ms": ms,
        "experts_touched": touched,
        "TFLOPs": fl / (ms * 1e-3) / 1e12,
        "of_matmul_rate": fl / (ms * 1e-3) / flops,
        "weight_GBs": weight_bytes / (ms * 1e-3) / 1e9,
        "weight_of_copy_bw": weight_bytes / (ms * 1e-3) / bw,
        "floor_ms": floor_ms,
        "of_floor": floor_ms / ms,
    }
    gms = graph_ms(run)
    row.update(_host_and_back_to_back(run))
    row.update(
        graph_ms=gms,
        graph_TFLOPs=fl / (gms * 1e-3) / 1e12,
        graph_of_matmul_rate=fl / (gms * 1e-3) / flops,
        graph_weight_GBs=weight_bytes / (gms * 1e-3) / 1e9,
        graph_weight_of_copy_bw=weight_bytes / (gms * 1e-3) / bw,
        graph_of_floor=floor_ms / gms,
    )
    if t in DECODE:
        row["routing_graph_ms"] = graph_ms(
            lambda: moe_routing.grouped_topk(logits, p.bias, TOP_K, 1, 1, True, SCALE)
        )
    else:
        row["routing_ms"] = median_ms(
            lambda: moe_routing.grouped_topk(logits, p.bias, TOP_K, 1, 1, True, SCALE)
        )
        if tiles is None:
            row.update(_cublas_anchor(p, t, flops))
    cfg = tiles or moe.moe_tiles(HIDDEN, INTER, BF16, t * TOP_K / EXPERTS, x.device)
    row["align_graph_ms"] = graph_ms(lambda: moe.align_to_experts(ids, EXPERTS, cfg.block_m))
    return row


def _host_and_back_to_back(fn: Callable[[], Any], calls: int = 20) -> dict[str, float]:
    """The host's time to launch one call (checks, descriptors, launches; nothing waits on the
    GPU), and the time per call of `calls` eager calls in a row: max(host, device) when the host
    runs ahead, as in a prefill step."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host_ms = (time.perf_counter() - start) / calls * 1e3
    torch.cuda.synchronize()
    return {
        "host_launch_ms": host_ms,
        "back_to_back_ms": median_ms(lambda: [fn() for _ in range(calls)]) / calls,
    }


def _cublas_anchor(p: Problem, t: int, flops: float) -> dict[str, Any]:
    """cuBLAS on the same expert GEMMs with T*k/E rows per expert: no routing, padding or combine."""
    rows = t * TOP_K // EXPERTS
    x = torch.randn(EXPERTS, rows, HIDDEN, device="cuda", dtype=BF16)
    act = torch.randn(EXPERTS, rows, INTER, device="cuda", dtype=BF16)
    wgu_t, wd_t = p.wgu.transpose(1, 2), p.wd.transpose(1, 2)
    ms = graph_ms(lambda: (torch.bmm(x, wgu_t), torch.bmm(act, wd_t)))
    fl = 2 * EXPERTS * rows * 3 * HIDDEN * INTER
    return {"cublas_even_bmm_graph_ms": ms, "cublas_even_bmm_of_matmul_rate": fl / (ms * 1e-3) / flops}


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| tiles (m, n, k, warps, stages) | T | eager ms | in a row ms (host) | graph ms | TFLOP/s (of matmul) | weights GB/s "
        "(of copy bw) | of floor | cuBLAS even bmm (of matmul) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['tiles']} | {r.get('tokens', '')} | error: {r['error'][:60]} | | | | | | |")
            continue
        c = r["tiles"]
        tiles = (
            c
            if isinstance(c, str)
            else (
                f"{c['block_m']}, {c['block_n']}, {c['block_k']}, {c['num_warps']}, {c['num_stages']}"
                f"{', tma' if c['tma'] else ''}{', rows' if c['tma_rows'] else ''}"
                f"{', g' + str(c['group_m']) if c['group_m'] else ''}"
                f"{', down ' + str(c['down_block_n']) if c['down_block_n'] else ''}"
                f"{' s' + str(c['down_num_stages']) if c['down_num_stages'] else ''}"
            )
        )
        anchor = (
            f"{r['cublas_even_bmm_graph_ms']:.3f} ({100 * r['cublas_even_bmm_of_matmul_rate']:.0f}%)"
            if "cublas_even_bmm_graph_ms" in r
            else ""
        )
        lines.append(
            f"| {tiles} | {r['tokens']} | {r['ms']:.3f} | {r['back_to_back_ms']:.3f} "
            f"({r['host_launch_ms']:.3f}) | {r['graph_ms']:.3f} | {r['graph_TFLOPs']:.0f} "
            f"({100 * r['graph_of_matmul_rate']:.0f}%) | {r['graph_weight_GBs']:.0f} "
            f"({100 * r['graph_weight_of_copy_bw']:.0f}%) | {100 * r['graph_of_floor']:.0f}% | {anchor} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for moe-<date>.json")
    ap.add_argument("--sweep", action="store_true", help="also time the other tilings of SWEEP")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit = bench_commit()
    bw, flops = ceilings()
    print(
        f"GPU {torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s (read + write), "
        f"bf16 matmul {flops / 1e12:.0f} TFLOP/s",
        flush=True,
    )
    record: dict[str, Any] = {
        "workload": "kernel-moe",
        "gpu": torch.cuda.get_device_name(),
        "commit": commit,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "batch_invariant": True,
        "torch": torch.__version__,
        "copy_bandwidth_Bps": bw,
        "bf16_matmul_flops": flops,
        "shape": {"hidden": HIDDEN, "intermediate": INTER, "experts": EXPERTS, "top_k": TOP_K},
        "checks": [],
        "rows": [],
    }
    path = out / f"moe-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    p = Problem()
    for tiles in TILINGS + (SWEEP if args.sweep else []):
        try:
            record["checks"].append({"tiles": _tiles_row(tiles), **check(p, tiles)})
            print(json.dumps(record["checks"][-1]), flush=True)
            for t in DECODE + PREFILL:
                record["rows"].append(measure(p, tiles, t, bw, flops))
                print(json.dumps(record["rows"][-1]), flush=True)
        except Exception as exc:  # a tiling that does not compile or fit must not stop the sweep
            record["rows"].append(
                {"tiles": _tiles_row(tiles), "error": f"{type(exc).__name__}: {exc}"[:1500]}
            )
            print(record["rows"][-1]["error"], flush=True)
        path.write_text(json.dumps(record, indent=2))
    print()
    print(table(record["rows"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
