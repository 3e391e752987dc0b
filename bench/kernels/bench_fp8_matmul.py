"""FP8 linear (kernels/fp8_matmul.py) against the bf16 batch-invariant linear and torch._scaled_mm.

For each projection shape of the chosen models and each M, times (median CUDA-graph replay over
enough weight copies to spill L2, as a forward reads each layer's weight cold):
  - ours_fp8: activation quantisation + the FP8 GEMM (what Linear runs with FP8 weights),
  - bf16: the batch-invariant bf16 matmul (kernels/matmul.py),
  - scaled_mm: torch._scaled_mm with per-tensor scales (cuBLAS FP8; no block scales, not batch
    invariant: a ceiling, not an alternative),
and the device's FP8 ceiling (8192^3 _scaled_mm). Then, for candidate tilings, checks whether they
give rows bitwise equal to the default tiling's (whether a problem could switch tiling by M and
stay batch invariant) and times them. --ws times the two kernels fp8_matmul chooses between by M
(the TMA kernel and the warp-specialised one) at every shape, each forced, bits compared.

    python bench/kernels/bench_fp8_matmul.py [--models 8b] [--out DIR] [--ws] [--sweep | --splits | --settings] [--sweep-ms 64,256]

--write-configs instead times every candidate of the default's split_k at the decode sizes
(DECODE_RANGES) and writes, per range, the fastest one whose rows equal the default tiling's bit for
bit, to the GPU model's measured-tilings file (kernels/fp8_matmul_configs/; larger M keeps the
default's tiling, and shapes not in the run keep their earlier entries):

    python bench/kernels/bench_fp8_matmul.py --models 8b,0.6b,moe-16b --write-configs [--tma-only]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import fp8_matmul_rate, graph_ms_per_call
from bench.kernels.bench_matmul import MODELS
from bench.workloads import bench_commit
from shardinfer.kernels import fp8_matmul, matmul, tuning
from shardinfer.kernels.reference_fp8 import quantize_blocks
from shardinfer.kernels.tuning import Tiling

MS = (1, 64, 256, 1024, 8192)
CANDIDATES = [
    fp8_matmul.Fp8TileConfig(64, 64, num_warps=4, num_stages=4),
    fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=4),
    fp8_matmul.Fp8TileConfig(128, 64, num_warps=4, num_stages=4),
    fp8_matmul.Fp8TileConfig(128, 128, num_warps=8, num_stages=3),
    fp8_matmul.Fp8TileConfig(128, 128, num_warps=8, num_stages=4),
    fp8_matmul.Fp8TileConfig(128, 128, num_warps=4, num_stages=4),
    fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=4, persistent=False),
    # One program per tile with two warpgroups: each promotes its 64 rows' partial products on the
    # CUDA cores while the other's wgmma runs (the persistent 128 x 128 runs above lost to their
    # loop, not to the tile).
    fp8_matmul.Fp8TileConfig(128, 128, num_warps=8, num_stages=3, persistent=False),
    fp8_matmul.Fp8TileConfig(128, 128, num_warps=8, num_stages=4, persistent=False),
    fp8_matmul.Fp8TileConfig(128, 64, num_warps=8, num_stages=4, persistent=False),
    fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=3, persistent=False),
    fp8_matmul.Fp8TileConfig(64, 64, num_warps=4, num_stages=5, persistent=False),
    # Operands through the tensor-memory accelerator (same tiles and bits as the pointer loads).
    fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=4, persistent=False, tma=True),
    fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=6, persistent=False, tma=True),
    fp8_matmul.Fp8TileConfig(64, 64, num_warps=4, num_stages=6, persistent=False, tma=True),
    fp8_matmul.Fp8TileConfig(128, 128, num_warps=8, num_stages=4, persistent=False, tma=True),
    fp8_matmul.Fp8TileConfig(128, 128, num_warps=8, num_stages=4, tma=True),
    fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=4, tma=True, programs_per_sm=2),
    # For short K (dense-small's 1024: eight 128-channel steps a tile, so the prologue and the
    # epilogue weigh more): shallower pipelines, and 128-row tiles on one warpgroup.
    fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=3, persistent=False, tma=True),
    fp8_matmul.Fp8TileConfig(128, 128, num_warps=4, num_stages=3, persistent=False, tma=True),
    fp8_matmul.Fp8TileConfig(128, 64, num_warps=4, num_stages=4, persistent=False, tma=True),
]
# Fixed split-K: a decode batch's N = 4096 projections have 128 or fewer 64x128 tiles, one program
# per SM walking all of K; more, shorter K ranges fill the SMs and let larger tiles read each weight
# tile fewer times. Other bits than the unsplit tilings' (the ranges are summed apart), so a
# problem takes one split_k for every M and the sweep compares these within their split.
SPLIT_CANDIDATES = (
    [
        fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=4, persistent=False, tma=True, split_k=s)
        for s in (2, 3, 4)
    ]
    + [
        fp8_matmul.Fp8TileConfig(128, 128, num_warps=8, num_stages=4, persistent=False, tma=True, split_k=s)
        for s in (2, 4)
    ]
    + [fp8_matmul.Fp8TileConfig(64, 64, num_warps=4, num_stages=6, persistent=False, tma=True, split_k=2)]
)
# The down projection's split (fp8_matmul._default: K >= 3N over at most SPLIT_MAX_N columns
# splits K in two, through the workspace up to 256 rows, in one program above) against the unsplit
# tilings it replaced; the two split paths must give equal bits (the sweep compares tilings within
# a split_k).
SETTING_CANDIDATES = [
    fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=4, persistent=False, tma=True),
    fp8_matmul.Fp8TileConfig(64, 64, num_warps=4, num_stages=6, persistent=False, tma=True),
    fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=4, persistent=False, tma=True, split_k=2),
    fp8_matmul.Fp8TileConfig(
        64, 128, num_warps=4, num_stages=4, persistent=False, tma=True, split_k=2, ranges_in_program=True
    ),
    fp8_matmul.Fp8TileConfig(64, 64, num_warps=4, num_stages=6, persistent=False, tma=True, split_k=2),
]
L2_SPILL_BYTES = 256 << 20


def _copies(nbytes: int) -> int:
    return max(2, min(16, -(-L2_SPILL_BYTES // max(nbytes, 1))))


@contextlib.contextmanager
def _warp_specialized(on: bool, persistent: bool = False) -> Iterator[None]:
    """fp8_matmul's warp-specialised kernel forced on (at every M and K it can serve; its
    persistent variant if asked) or off."""
    from shardinfer.kernels import fp8_matmul_ws

    saved = fp8_matmul.WARP_SPECIALIZED, fp8_matmul.WS_MIN_M, fp8_matmul.WS_MIN_K, fp8_matmul_ws.PERSISTENT
    fp8_matmul.WARP_SPECIALIZED, fp8_matmul.WS_MIN_M, fp8_matmul.WS_MIN_K = on, 1, 0
    fp8_matmul_ws.PERSISTENT = persistent
    try:
        yield
    finally:
        fp8_matmul.WARP_SPECIALIZED, fp8_matmul.WS_MIN_M, fp8_matmul.WS_MIN_K, fp8_matmul_ws.PERSISTENT = (
            saved
        )


# Smaller tiles for the warp-specialised kernel's persistent schedule (block_m, block_n, warps: one
# consumer warpgroup per 64 rows): at decode batches of 512-1024 rows its 128 x 128 tiles leave a
# partial last wave (bench/kernels/NOTES.md, "The FP8 GEMM at 512 and 1024 rows"). The same bits.
WS_TILES = ((128, 64, 8), (64, 128, 4), (64, 64, 4))


@contextlib.contextmanager
def _ws_tile(block_m: int, block_n: int, num_warps: int) -> Iterator[None]:
    """fp8_matmul_ws's tile changed for the block."""
    from shardinfer.kernels import fp8_matmul_ws

    saved = fp8_matmul_ws.BLOCK_M, fp8_matmul_ws.BLOCK_N, fp8_matmul_ws.NUM_WARPS
    fp8_matmul_ws.BLOCK_M, fp8_matmul_ws.BLOCK_N, fp8_matmul_ws.NUM_WARPS = block_m, block_n, num_warps
    try:
        yield
    finally:
        fp8_matmul_ws.BLOCK_M, fp8_matmul_ws.BLOCK_N, fp8_matmul_ws.NUM_WARPS = saved


