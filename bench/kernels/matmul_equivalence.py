"""Which tilings of the batch-invariant matmul compute bitwise the same rows (a measurement).

A row's result depends on the order its K products are summed in. Tile height and width decide
which program computes it, not that order, so tilings that differ only in block_m / block_n /
warps / stages / TMA (and maybe block_k, if the MMA chain over a longer K tile accumulates in
the same sequence) could be interchangeable: the engine could then pick the fastest such tiling
per batch size and stay batch invariant. This checks it on the GPU at the engine's shapes: every
candidate tiling of bench_matmul.py runs on the same rows; tilings are grouped by split_k and
by (split_k, block_k), and a group counts as equivalent when all its outputs are bitwise equal,
for the whole batch and for single rows computed alone.

    python bench/kernels/matmul_equivalence.py [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.kernels.bench_matmul import MODELS, activations, compile_candidates, weights
from shardinfer.kernels import matmul as mm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--rows", type=int, default=512)
    args = ap.parse_args()
    candidates, failed = compile_candidates()
    shapes = sorted({nk for _, projs in MODELS.values() for nk in projs.values()})
    report = []
    for n, k in shapes:
        x = activations(args.rows, k, seed=n + k)
        w = weights(n, k, seed=n * 7 + k)[0]
        outs = {name: mm.linear_with_config(x, w, None, cfg) for name, cfg in candidates.items()}
        alone = {name: mm.linear_with_config(x[200:201], w, None, cfg) for name, cfg in candidates.items()}
        for key_name, key in (
            ("split_k", lambda c: (c.split_k,)),
            ("split_k+block_k", lambda c: (c.split_k, c.block_k)),
        ):
            groups: dict[tuple[int, ...], list[str]] = defaultdict(list)
            for name, cfg in candidates.items():
                groups[key(cfg)].append(name)
            for gkey, names in sorted(groups.items()):
                ref = outs[names[0]]
                same = [torch.equal(outs[nm], ref) for nm in names]
                same_alone = [torch.equal(alone[nm], ref[200:201]) for nm in names]
                diff = max(float((outs[nm].float() - ref.float()).abs().max()) for nm in names)
                report.append(
                    {
                        "n": n,
                        "k": k,
                        "grouped_by": key_name,
                        "group": list(gkey),
                        "configs": names,
                        "all_equal": all(same),
                        "alone_equal": all(same_alone),
                        "unequal": [nm for nm, s in zip(names, same, strict=True) if not s],
                        "max_abs_diff": diff,
                    }
                )
                print(
                    f"{n:>7} x {k:<6} {key_name:<16} {gkey!s:<10} {len(names):>3} configs  "
                    f"equal={all(same)!s:<5} alone={all(same_alone)!s:<5} max|diff|={diff:.3g}"
                )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    (out / f"matmul-equivalence-{stamp}.json").write_text(
        json.dumps(
            {
                "gpu": torch.cuda.get_device_name(0),
                "torch": torch.__version__,
                "rows": args.rows,
                "candidates": {nm: asdict(c) for nm, c in candidates.items()},
                "failed": failed,
                "results": report,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
