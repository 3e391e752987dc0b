"""RMSNorm, fused add + RMSNorm, SiLU-and-mul and RoPE kernels against the PyTorch reference."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import TOL, rel_err

from shardinfer.kernels import activation, reference, rmsnorm, rope

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_reference(device: torch.device, dtype: torch.dtype) -> None:
    x = _randn(5, 48, dtype=dtype, seed=1) * 3
    w = _randn(48, dtype=torch.float32, seed=2)
    out = rmsnorm.rms_norm(x.to(device), w.to(device), 1e-6)
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_err(out, reference.rms_norm(x, w, 1e-6)) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_matches_reference(device: torch.device, dtype: torch.dtype) -> None:
    x, r = _randn(4, 40, dtype=dtype, seed=3), _randn(4, 40, dtype=dtype, seed=4)
    w = _randn(40, dtype=dtype, seed=5)
    out, summed = rmsnorm.fused_add_rms_norm(x.to(device), r.to(device), w.to(device), 1e-5)
    ref_out, ref_sum = reference.fused_add_rms_norm(x, r, w, 1e-5)
    if device.type == "cuda" or dtype != torch.bfloat16:
        assert torch.equal(summed.cpu(), ref_sum)  # one rounding of an exact sum: identical
    else:  # Triton's CPU interpreter truncates to bfloat16 instead of rounding
        assert rel_err(summed, ref_sum) < TOL[dtype]
    assert rel_err(out, ref_out) < TOL[dtype]


def test_rms_norm_on_strided_head_view(device: torch.device) -> None:
    """Qwen3's q-norm sees [T, H, D] slices of a fused projection."""
    qkv = _randn(3, 7 * 16, dtype=torch.float32, seed=6)
    q = qkv[:, : 4 * 16].view(3, 4, 16)
    w = _randn(16, dtype=torch.float32, seed=7)
    out = rmsnorm.rms_norm(qkv.to(device)[:, :64].view(3, 4, 16), w.to(device), 1e-6)
    assert rel_err(out, reference.rms_norm(q, w, 1e-6)) < TOL[torch.float32]


def test_rms_norm_rows_are_batch_invariant(device: torch.device) -> None:
    x = _randn(9, 64, dtype=torch.bfloat16, seed=8).to(device)
    w = _randn(64, dtype=torch.bfloat16, seed=9).to(device)
    full = rmsnorm.rms_norm(x, w, 1e-6)
    for i in (0, 4, 8):
        assert torch.equal(rmsnorm.rms_norm(x[i : i + 1], w, 1e-6), full[i : i + 1])


