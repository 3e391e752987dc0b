"""FP8 GEMMs with per-output-channel weight scales (the layout of per-channel FP8 checkpoints):
the linear kernel and the fused MoE against float64 dequantise-then-matmul, rows bitwise
independent of the batch, launcher checks.

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
from kernel_checks import TOL, e4m3_round, rel_err

from shardinfer.kernels import fp8_matmul, fp8_moe, fp8_quant, ops, reference_moe
from shardinfer.kernels import reference_fp8 as ref

if not torch.cuda.is_available():
    fp8_quant = importlib.reload(fp8_quant)
    fp8_matmul = importlib.reload(fp8_matmul)
    fp8_moe = importlib.reload(fp8_moe)

SMALL = fp8_matmul.Fp8TileConfig(16, 32, num_warps=4, num_stages=2, group_m=2)
SMALL_ONE_TILE = fp8_matmul.Fp8TileConfig(32, 16, num_warps=4, num_stages=2, persistent=False)
SMALL_MOE = fp8_moe.Fp8MoeTiles(block_m=16, block_n=32, num_warps=4, num_stages=2, group_m=2)


def quantize_rows64(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., N, K] -> (fp8 [..., N, K], scales [..., N] float32): each row's amax / 448 rounded to
    float32, each value w / scale rounded to the nearest e4m3 (ties to even) in float64."""
    w64 = w.double()
    scale = (w64.abs().amax(-1) / 448.0).float()
    q = e4m3_round(w64 / scale.double().unsqueeze(-1))
    return q.to(torch.float8_e4m3fn), scale


def dequantize_rows64(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.double() * scale.double().unsqueeze(-1)


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _problem(
    m: int, n: int, k: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    x = _randn(m, k, seed=seed).to(dtype)
    # Rows of very different magnitudes: a scale applied to the wrong column shows at once.
    w = _randn(n, k, seed=seed + 1, scale=k**-0.5) * torch.logspace(-2, 2, n).unsqueeze(1)
    wq, ws = quantize_rows64(w)
    return x, wq, ws, _randn(n, seed=seed + 2).to(dtype)


def _float64(x: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The same quantised operands (activations through the tested quantiser), in float64."""
    xq, xs = ref.quantize_groups(x)
    y = ref.dequantize_groups(xq, xs).double() @ dequantize_rows64(wq, ws).T
    return y + b.double() if b is not None else y


def test_reference_channel_quantiser_matches_float64_rounding() -> None:
    w = _randn(70, 300, seed=1) * torch.logspace(-6, 3, 70).unsqueeze(1)
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", [SMALL, SMALL_ONE_TILE], ids=["persistent", "one_tile_per_program"])
def test_channel_scaled_kernel_matches_float64_and_rows_are_bitwise_invariant(
    device: torch.device, dtype: torch.dtype, config: fp8_matmul.Fp8TileConfig
) -> None:
    # K = 300: two full activation groups and a tail of 44; N = 150: a partial column tile.
    x, wq, ws, b = _problem(37, 150, 300, dtype, seed=3)
    dev = [t.to(device) for t in (x, wq, ws, b)]
    full = fp8_matmul.linear_fp8(*dev, config=config)
    assert full.shape == (37, 150) and full.dtype == dtype
    assert rel_err(full, _float64(x, wq, ws, b)) < TOL[dtype]
    for start, rows in [(5, 1), (36, 1), (3, 7), (17, 20)]:
        part = fp8_matmul.linear_fp8(dev[0][start : start + rows], *dev[1:], config=config)
        assert torch.equal(part, full[start : start + rows]), (start, rows)


def test_channel_scaled_default_tiling_without_bias(device: torch.device) -> None:
    x, wq, ws, _ = _problem(70, 64, 256, torch.bfloat16, seed=4)
    xd, wqd, wsd = x.to(device), wq.to(device), ws.to(device)
    full = fp8_matmul.linear_fp8(xd, wqd, wsd)
    assert rel_err(full, _float64(x, wq, ws, None)) < TOL[torch.bfloat16]
    for i in (0, 65, 69):
        assert torch.equal(fp8_matmul.linear_fp8(xd[i : i + 1], wqd, wsd), full[i : i + 1])


def test_reference_linear_with_channel_scales_is_dequantise_then_matmul() -> None:
    x, wq, ws, b = _problem(9, 40, 200, torch.float32, seed=5)
    got = ops.linear_fp8(x.view(3, 3, 200), wq, ws, b)  # CPU tensors: the reference path
    assert rel_err(got.view(9, 40), _float64(x, wq, ws, b)) < TOL[torch.float32]
    assert torch.equal(ops.linear_fp8(x[4:5], wq, ws, b), got.view(9, 40)[4:5])


def test_launcher_rejects_a_channel_scale_of_the_wrong_length(device: torch.device) -> None:
    x, wq, ws, _ = (t.to(device) for t in _problem(4, 40, 200, torch.bfloat16, seed=6))
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


# Projection shapes of the benchmark models (dense-8b: Qwen3-8B; moe-16b's attention).
GPU_SHAPES = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (2048, 2048)]


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", GPU_SHAPES)
def test_gpu_channel_scaled_engine_shapes_match_float64_and_are_batch_invariant(n: int, k: int) -> None:
    x, wq, ws, _ = _problem(300, n, k, torch.bfloat16, seed=n + k)
    dev = [t.cuda() for t in (x, wq, ws)]
    full = fp8_matmul.linear_fp8(*dev)
    assert rel_err(full, _float64(x, wq, ws, None)) < TOL[torch.bfloat16]
    for start, rows in [(0, 1), (137, 1), (5, 64), (44, 256)]:
        assert torch.equal(
            fp8_matmul.linear_fp8(dev[0][start : start + rows], *dev[1:]), full[start : start + rows]
        )


@pytest.mark.gpu
def test_gpu_channel_scaled_moe16b_shape_matches_reference() -> None:
    args = _moe_problem(t=64, hidden=2048, inter=1408, experts=64, top_k=6, dtype=torch.bfloat16, seed=4)
    dev = [a.cuda() for a in args]
    out = fp8_moe.fused_moe_fp8(*dev)
    assert rel_err(out, reference_moe.moe_experts_fp8(*args)) < 4 * TOL[torch.bfloat16]
    assert torch.equal(fp8_moe.fused_moe_fp8(dev[0][7:8], dev[1][7:8], dev[2][7:8], *dev[3:]), out[7:8])
