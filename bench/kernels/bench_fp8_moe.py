"""FP8 fused MoE (kernels/fp8_moe.py) against the bf16 fused MoE at moe-16b's expert shape.

Hidden 2048, intermediate 1408, 64 experts, top-6 (one layer's experts: 1.1 GB in bf16, more than
L2, so every call reads its weights from HBM). Times are medians of CUDA-graph replays; GB/s
counts the expert weights the batch touches once.

    python bench/kernels/bench_fp8_moe.py [--tokens 64,256,1024,8192] [--out DIR]
    python bench/kernels/bench_fp8_moe.py --tiles [--tokens 256,1024]

--tiles times the FP8 kernel at other tilings (Fp8MoeTiles) against the default instead, each
checked for the default's bits: a tiling the engine could take only if it sums every row in the
same order (one 128-channel step at a time, in order; the tile's shape picks the MMA instruction,
which the bits say whether it matters). A moe-16b decode step at 1024 rows spends 27% of its time
in this kernel, reading its expert weights at about 0.6 of copy bandwidth (docs/performance.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import graph_ms
from bench.kernels.bench_matmul import write
from bench.workloads import bench_commit
from shardinfer.kernels import fp8_moe, moe, reference_moe
from shardinfer.kernels.reference_fp8 import quantize_blocks

HIDDEN, INTER, EXPERTS, TOP_K = 2048, 1408, 64, 6
# (block_m, block_n, num_warps, num_stages); the first is the default.
TILE_CANDIDATES = (
    (64, 64, 4, 3),
    (64, 64, 4, 4),
    (64, 128, 4, 3),
    (64, 128, 8, 3),
    (128, 64, 8, 3),
    (128, 128, 8, 3),
    (64, 32, 4, 4),
    (32, 64, 4, 3),
)


def sweep_tiles(
    tokens: list[int], qgu: tuple[torch.Tensor, torch.Tensor], qd: tuple[torch.Tensor, torch.Tensor]
) -> list[dict]:
    """Each candidate tiling's µs a call and whether it gives the default tiling's bits."""
    tilings = [fp8_moe.Fp8MoeTiles(m, n, num_warps=w, num_stages=st) for m, n, w, st in TILE_CANDIDATES]
    assert tilings[0] == fp8_moe.DEFAULT_TILES, "the first candidate is the default"
    rows = []
    print(f"{'tokens':>7} " + " ".join(f"{f'{m}x{n} w{w} s{st}':>18}" for m, n, w, st in TILE_CANDIDATES))
    for t in tokens:
        x = torch.randn(t, HIDDEN, device="cuda", dtype=torch.bfloat16)
        weights, ids = reference_moe.grouped_topk(torch.randn(t, EXPERTS, device="cuda"), None, TOP_K)

        def call(
            tiles: fp8_moe.Fp8MoeTiles,
            x: torch.Tensor = x,
            ids: torch.Tensor = ids,
            w: torch.Tensor = weights,
        ) -> torch.Tensor:
            return fp8_moe.fused_moe_fp8(x, ids, w, qgu[0], qgu[1], qd[0], qd[1], tiles=tiles)

        want = call(tilings[0])
        cells = []
        for tiles in tilings:
            try:
                same = torch.equal(call(tiles), want)
                us = graph_ms(lambda tiles=tiles: call(tiles)) * 1e3
            except Exception as exc:  # a tiling that does not fit (shared memory, registers): recorded
                rows.append({"tokens": t, "tiles": str(tiles), "error": str(exc)[:200]})
                cells.append(f"{'error':>18}")
                continue
            rows.append({"tokens": t, "tiles": str(tiles), "us": us, "bits": same})
            cells.append(f"{us:>12.1f} {'bits' if same else 'DIFF':>5}")
        print(f"{t:>7} " + " ".join(cells), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="64,256,1024,8192")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--tiles", action="store_true", help="time other FP8 tilings against the default")
    args = ap.parse_args()
    torch.manual_seed(0)
    wgu = torch.randn(EXPERTS, 2 * INTER, HIDDEN, device="cuda", dtype=torch.bfloat16) * HIDDEN**-0.5
    wd = torch.randn(EXPERTS, HIDDEN, INTER, device="cuda", dtype=torch.bfloat16) * INTER**-0.5
    q = [quantize_blocks(w[e]) for w in (wgu, wd) for e in range(EXPERTS)]
    qgu = torch.stack([a for a, _ in q[:EXPERTS]]), torch.stack([s for _, s in q[:EXPERTS]])
    qd = torch.stack([a for a, _ in q[EXPERTS:]]), torch.stack([s for _, s in q[EXPERTS:]])
    if args.tiles:
        rows = sweep_tiles([int(t) for t in args.tokens.split(",")], qgu, qd)
        _write(Path(args.out), "kernels-fp8-moe-tiles", {"bench": "fp8_moe_tiles", "rows": rows})
        return
    rows = []
    print(f"{'tokens':>7} {'bf16 us':>9} {'fp8 us':>9} {'fp8/bf16':>9} {'fp8 GB/s':>9}")
    for t in map(int, args.tokens.split(",")):
        x = torch.randn(t, HIDDEN, device="cuda", dtype=torch.bfloat16)
        weights, ids = reference_moe.grouped_topk(torch.randn(t, EXPERTS, device="cuda"), None, TOP_K)
        bf16_ms = graph_ms(lambda x=x, ids=ids, weights=weights: moe.fused_moe(x, ids, weights, wgu, wd))
        fp8_ms = graph_ms(
            lambda x=x, ids=ids, weights=weights: fp8_moe.fused_moe_fp8(
                x, ids, weights, qgu[0], qgu[1], qd[0], qd[1]
            )
        )
        touched = int(torch.unique(ids).numel())
        gbps = touched * 3 * HIDDEN * INTER / (fp8_ms * 1e-3) / 1e9
        rows.append(
            {
                "tokens": t,
                "bf16_us": bf16_ms * 1e3,
                "fp8_us": fp8_ms * 1e3,
                "experts_touched": touched,
                "fp8_weight_GBps": gbps,
            }
        )
        print(
            f"{t:>7} {bf16_ms * 1e3:>9.1f} {fp8_ms * 1e3:>9.1f} {fp8_ms / bf16_ms:>9.2f} {gbps:>9.0f}",
            flush=True,
        )
    _write(Path(args.out), "kernels-fp8-moe", {"bench": "fp8_moe", "rows": rows})


def _write(out: Path, name: str, record: dict) -> None:
    """The record with the run's GPU, commit, date and shape (bench_matmul.write: a stamped JSON)."""
    meta = {
        "gpu": torch.cuda.get_device_name(0),
        "commit": bench_commit(),
        "date": dt.datetime.now(dt.UTC).isoformat(),
    }
    shape = {"hidden": HIDDEN, "intermediate": INTER, "experts": EXPERTS, "top_k": TOP_K}
    write(out, name, {**record, **meta, "shape": shape})


if __name__ == "__main__":
    main()
