"""FP8 GEMMs with per-output-channel weight scales (the layout of per-channel FP8 checkpoints):
the per-row quantiser, the reference linear, the fused MoE against float64 dequantise-then-matmul
with tokens bitwise independent of the batch, launcher checks. The linear kernel's value and
invariance tests run both scale layouts in test_kernel_fp8.py.

The weights are quantised here, per row in float64 (scale = row amax / 448 rounded to float32,
values rounded to the nearest e4m3 by kernel_checks.e4m3_round), never by the code under test.
Bound (docs/quantization.md): against float64 math on the same quantised operands, relative
Frobenius error below one rounding of the output dtype (kernel_checks.TOL); the products of two
e4m3 values are exact in float32 and the channel scale is one more float32 multiplication.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from fp8_problems import dequantize_rows64, linear_float64, linear_problem, quantize_rows64, randn
from kernel_checks import TOL, rel_err

from shardinfer.kernels import fp8_matmul, fp8_moe, fp8_quant, ops, reference_moe
from shardinfer.kernels import reference_fp8 as ref

if not torch.cuda.is_available():
    fp8_quant = importlib.reload(fp8_quant)
    fp8_matmul = importlib.reload(fp8_matmul)
    fp8_moe = importlib.reload(fp8_moe)

SMALL_MOE = fp8_moe.Fp8MoeTiles(block_m=16, block_n=32, num_warps=4, num_stages=2, group_m=2)


def test_reference_channel_quantiser_matches_float64_rounding() -> None:
    w = randn(70, 300, seed=1) * torch.logspace(-6, 3, 70).unsqueeze(1)
    w[3] = 0.0  # an all-zero row keeps a finite scale and zero values
    q, s = ref.quantize_channels(w)
    want_q, want_s = quantize_rows64(w)
    nonzero = torch.arange(70) != 3
    assert s.shape == (70,) and s.dtype == torch.float32
    assert torch.equal(s[nonzero], want_s[nonzero])
    assert torch.equal(q[nonzero].view(torch.uint8), want_q[nonzero].view(torch.uint8))
    assert s[3].item() > 0 and not q[3].float().any()
    want = dequantize_rows64(q, s)  # the float32 product rounds once: half a float32 ulp at most
    assert bool(((ref.dequantize_weight(q, s).double() - want).abs() <= want.abs() * 2**-24).all())


def test_reference_linear_with_channel_scales_is_dequantise_then_matmul() -> None:
    x, wq, ws, b = linear_problem(9, 40, 200, torch.float32, seed=5, scales="channel")
    got = ops.linear_fp8(x.view(3, 3, 200), wq, ws, b)  # CPU tensors: the reference path
    assert rel_err(got.view(9, 40), linear_float64(x, wq, ws, b)) < TOL[torch.float32]
    assert torch.equal(ops.linear_fp8(x[4:5], wq, ws, b), got.view(9, 40)[4:5])


def test_launcher_rejects_a_channel_scale_of_the_wrong_length(device: torch.device) -> None:
    x, wq, ws, _ = (
        t.to(device) for t in linear_problem(4, 40, 200, torch.bfloat16, seed=6, scales="channel")
    )
    with pytest.raises(ValueError, match=r"weight_scale\.shape.*\(40,\)"):
        fp8_matmul.linear_fp8(x, wq, ws[:39].contiguous())
    with pytest.raises(
        ValueError, match=r"weight_scale\.shape"
    ):  # [N, 1]: the loader flattens it, not the kernel
        fp8_matmul.linear_fp8(x, wq, ws[:, None].contiguous())


def _moe_problem(
    t: int, hidden: int, inter: int, experts: int, top_k: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, hidden, generator=gen).to(dtype)
    weights, ids = reference_moe.grouped_topk(
        torch.randn(t, experts, generator=gen), None, top_k, renormalize=True
    )
    rows_gu = torch.logspace(-1, 1, 2 * inter).view(1, -1, 1)
    wgu, sgu = quantize_rows64(torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5 * rows_gu)
    wd, sd = quantize_rows64(torch.randn(experts, hidden, inter, generator=gen) / inter**0.5)
    return x, ids, weights, wgu, sgu, wd, sd


def _moe_float64(x, ids, weights, wgu, sgu, wd, sd) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Each token through its experts in float64 on the dequantised weights, with the input and the
    gate/up output rounded through FP8 per 128 channels as the engine does."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for i in range(x.shape[0]):
        xi = ref.dequantize_groups(*ref.quantize_groups(x[i : i + 1])).double()
        for j in range(ids.shape[1]):
            e = int(ids[i, j])
            h = xi @ dequantize_rows64(wgu[e], sgu[e]).T
            gate, up = h.chunk(2, dim=-1)
            act = (gate * torch.sigmoid(gate) * up).float()
            a = ref.dequantize_groups(*ref.quantize_groups(act)).double()
            out[i] += float(weights[i, j]) * (a @ dequantize_rows64(wd[e], sd[e]).T)[0]
    return out


def test_channel_scaled_moe_matches_float64_and_tokens_are_batch_invariant(device: torch.device) -> None:
    # hidden 200: a K tail in the gate/up GEMM; inter 72: the down GEMM's K is one partial group.
    args = _moe_problem(t=10, hidden=200, inter=72, experts=5, top_k=2, dtype=torch.float32, seed=1)
    dev = [a.to(device) for a in args]
    out = fp8_moe.fused_moe_fp8(*dev, tiles=SMALL_MOE)
    # The gate/up output is rounded through FP8 again: where float32 and float64 land on opposite
    # sides of an e4m3 rounding boundary one value moves by an e4m3 step, hence the looser bound.
    assert rel_err(out, _moe_float64(*args)) < 1e-3
    assert rel_err(out, reference_moe.moe_experts_fp8(*args)) < 1e-5
    for i in (0, 4, 9):
        alone = fp8_moe.fused_moe_fp8(
            dev[0][i : i + 1], dev[1][i : i + 1], dev[2][i : i + 1], *dev[3:], tiles=SMALL_MOE
        )
        assert torch.equal(alone, out[i : i + 1]), f"token {i}"


def test_moe_rejects_mixed_or_wrong_channel_scales(device: torch.device) -> None:
    x, ids, w, wgu, sgu, wd, sd = (
        a.to(device)
        for a in _moe_problem(t=2, hidden=128, inter=64, experts=2, top_k=1, dtype=torch.float32, seed=3)
    )
    with pytest.raises(ValueError, match=r"w_down_scale\.shape"):
        fp8_moe.fused_moe_fp8(x, ids, w, wgu, sgu, wd, sd[:, :5].contiguous())
    blocks = torch.ones(2, 1, 1, device=device)
    with pytest.raises(ValueError, match="ranks"):
        fp8_moe.fused_moe_fp8(x, ids, w, wgu, sgu, wd, blocks)


@pytest.mark.gpu
def test_gpu_channel_scaled_moe16b_shape_matches_reference() -> None:
    args = _moe_problem(t=64, hidden=2048, inter=1408, experts=64, top_k=6, dtype=torch.bfloat16, seed=4)
    dev = [a.cuda() for a in args]
    out = fp8_moe.fused_moe_fp8(*dev)
    assert rel_err(out, reference_moe.moe_experts_fp8(*args)) < 4 * TOL[torch.bfloat16]
    assert torch.equal(fp8_moe.fused_moe_fp8(dev[0][7:8], dev[1][7:8], dev[2][7:8], *dev[3:]), out[7:8])
