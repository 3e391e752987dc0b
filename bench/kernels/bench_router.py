"""The MoE router's float32 GEMM (batch-invariant `_linear_kernel`, IEEE products on the FMA units)
at the tilings it could take, against the one it takes now, and the LM head beside it.

A decode profile of moe-16b at batch 1024 (docs/performance.md) puts 27 `_linear_kernel` launches in
a step: 26 routers (N 64 x K 2048, float32) and the LM head (bf16, float32 logits). This script
times each side apart. Every candidate keeps the shipped split of K (the ranges that fix a row's
summation order), so it must give the shipped tiling's bits: checked at every M beside its time.
The tiling before 848fb05 (four warps, one persistent program a SM) is in the list, so that a run
compares the shipped one against it (bench/kernels/NOTES.md, "The MoE router's float32 GEMM").

    python bench/kernels/bench_router.py [--ms 64 256 1024 4096]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.kernels.bench_matmul import time_us, write
from bench.workloads import bench_commit
from shardinfer.kernels import matmul as mm

# (name, N experts, K hidden): moe-16b's router and DeepSeek-V3's.
ROUTERS = (("moe-16b", 64, 2048), ("deepseek-v3", 256, 7168))
LM_HEAD = ("moe-16b lm_head", 163840, 2048)


def candidates(shipped: mm.TileConfig) -> dict[str, mm.TileConfig]:
    """Tilings with the shipped split_k (and so the shipped ranges of K for these shapes): the
    tilings before 848fb05 (4 warps, persistent) and before the row heights by M (the small-M
    tiling at every M), and block shapes and warps on a grid. `shipped` is the small-M tiling;
    main times the shipped one at each M under "shipped"."""
    out = {"shipped": shipped}
    out["32x64x32 w4, persistent (before 848fb05)"] = replace(shipped, num_warps=4, persistent=True)
    out["32 rows at every M (before the row heights by M)"] = shipped
    shapes = (
        (64, 64, 32, 4),
        (32, 64, 64, 4),
        (64, 64, 64, 8),
        (128, 64, 32, 8),
        (32, 64, 32, 2),
        # 64 or more outputs a thread: 32 (the two-warp 32x64 tile) halved the time against 16
        (64, 64, 32, 2),
        (128, 64, 32, 4),
        (32, 64, 32, 1),
        (64, 64, 16, 2),
    )
    for bm, bn, bk, warps in shapes:
        cfg = replace(shipped, block_m=bm, block_n=bn, block_k=bk, num_warps=warps, persistent=False)
        if cfg not in out.values():  # the shipped tiling is timed once, under its own name
            out[f"{bm}x{bn}x{bk} w{warps}, grid"] = cfg
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", type=int, nargs="+", default=[64, 256, 1024, 4096])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    records = []
    print(f"{torch.cuda.get_device_name()}; µs per call (CUDA-graph replays); 'bits' = the shipped tiling's")
    for name, n, k in ROUTERS:
        gen = torch.Generator(device="cuda").manual_seed(n)
        w = torch.randn(n, k, device="cuda", generator=gen) * k**-0.5
        shipped_tiling = mm.tiling(n, k, torch.float32, torch.cuda.get_device_name())
        shipped = shipped_tiling.for_m(1)
        cands = candidates(shipped)
        print(f"\n{name} router, N {n} K {k} float32; shipped {shipped_tiling}")
        print(f"{'tiling':<24}" + "".join(f"{'M ' + str(m):>16}" for m in args.ms))
        for label, cfg in cands.items():
            cells = []
            for m in args.ms:
                x = torch.randn(m, k, device="cuda", generator=gen).bfloat16().float()
                at_m = shipped_tiling.for_m(m)  # "shipped" times the tiling the engine runs at this M
                run = at_m if label == "shipped" else cfg
                try:
                    want = mm.linear_with_config(x, w, None, at_m)
                    got = mm.linear_with_config(x, w, None, run)
                    same = torch.equal(want, got)
                    us = time_us(
                        lambda i, x=x, w=w, run=run: mm.linear_with_config(x, w, None, run), 1, m * n * 4
                    )
                except Exception as exc:  # a tiling that does not fit is reported, not fatal
                    cells.append(f"{'error':>16}")
                    records.append({"router": name, "tiling": label, "M": m, "error": str(exc)[:200]})
                    continue
                cells.append(f"{us:>10.1f} {'bits' if same else 'DIFF':>5}")
                records.append(
                    {"router": name, "tiling": label, "config": asdict(run), "M": m, "us": us, "bits": same}
                )
            print(f"{label:<24}" + "".join(cells), flush=True)
        cast = []
        for m in args.ms:
            xb = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
            cast.append(time_us(lambda i, xb=xb: xb.float(), 1, m * k * 4))
        print(f"{'the input cast x.float()':<24}" + "".join(f"{us:>16.1f}" for us in cast))
        records.append({"router": name, "tiling": "input cast", "M": args.ms, "us": cast})
    label, n, k = LM_HEAD
    gen = torch.Generator(device="cuda").manual_seed(0)
    w16 = (torch.randn(n, k, device="cuda", generator=gen) * k**-0.5).bfloat16()
    heads = []
    for m in args.ms:
        x16 = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
        heads.append(
            time_us(
                lambda i, x16=x16: mm.linear_batch_invariant(x16, w16, None, out_dtype=torch.float32),
                1,
                m * n * 4,
            )
        )
    print(f"\n{label + ' (bf16, float32 out)':<24}" + "".join(f"{us:>16.1f}" for us in heads))
    records.append({"router": label, "tiling": "shipped", "M": args.ms, "us": heads})
    meta = {"gpu": torch.cuda.get_device_name(), "commit": bench_commit(), "torch": torch.__version__}
    write(Path(args.out), "router", {**meta, "records": records})


if __name__ == "__main__":
    main()
