"""The transposed FP8 decode attention prototype (bench/kernels/proto_fp8_attention_transposed.py) in
the interpreter, against float64 attention over the dequantised cache, for GQA groups of 2 and 4,
both key tiles, contexts ending inside a page and a tile, and a row with a single key.

With the queries as two e4m3 terms, the only rounding left that the float64 reference does not
have is the probabilities' to bfloat16 before the value product (as the shipped chunk kernel's),
so every output is within that rounding's bound plus one bf16 unit in the last place. With one
term the queries lose their low bits: the error is far larger, which the GPU run reports."""

from __future__ import annotations

import pytest
import torch

from bench.kernels.fp8_decode_batch import HEAD_DIM, problem
from bench.kernels.proto_fp8_attention_transposed import decode_transposed, quantize_queries


def _reference_and_bound(
    pr: dict[str, torch.Tensor], b: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row b in float64, and what rounding each probability to bf16 (unit roundoff u) can move it
    by: u * sum_k p_k |v_k| / sum_k p_k."""
    ctx, hk = int(pr["sl"][b]), pr["k"].shape[2]
    q = pr["q"][b].double()
    group = q.shape[0] // hk
    pages = pr["bt"][b].long()
    k = (
        (pr["k"].double() * pr["ks"].double())[pages]
        .reshape(-1, hk, HEAD_DIM)[:ctx]
        .repeat_interleave(group, 1)
    )
    v = (
        (pr["v"].double() * pr["vs"].double())[pages]
        .reshape(-1, hk, HEAD_DIM)[:ctx]
        .repeat_interleave(group, 1)
    )
    p = torch.softmax(torch.einsum("hd,nhd->hn", q, k) * scale, -1)
    u = torch.finfo(torch.bfloat16).eps / 2
    return torch.einsum("hn,nhd->hd", p, v), u * torch.einsum("hn,nhd->hd", p, v.abs())


@pytest.mark.parametrize(("group", "ctx", "block_n"), [(4, 140, 128), (4, 33, 64), (2, 70, 64)])
def test_two_query_terms_leave_only_the_probabilities_rounding(group: int, ctx: int, block_n: int) -> None:
    pr = problem(3, ctx, group, hk=1, device="cpu")
    pr["sl"][1] = 1  # one key: the output is that key's value row
    pr["sl"][2] = max(1, ctx - 17)
    scale = HEAD_DIM**-0.5
    args = (pr["q"], pr["k"], pr["v"], pr["ks"], pr["vs"], pr["bt"], pr["sl"], scale)
    two = decode_transposed(*args, terms=2, block_n=block_n)
    one = decode_transposed(*args, terms=1, block_n=block_n) if ctx < 64 else None  # one case is enough
    for b in range(3):
        want, bound = _reference_and_bound(pr, b, scale)
        ulp = torch.finfo(torch.bfloat16).eps * want.abs().clamp_min(2**-10).log2().floor().exp2()
        err = (two[b].double() - want).abs()
        assert (err <= bound + ulp).all(), f"row {b}: {(err - bound - ulp).max().item()}"
        if one is not None:  # a sanity bound only: the queries' rounding is the cost to measure
            assert (one[b].double() - want).abs().max() < 0.1, f"row {b}"
    single = (pr["v"].double() * pr["vs"].double())[pr["bt"][1, 0].long(), 0]  # [Hk, D]
    assert torch.equal(two[1].double(), single.repeat_interleave(group, dim=0).to(torch.bfloat16).double())


def test_query_terms_sum_back_to_the_queries() -> None:
    q = torch.randn(4, 8, HEAD_DIM, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    values, scales = quantize_queries(q, 2)
    assert values.dtype == torch.float8_e4m3fn and values.shape == (2, *q.shape)
    assert torch.equal(torch.log2(scales), torch.log2(scales).round())  # powers of two
    back = (values.double() * scales.double()[..., None]).sum(0)
    # Two 4-bit terms hold a bf16's 8 significant bits, but for elements so far below their head's
    # largest that the second term's e4m3 is subnormal.
    tiny = q.double().abs() < q.double().abs().amax(-1, keepdim=True) * 2**-10
    assert torch.equal(back[~tiny], q.double()[~tiny])
    assert ((back - q.double()).abs()[tiny] <= scales[1].double()[..., None].expand_as(q)[tiny] * 2**-9).all()
