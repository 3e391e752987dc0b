"""FP8 fused MoE (kernels/fp8_moe.py) against the bf16 fused MoE at moe-16b's expert shape.

Hidden 2048, intermediate 1408, 64 experts, top-6 (one layer's experts: 1.1 GB in bf16, more than
L2, so every call reads its weights from HBM). Times are medians of CUDA-graph replays; GB/s
counts the expert weights the batch touches once.

    python bench/kernels/bench_fp8_moe.py [--tokens 64,256,1024,8192] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import graph_ms
from bench.workloads import bench_commit
from shardinfer.kernels import fp8_moe, moe, reference_moe
from shardinfer.kernels.reference_fp8 import quantize_blocks

HIDDEN, INTER, EXPERTS, TOP_K = 2048, 1408, 64, 6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="64,256,1024,8192")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    torch.manual_seed(0)
    wgu = torch.randn(EXPERTS, 2 * INTER, HIDDEN, device="cuda", dtype=torch.bfloat16) * HIDDEN**-0.5
    wd = torch.randn(EXPERTS, HIDDEN, INTER, device="cuda", dtype=torch.bfloat16) * INTER**-0.5
    q = [quantize_blocks(w[e]) for w in (wgu, wd) for e in range(EXPERTS)]
    qgu = torch.stack([a for a, _ in q[:EXPERTS]]), torch.stack([s for _, s in q[:EXPERTS]])
    qd = torch.stack([a for a, _ in q[EXPERTS:]]), torch.stack([s for _, s in q[EXPERTS:]])
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
    now = dt.datetime.now(dt.UTC)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"kernels-fp8-moe-{now.strftime('%Y%m%d-%H%M%S')}.json").write_text(
        json.dumps(
            {
                "bench": "fp8_moe",
                "gpu": torch.cuda.get_device_name(0),
                "commit": bench_commit(),
                "date": now.isoformat(),
                "shape": {"hidden": HIDDEN, "intermediate": INTER, "experts": EXPERTS, "top_k": TOP_K},
                "rows": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
