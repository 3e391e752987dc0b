"""Per-token-group FP8 quantisation of activations: x [M, K] -> fp8 [M, K] + scales [M, ceil(K/128)].

Semantics = reference_fp8.quantize_groups (bit for bit under the interpreter; the tests check both
against float64 rounding): each group of 128 channels of a row gets
the power-of-two scale 2^p with amax / 2^p <= 448, taken from amax's exponent bits (no division,
so no rounding), and its values are rounded to e4m3 in float32 arithmetic before the final cast.
Rounding first makes the cast exact, which matters twice: Triton's CPU interpreter rounds a
float32 -> e4m3 cast wrongly when the mantissa carries into the exponent, and an exact cast is the
same on every backend. Each program takes some groups of one row: a row's bits never depend on M.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from shardinfer.kernels._common import FLOAT_DTYPES, check_same_device, check_tensor, fail
from shardinfer.kernels.reference_fp8 import FP8_DTYPE, GROUP


@triton.jit
def pow2_scale_bits(amax):
    """(scale, 1 / scale) for the smallest power of two scale with amax / scale <= 448 (float32)."""
    a = tl.maximum(amax, 7.888609052210118e-31)  # 2^-100, reference_fp8.MIN_AMAX
    bits = a.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    mant = bits & 0x7FFFFF
    # 448 = 1.75 * 2^8: mantissas above 1.75 need one more binade.
    p = tl.where(mant > 0x600000, e - 7, e - 8)
    scale = ((p + 127) << 23).to(tl.float32, bitcast=True)
    inv = ((127 - p) << 23).to(tl.float32, bitcast=True)
    return scale, inv


@triton.jit
def round_to_e4m3(v):
    """v (float32, |v| <= 448) rounded to the nearest e4m3 value (ties to even), still float32.

    Normal range (|v| >= 2^-6): keep 3 mantissa bits by integer rounding of the float32 bits (a
    carry into the exponent is the right answer). Subnormal range: a multiple of 2^-9, rounded by
    the add-and-subtract of 2^23 (float32 addition rounds to nearest even).
    """
    mag = tl.abs(v)
    bits = mag.to(tl.int32, bitcast=True)
    lsb = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + lsb) & -1048576).to(tl.float32, bitcast=True)  # -1048576 = ~0xFFFFF
    scaled = mag * 512.0
    sub = ((scaled + 8388608.0) - 8388608.0) * 0.001953125  # 2^23, 2^-9
    r = tl.where(mag < 0.015625, sub, normal)  # 2^-6
    return tl.where(v < 0, -r, r)


@triton.jit
def to_e4m3(v, inv):
    """v times its group's 1 / scale, clamped to e4m3's range and rounded (float32): the one rounding
    of every quantiser here and in the kernels that quantise their own output."""
    return round_to_e4m3(tl.minimum(tl.maximum(v * inv, -448.0), 448.0))


@triton.jit
def quantize_tile(x):
    """x [G, S] float32, one group per row (padding lanes 0) -> (e4m3 values [G, S] still float32,
    scales [G]). The one quantisation step of this module, shared by the kernels that quantise an
    activation they have just computed (rmsnorm.py, activation.py), so theirs is this one's."""
    scale, inv = pow2_scale_bits(tl.max(tl.abs(x), axis=1))
    q = to_e4m3(x, inv[:, None])
    return q, scale


# Groups per program: a decode batch's activations are a few hundred rows of a few thousand
# channels, and one 128-value group per program made the launch, not the bytes, the cost.
GROUPS_PER_PROGRAM = 8


@triton.jit(do_not_specialize=["M"])
def _quant_groups_kernel(
    x_ptr, q_ptr, s_ptr, M, K, stride_xm, num_groups, GROUP_SIZE: tl.constexpr, GROUPS: tl.constexpr
):
    """One row's GROUPS consecutive groups per program, as a [GROUPS, GROUP_SIZE] tile: each
    group's max and rounding are its own, so the tile shape changes no bits."""
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    cols = g[:, None] * GROUP_SIZE + tl.arange(0, GROUP_SIZE)[None, :]
    mask = cols < K
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    q, scale = quantize_tile(x)
    tl.store(q_ptr + row * K + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * num_groups + g, scale, mask=g < num_groups)


def quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float (last dim contiguous) -> (fp8 [M, K] contiguous, scales [M, ceil(K/128)] float32)."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES, ndim=2, last_dim_contiguous=True)
    check_same_device(x=x)
    m, k = x.shape
    if x.stride(0) < 0:
        raise fail("x", f"row stride {x.stride(0)}", "need non-negative strides (call .contiguous())")
    groups = triton.cdiv(k, GROUP)
    q = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    s = torch.empty((m, groups), dtype=torch.float32, device=x.device)
    if m and k:
        stride = x.stride(0) if m > 1 else k
        per = min(GROUPS_PER_PROGRAM, triton.next_power_of_2(groups))
        _quant_groups_kernel[(m, triton.cdiv(groups, per))](
            x, q, s, m, k, stride, groups, GROUP_SIZE=GROUP, GROUPS=per, num_warps=4 if per >= 4 else 1
        )
    return q, s
