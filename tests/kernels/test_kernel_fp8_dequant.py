"""e4m3 -> bfloat16 by bit placement (kernels/fp8_dequant.py) against float64 arithmetic.

Every finite e4m3 byte, positive and negative, normal and subnormal, times power-of-two scales
across float32's range, must come out as the exact product rounded once to bfloat16 (it is
representable, so the rounding is the identity): what the float32 route gives, bit for bit.
The placement itself (which bits go where) is checked on the CPU with integer arithmetic on all
256 bytes; the inline assembly only runs on a GPU.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from shardinfer.kernels import fp8_dequant

FP8 = torch.float8_e4m3fn
_NAN_BYTES = (0x7F, 0xFF)  # e4m3's NaNs: the quantising store never writes them from finite values


def _finite_bytes() -> torch.Tensor:
    return torch.tensor([b for b in range(256) if b not in _NAN_BYTES], dtype=torch.uint8)


def _e4m3_values64(raw: torch.Tensor) -> torch.Tensor:
    """The bytes' e4m3 values in float64, from their fields (independent of torch's float8 cast)."""
    b = raw.to(torch.int64)
    sign = torch.where(b >= 128, -1.0, 1.0).double()
    e, m = (b >> 3) & 0xF, (b & 0x7).double()
    normal = torch.ldexp(1.0 + m / 8.0, e - 7)
    subnormal = torch.ldexp(m / 8.0, torch.full_like(e, -6))
    return sign * torch.where(e > 0, normal, subnormal)


def test_e4m3_field_decoding_matches_torch() -> None:
    raw = _finite_bytes()
    assert torch.equal(_e4m3_values64(raw), raw.view(FP8).double())


def test_placed_bits_read_as_bfloat16_are_the_value_times_two_to_minus_120() -> None:
    """The halfword the assembly builds for each byte: sign at bit 15, exponent and mantissa at bits 4..10."""
    b = _finite_bytes().to(torch.int32)
    sign_byte = torch.where(b >= 128, 0xFF, 0x00)  # the permute's sign mode: the byte's top bit, replicated
    halfword = (sign_byte << 8) | b
    placed = (halfword << 4) & 0x87F0
    as_bf16 = placed.to(torch.int16).view(torch.bfloat16).double()
    assert torch.equal(as_bf16, torch.ldexp(_e4m3_values64(b), torch.tensor(-120)))


def test_split_scale_constants() -> None:
    assert fp8_dequant.MAX_BIT_PLACEMENT_SCALE == 128.0
    # The largest tile factor, 2^7 * 2^120, is bfloat16's largest power of two.
    assert torch.tensor(2.0**127, dtype=torch.bfloat16).isfinite()
    assert not torch.tensor(2.0**128).to(torch.bfloat16).isfinite()


@triton.jit
def _dequantise_rows(x_ptr, s_ptr, out_ptr, N: tl.constexpr, ROWS: tl.constexpr, ANY_SCALE: tl.constexpr):
    r = tl.arange(0, ROWS)
    c = tl.arange(0, N)
    x = tl.load(x_ptr + r[:, None] * N + c[None, :])
    s = tl.load(s_ptr + r)[:, None]
    if ANY_SCALE:  # noqa: SIM108 (a constexpr test: the other branch is never compiled)
        y = fp8_dequant.dequantise_bf16_any_scale(x, s)
    else:
        y = fp8_dequant.dequantise_bf16(x, s)
    tl.store(out_ptr + r[:, None] * N + c[None, :], y)


@pytest.mark.gpu
@pytest.mark.parametrize("any_scale", [False, True])
def test_dequantise_is_exact_for_every_byte_and_scale(any_scale: bool) -> None:
    exps = [-108, -60, -20, -1, 0, 3, 7] + ([8, 20, 100] if any_scale else [])
    rows = triton.next_power_of_2(len(exps))
    exps += [0] * (rows - len(exps))
    raw = torch.cat([_finite_bytes(), torch.zeros(2, dtype=torch.uint8)])  # 256 columns
    x = raw.repeat(rows, 1)
    scales = torch.tensor([2.0**e for e in exps], dtype=torch.float32)
    out = torch.empty(rows, 256, dtype=torch.bfloat16, device="cuda")
    _dequantise_rows[(1,)](x.view(FP8).cuda(), scales.cuda(), out, N=256, ROWS=rows, ANY_SCALE=any_scale)
    want = (_e4m3_values64(x) * scales.double()[:, None]).to(torch.bfloat16)
    assert torch.equal(want.double(), _e4m3_values64(x) * scales.double()[:, None])  # representable
    got = out.cpu()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))  # the same bits, zeros' signs included
