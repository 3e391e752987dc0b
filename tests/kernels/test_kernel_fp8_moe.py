"""Fused MoE with FP8 experts against reference_moe.moe_experts_fp8, and its batch invariance.

Bound: against the reference (the same quantised operands, float32 products) within the bf16
kernel's own test bound (test_kernel_moe): float32 summation order, plus the roundings to x's dtype
of the gate/up and down outputs, which can land on either side of a rounding boundary.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from kernel_checks import TOL, rel_err

from shardinfer.kernels import fp8_moe, fp8_quant, reference_moe
from shardinfer.kernels.reference_fp8 import quantize_blocks

if not torch.cuda.is_available():
    fp8_quant = importlib.reload(fp8_quant)
    fp8_moe = importlib.reload(fp8_moe)

SMALL = fp8_moe.Fp8MoeTiles(block_m=16, block_n=32, num_warps=4, num_stages=2, group_m=2)


def _stack_quantized(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = [quantize_blocks(w[e]) for e in range(w.shape[0])]
    return torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])


def _problem(
    t: int, hidden: int, inter: int, experts: int, top_k: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, hidden, generator=gen).to(dtype)
    logits = torch.randn(t, experts, generator=gen)
    weights, ids = reference_moe.grouped_topk(logits, None, top_k, renormalize=True)
    wgu, sgu = _stack_quantized(torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5)
    wd, sd = _stack_quantized(torch.randn(experts, hidden, inter, generator=gen) / inter**0.5)
    return x, ids, weights, wgu, sgu, wd, sd


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_reference(device: torch.device, dtype: torch.dtype) -> None:
    # hidden 200: a K tail in the gate/up GEMM; inter 72: gate and up share a 128-row scale block.
    x, ids, w, wgu, sgu, wd, sd = _problem(
        t=10, hidden=200, inter=72, experts=5, top_k=2, dtype=dtype, seed=1
    )
    ref = reference_moe.moe_experts_fp8(x, ids, w, wgu, sgu, wd, sd)
    out = fp8_moe.fused_moe_fp8(*(a.to(device) for a in (x, ids, w, wgu, sgu, wd, sd)), tiles=SMALL).cpu()
    assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else 4 * TOL[dtype])


def test_token_alone_equals_token_in_batch(device: torch.device) -> None:
    x, ids, w, wgu, sgu, wd, sd = _problem(
        t=9, hidden=128, inter=64, experts=3, top_k=2, dtype=torch.float32, seed=2
    )
    args = [a.to(device) for a in (x, ids, w, wgu, sgu, wd, sd)]
    full = fp8_moe.fused_moe_fp8(*args, tiles=SMALL)
    for i in (0, 4, 8):
        alone = fp8_moe.fused_moe_fp8(
            args[0][i : i + 1], args[1][i : i + 1], args[2][i : i + 1], *args[3:], tiles=SMALL
        )
        assert torch.equal(alone, full[i : i + 1]), f"token {i}"


def test_rejects_a_wrong_scale_shape(device: torch.device) -> None:
    x, ids, w, wgu, sgu, wd, sd = _problem(
        t=2, hidden=128, inter=64, experts=2, top_k=1, dtype=torch.float32, seed=3
    )
    with pytest.raises(ValueError, match=r"w_down_scale\.shape"):
        fp8_moe.fused_moe_fp8(*(a.to(device) for a in (x, ids, w, wgu, sgu, wd, sd[:, :, :0].contiguous())))


@pytest.mark.gpu
def test_gpu_moe16b_shape_matches_reference() -> None:
    """moe-16b's experts (hidden 2048, intermediate 1408, 64 experts, top-6) at a decode batch."""
    x, ids, w, wgu, sgu, wd, sd = _problem(
        t=64, hidden=2048, inter=1408, experts=64, top_k=6, dtype=torch.bfloat16, seed=4
    )
    ref = reference_moe.moe_experts_fp8(x, ids, w, wgu, sgu, wd, sd)
    args = [a.cuda() for a in (x, ids, w, wgu, sgu, wd, sd)]
    out = fp8_moe.fused_moe_fp8(*args)
    assert rel_err(out, ref) < 4 * TOL[torch.bfloat16]
    assert torch.equal(fp8_moe.fused_moe_fp8(args[0][7:8], args[1][7:8], args[2][7:8], *args[3:]), out[7:8])