def time_shape(
    n: int, k: int, m: int, configs: list[fp8_matmul.Fp8TileConfig] | None, kernels: bool = False
) -> dict[str, Any]:
    copies = _copies(n * k)
    ws = [quantize_blocks(torch.randn(n, k, device="cuda") * k**-0.5) for _ in range(copies)]
    wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(_copies(2 * n * k))]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    xq = x.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    flop = 2 * m * n * k
    row: dict[str, Any] = {"n": n, "k": k, "m": m}
    row["ours_fp8_us"] = 1e3 * graph_ms_per_call(
        [lambda w=w: fp8_matmul.linear_fp8(x, w[0], w[1]) for w in ws]
    )
    row["bf16_us"] = 1e3 * graph_ms_per_call([lambda w=w: matmul.linear_batch_invariant(x, w) for w in wb])
    row["scaled_mm_us"] = 1e3 * graph_ms_per_call(
        [
            lambda w=w: torch._scaled_mm(xq, w[0].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            for w in ws
        ]
    )
    row["ours_tflops"] = flop / row["ours_fp8_us"] / 1e6
    row["ours_GBps"] = (n * k + m * k * 2 + m * n * 2) / row["ours_fp8_us"] / 1e3
    # The default tiling's TMA kernel against the warp-specialised one, bits compared (a split-K
    # problem has only the first).
    if kernels and fp8_matmul.tile_config(n, k, m).split_k == 1:
        default = fp8_matmul.linear_fp8(x, ws[0][0], ws[0][1])
        forced: list[tuple[str, bool, bool, tuple[int, int, int] | None]] = [
            ("tma", False, False, None),
            ("warp_specialized", True, False, None),
            ("warp_specialized_persistent", True, True, None),
            *((f"warp_specialized_persistent_{t[0]}x{t[1]}", True, True, t) for t in WS_TILES),
        ]
        for name, on, persistent, tile in forced:
            with _warp_specialized(on, persistent), _ws_tile(*tile) if tile else contextlib.nullcontext():
                equal = torch.equal(fp8_matmul.linear_fp8(x, ws[0][0], ws[0][1]), default)
                us = 1e3 * graph_ms_per_call([lambda w=w: fp8_matmul.linear_fp8(x, w[0], w[1]) for w in ws])
            row[name] = {"us": us, "bitwise_equal": equal}
    if configs:
        # Each tiling's rows against the first tiling of its split_k (the default for unsplit ones):
        # equal bits mean the two could serve one problem at different M.
        base = {fp8_matmul.tile_config(n, k).split_k: fp8_matmul.linear_fp8(x, ws[0][0], ws[0][1])}
        with _warp_specialized(False):  # each tiling on its own kernel
            row["configs"] = _time_configs(x, ws, configs, base)
    return row


def _time_configs(
    x: torch.Tensor,
    ws: list[tuple[torch.Tensor, torch.Tensor]],
    configs: list[fp8_matmul.Fp8TileConfig],
    base: dict[int, torch.Tensor],
) -> list[dict[str, Any]]:
    timed = []
    for cfg in configs:
        out = fp8_matmul.linear_fp8(x, ws[0][0], ws[0][1], config=cfg)
        us = 1e3 * graph_ms_per_call(
            [lambda w=w, c=cfg: fp8_matmul.linear_fp8(x, w[0], w[1], config=c) for w in ws]
        )
        first = base.setdefault(cfg.split_k, out)
        timed.append(
            {
                "config": repr(cfg),
                "us": us,
                "split_k": cfg.split_k,
                "bitwise_equal_within_split": torch.equal(out, first),
            }
        )
    return timed


# (largest M of the range, M it is timed at): decode batches. Larger M keeps the default's tiling
# (prefill chunks run the warp-specialised kernel there).
DECODE_RANGES = ((16, 1), (128, 64), (256, 256))


def pick_decode_tiling(
    default: Tiling[fp8_matmul.Fp8TileConfig],
    timed: dict[int, list[tuple[fp8_matmul.Fp8TileConfig, float, bool]]],
) -> Tiling[fp8_matmul.Fp8TileConfig]:
    """Per decode range, the fastest tiling timed at its size that gave the default tiling's rows bit
    for bit (`timed[m]`: (config, microseconds, rows equal)); the default's where none was timed or
    equal. Sizes above the last range keep the default's."""
    by_m = []
    for max_m, m in DECODE_RANGES:
        equal = [(us, cfg) for cfg, us, same in timed.get(m, []) if same]
        best = min(equal, key=lambda e: e[0])[1] if equal else default.for_m(m)
        by_m.append((max_m, best))
    return Tiling(default.rest, tuple(by_m))


def time_decode_tilings(
    n: int, k: int, candidates: list[fp8_matmul.Fp8TileConfig]
) -> dict[int, list[tuple[fp8_matmul.Fp8TileConfig, float, bool]]]:
    """At each decode range's size: every candidate of the default's split_k (and the default
    tiling), timed, its rows compared with the default tiling's."""
    copies = _copies(n * k)
    ws = [quantize_blocks(torch.randn(n, k, device="cuda") * k**-0.5) for _ in range(copies)]
    timed = {}
    for _, m in DECODE_RANGES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        default = fp8_matmul.tile_config(n, k, m)  # no GPU name: the defaults, not an earlier file
        configs = [default, *(c for c in candidates if c.split_k == default.split_k and c != default)]
        base = {default.split_k: fp8_matmul.linear_fp8(x, ws[0][0], ws[0][1], config=default)}
        with _warp_specialized(False):
            rows = _time_configs(x, ws, configs, base)
        timed[m] = [(c, r["us"], r["bitwise_equal_within_split"]) for c, r in zip(configs, rows, strict=True)]
    return timed


def write_configs(
    chosen: dict[tuple[int, int], Tiling[fp8_matmul.Fp8TileConfig]], meta: dict[str, Any]
) -> Path:
    """Merge the chosen tilings into the GPU model's measured FP8 tilings file (entries for other
    shapes are kept); returns its path."""
    import triton

    path = fp8_matmul.config_path(meta["gpu"])
    header = {
        "gpu": meta["gpu"],
        "triton": triton.__version__,
        "date": meta["date"],
        "commit": meta["commit"],
        "how": (
            "bench/kernels/bench_fp8_matmul.py --write-configs: per (N, K), at M = "
            f"{[m for _, m in DECODE_RANGES]} for M <= {[b for b, _ in DECODE_RANGES]}, the fastest "
            "candidate of the default tiling's split_k whose rows equal the default's bit for bit; larger "
            "M keeps the default; shapes not in this run keep their earlier entries"
        ),
    }
    tuning.write_measured(
        path,
        ({"n": n, "k": k, **tuning.entry_fields(t)} for (n, k), t in chosen.items()),
        lambda e: (e["n"], e["k"]),
        header,
    )
    fp8_matmul.measured_configs.cache_clear()
    fp8_matmul.measured_configs(meta["gpu"])  # reads back, checking what was written
    return path


def _all_candidates(tma_only: bool) -> list[fp8_matmul.Fp8TileConfig]:
    unique: list[fp8_matmul.Fp8TileConfig] = []
    for c in [*CANDIDATES, *SPLIT_CANDIDATES, *SETTING_CANDIDATES]:
        if c not in unique and (c.tma or not tma_only):
            unique.append(c)
    return unique


def _row_counts(text: str) -> set[int]:
    """--sweep-ms: comma-separated positive row counts."""
    try:
        counts = {int(m) for m in text.split(",")}
    except ValueError:
        counts = set()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give positive row counts separated by commas, e.g. 512,1024"
        )
    return counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="8b")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--sweep", action="store_true", help="also time and compare the candidate tilings")
    ap.add_argument("--tma-only", action="store_true", help="sweep only the candidates with tma=True")
    ap.add_argument(
        "--sweep-ms",
        type=_row_counts,
        default="64,256,8192",
        help="the M (of --ms) at which --sweep, --splits or --settings time the candidates",
    )
    ap.add_argument(
        "--splits",
        action="store_true",
        help="sweep the fixed split-K candidates (with the default tiling first, for reference)",
    )
    ap.add_argument(
        "--settings",
        action="store_true",
        help="sweep the split and unsplit tilings of long-K problems (SETTING_CANDIDATES)",
    )
    ap.add_argument(
        "--ws",
        action="store_true",
        help="also time the TMA kernel and the warp-specialised one (fp8_matmul_ws), plain and "
        "persistent, at every shape, each forced, bits compared with the default's",
    )
    ap.add_argument(
        "--write-configs",
        action="store_true",
        help="time the candidates at decode sizes and write the GPU's measured FP8 tilings file "
        "(the module docstring)",
    )
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    if args.write_configs:
        _write_measured(args.models.split(","), Path(args.out), args.tma_only)
        return
    candidates = [c for c in CANDIDATES if c.tma or not args.tma_only]
    if args.splits:
        candidates = [fp8_matmul.tile_config(0, 0, 256), *SPLIT_CANDIDATES]
    if args.settings:
        candidates = SETTING_CANDIDATES
    ceiling = fp8_matmul_rate()
    print(f"FP8 ceiling (torch._scaled_mm 8192^3): {ceiling / 1e12:.0f} TFLOP/s", flush=True)
    rows = []
    print(
        f"{'model':<8} {'proj':<15} {'M':>5} {'fp8 us':>9} {'bf16 us':>9} {'smm us':>9} {'TFLOP/s':>8} "
        f"{'GB/s':>7} {'fp8/bf16':>8}"
    )
    for model in args.models.split(","):
        _, shapes = MODELS[model]
        for proj, (n, k) in shapes.items():
            if proj == "lm_head":  # stays bf16 in FP8 models
                continue
            for m in map(int, args.ms.split(",")):
                sweep = (args.sweep or args.splits or args.settings) and m in args.sweep_ms
                r = time_shape(n, k, m, candidates if sweep else None, args.ws)
                r.update(model=model, proj=proj)
                rows.append(r)
                print(
                    f"{model:<8} {proj:<15} {m:>5} {r['ours_fp8_us']:>9.1f} {r['bf16_us']:>9.1f} "
                    f"{r['scaled_mm_us']:>9.1f} {r['ours_tflops']:>8.0f} {r['ours_GBps']:>7.0f} "
                    f"{r['ours_fp8_us'] / r['bf16_us']:>8.2f}",
                    flush=True,
                )
                ws_tiles = [f"warp_specialized_persistent_{bm}x{bn}" for bm, bn, _ in WS_TILES]
                for name in ("tma", "warp_specialized", "warp_specialized_persistent", *ws_tiles):
                    if name in r:
                        print(
                            f"    {name} kernel: {r[name]['us']:.1f} us, bitwise equal={r[name]['bitwise_equal']}"
                        )
                for c in r.get("configs", []):
                    print(f"    {c['config']:<122} {c['us']:>9.1f} equal={c['bitwise_equal_within_split']}")
    now = dt.datetime.now(dt.UTC)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "bench": "fp8_matmul",
        "gpu": torch.cuda.get_device_name(0),
        "commit": bench_commit(),
        "date": now.isoformat(),
        "fp8_ceiling_tflops": ceiling / 1e12,
        "rows": rows,
    }
    (out / f"kernels-fp8-matmul-{now.strftime('%Y%m%d-%H%M%S')}.json").write_text(
        json.dumps(result, indent=2)
    )