def test_rms_norm_rejects_bad_inputs(device: torch.device) -> None:
    x = torch.randn(2, 8, device=device)
    with pytest.raises(ValueError, match=r"weight.shape"):
        rmsnorm.rms_norm(x, torch.ones(7, device=device), 1e-6)
    with pytest.raises(ValueError, match=r"x.dtype"):
        rmsnorm.rms_norm(x.int(), torch.ones(8, device=device), 1e-6)
    with pytest.raises(ValueError, match=r"last dim contiguous"):
        rmsnorm.rms_norm(torch.randn(8, 2, device=device).t(), torch.ones(8, device=device), 1e-6)
    with pytest.raises(ValueError, match=r"residual.shape"):
        rmsnorm.fused_add_rms_norm(x, torch.randn(3, 8, device=device), torch.ones(8, device=device), 1e-6)
    with pytest.raises(ValueError, match=r"eps"):
        rmsnorm.rms_norm(x, torch.ones(8, device=device), 0.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_reference(device: torch.device, dtype: torch.dtype) -> None:
    x = _randn(2, 3, 2 * 40, dtype=dtype, seed=10) * 2
    out = activation.silu_and_mul(x.to(device))
    assert out.shape == (2, 3, 40)
    assert rel_err(out, reference.silu_and_mul(x)) < TOL[dtype]


def test_silu_and_mul_rejects_bad_inputs(device: torch.device) -> None:
    with pytest.raises(ValueError, match=r"even last dim"):
        activation.silu_and_mul(torch.randn(2, 5, device=device))
    with pytest.raises(ValueError, match=r"x.dtype"):
        activation.silu_and_mul(torch.zeros(2, 4, dtype=torch.int64, device=device))


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_matches_reference(device: torch.device, dtype: torch.dtype, interleaved: bool) -> None:
    t, h, d = 4, 3, 16
    x = _randn(t, h, d, dtype=dtype, seed=11)
    ang = torch.rand(t, d // 2, generator=torch.Generator().manual_seed(12)) * 6.0
    cos, sin = ang.cos(), ang.sin()
    fn = rope.rope_interleaved if interleaved else rope.rope_neox
    ref_fn = reference.rope_interleaved if interleaved else reference.rope_neox
    ref = ref_fn(x, cos, sin)
    out = fn(x.to(device), cos.to(device), sin.to(device))
    assert rel_err(out, ref) < TOL[dtype]
    inplace = x.to(device).clone()
    returned = fn(inplace, cos.to(device), sin.to(device), inplace=True)
    assert returned.data_ptr() == inplace.data_ptr()
    assert torch.equal(inplace, out)


def test_rope_on_strided_view(device: torch.device) -> None:
    """Rotating the first 8 dims of each 12-wide head in place leaves the other 4 untouched."""
    x = _randn(3, 2, 12, dtype=torch.float32, seed=13)
    ang = torch.rand(3, 4, generator=torch.Generator().manual_seed(14))
    xd = x.clone().to(device)
    rope.rope_neox(xd[..., :8], ang.cos().to(device), ang.sin().to(device), inplace=True)
    assert rel_err(xd[..., :8], reference.rope_neox(x[..., :8], ang.cos(), ang.sin())) < TOL[torch.float32]
    assert torch.equal(xd[..., 8:].cpu(), x[..., 8:])


def test_rope_rejects_bad_inputs(device: torch.device) -> None:
    x = torch.randn(2, 1, 8, device=device)
    cos = torch.ones(2, 4, device=device)
    with pytest.raises(ValueError, match=r"cos.shape"):
        rope.rope_neox(x, torch.ones(2, 3, device=device), cos)
    with pytest.raises(ValueError, match=r"cos.dtype"):
        rope.rope_neox(x, cos.half(), cos)
    with pytest.raises(ValueError, match=r"even rotary dim"):
        rope.rope_neox(
            torch.randn(2, 1, 7, device=device),
            torch.ones(2, 3, device=device),
            torch.ones(2, 3, device=device),
        )
    with pytest.raises(ValueError, match=r"x.dim"):
        rope.rope_neox(torch.randn(2, 8, device=device), cos, cos)


@pytest.mark.gpu
def test_elementwise_kernels_at_model_shapes() -> None:
    dev = torch.device("cuda")
    x = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(4096, device=dev, dtype=torch.bfloat16)
    out, summed = rmsnorm.fused_add_rms_norm(x, r, w, 1e-6)
    ref_out, ref_sum = reference.fused_add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(summed, ref_sum) and rel_err(out, ref_out) < TOL[torch.bfloat16]
    g = torch.randn(4096, 2 * 12288, device=dev, dtype=torch.bfloat16)
    assert rel_err(activation.silu_and_mul(g), reference.silu_and_mul(g)) < TOL[torch.bfloat16]
    q = torch.randn(4096, 32, 128, device=dev, dtype=torch.bfloat16)
    ang = torch.rand(4096, 64, device=dev) * 100
    assert (
        rel_err(rope.rope_neox(q, ang.cos(), ang.sin()), reference.rope_neox(q, ang.cos(), ang.sin()))
        < TOL[torch.bfloat16]
    )
    assert (
        rel_err(
            rope.rope_interleaved(q[..., :64], ang[:, :32].cos(), ang[:, :32].sin()),
            reference.rope_interleaved(q[..., :64], ang[:, :32].cos(), ang[:, :32].sin()),
        )
        < TOL[torch.bfloat16]
    )
