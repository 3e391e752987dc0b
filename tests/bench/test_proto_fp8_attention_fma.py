"""The FMA decode attention kernel (shardinfer/kernels/paged_attention_fma.py) at the tiles of its sweep
(bench/kernels/proto_fp8_attention_fma.py), its Triton kernel in the interpreter: every row within one bf16 rounding of the float64 attention over the dequantised
cache, for GQA groups of 1, 2 and 4, contexts that end inside a page and inside a warp's keys, and a
row with a single key. (The Gluon kernel has the same arithmetic and runs on the GPU only.)"""

from __future__ import annotations

import pytest
import torch

from bench.kernels.fp8_decode_batch import HEAD_DIM, problem, reference
from bench.kernels.proto_fp8_attention_fma import decode_fma


@pytest.mark.parametrize(
    ("group", "ctx", "reps", "warps"), [(2, 70, 2, 4), (4, 33, 1, 4), (1, 64, 4, 4), (2, 5, 1, 2)]
)
def test_each_row_is_within_a_bf16_rounding_of_float64(group: int, ctx: int, reps: int, warps: int) -> None:
    pr = problem(3, ctx, group, hk=2, device="cpu")
    pr["sl"][1] = 1  # one key: the output is that key's value row
    pr["sl"][2] = max(1, ctx - 17)
    scale = HEAD_DIM**-0.5
    out = decode_fma(pr["q"], pr["k"], pr["v"], pr["ks"], pr["vs"], pr["bt"], pr["sl"], scale, reps, warps)
    for b in range(3):
        one = {name: pr[name] for name in ("k", "v", "ks", "vs")}
        one.update(q=pr["q"][b : b + 1], bt=pr["bt"][b : b + 1], sl=pr["sl"][b : b + 1])
        want = reference(one, scale)
        # One unit in the last place of bf16 at each value's magnitude: the rounding of the output
        # plus the float32 sums' error, which is far below it.
        ulp = torch.finfo(torch.bfloat16).eps * want.abs().clamp_min(2**-10).log2().floor().exp2()
        assert ((out[b : b + 1].double() - want).abs() <= ulp).all(), f"row {b}"
    single = (pr["v"].double() * pr["vs"].double())[pr["bt"][1, 0].long(), 0]  # [Hk, D]
    assert torch.equal(out[1].double(), single.repeat_interleave(group, dim=0).to(torch.bfloat16).double())