def _save(
    chosen: dict[tuple[int, int], Tiling[fp8_matmul.Fp8TileConfig]],
    meta: dict[str, Any],
    rows: list[dict[str, Any]],
    out: Path,
) -> None:
    path = write_configs(chosen, meta)
    print(f"wrote {path}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / path.name).write_text(path.read_text())  # a copy beside the run's results, to fetch
    stamp = dt.datetime.fromisoformat(meta["date"]).strftime("%Y%m%d-%H%M%S")
    (out / f"kernels-fp8-matmul-tilings-{stamp}.json").write_text(
        json.dumps({"bench": "fp8_matmul_tilings", **meta, "rows": rows}, indent=2)
    )


def _write_measured(models: list[str], out: Path, tma_only: bool) -> None:
    now = dt.datetime.now(dt.UTC)
    meta = {"gpu": torch.cuda.get_device_name(0), "date": now.isoformat(), "commit": bench_commit()}
    candidates = _all_candidates(tma_only)
    chosen: dict[tuple[int, int], Tiling[fp8_matmul.Fp8TileConfig]] = {}
    rows = []
    for model in models:
        for proj, (n, k) in MODELS[model][1].items():
            if proj == "lm_head" or (n, k) in chosen:  # the LM head stays bf16 in FP8 models
                continue
            timed = time_decode_tilings(n, k, candidates)
            chosen[(n, k)] = pick_decode_tiling(fp8_matmul.tiling(n, k), timed)
            for m, results in timed.items():
                default_us = results[0][1]
                best = chosen[(n, k)].for_m(m)
                best_us = next(us for cfg, us, _ in results if cfg == best)
                print(
                    f"{model:<8} {proj:<15} M={m:<4} default {default_us:8.1f} us  chosen {best_us:8.1f} us  {best}"
                )
                rows.append(
                    {
                        "model": model,
                        "proj": proj,
                        "n": n,
                        "k": k,
                        "m": m,
                        "timed": [
                            {"config": repr(c), "us": us, "bitwise_equal": eq} for c, us, eq in results
                        ],
                        "chosen": repr(best),
                    }
                )
            _save(chosen, meta, rows, out)  # after each shape: a run cut short keeps what it measured


if __name__ == "__main__":
    main()
