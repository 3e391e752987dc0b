"""Rotary position embedding, rotate-half (GPT-NeoX, Llama, Qwen) and interleaved-pair (DeepSeek).

cos/sin are gathered per token by the caller ([T, D_rot / 2], float32, one row per token's
absolute position), so the kernel never sees positions and a token's rotation does not depend
on its batch. One program rotates BLOCK_H heads of one token; the math runs in float32 and is
rounded once to x's dtype, as reference.rope_neox / reference.rope_interleaved do.

    neox:        pairs (x[i], x[i + D/2])     interleaved: pairs (x[2i], x[2i + 1])
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from shardinfer.kernels._common import FLOAT_DTYPES, check_same_device, check_tensor, fail, next_pow2


@triton.jit
def rotate_pairs(x1, x2, c, s):
    """(x1 c - x2 s, x2 c + x1 s) in float32, each as one explicit fused multiply-add on a rounded
    product. Written out so that no compiler choice decides which product stays unrounded: left to
    contraction, two kernels with this same expression rounded some values differently on the
    GPU, and qkv_prologue.py must give this kernel's bits."""
    return tl.fma(x1, c, -(x2 * s)), tl.fma(x2, c, x1 * s)


@triton.jit
def _rope_kernel(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    n_heads,
    sxt,
    sxh,
    sot,
    soh,
    sct,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr,
):
    t = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_HALF)
    imask = i < HALF
    c = tl.load(cos_ptr + t * sct + i, mask=imask, other=0.0)[None, :]
    s = tl.load(sin_ptr + t * sct + i, mask=imask, other=0.0)[None, :]
    if INTERLEAVED:
        first = 2 * i
        second = 2 * i + 1
    else:
        first = i
        second = i + HALF
    mask = (heads < n_heads)[:, None] & imask[None, :]
    xrow = x_ptr + t * sxt + heads[:, None] * sxh
    x1 = tl.load(xrow + first[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(xrow + second[None, :], mask=mask, other=0.0).to(tl.float32)
    o1, o2 = rotate_pairs(x1, x2, c, s)
    orow = out_ptr + t * sot + heads[:, None] * soh
    tl.store(orow + first[None, :], o1.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(orow + second[None, :], o2.to(out_ptr.dtype.element_ty), mask=mask)


def _rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, inplace: bool
) -> torch.Tensor:
    check_tensor("x", x, dtypes=FLOAT_DTYPES, ndim=3, last_dim_contiguous=True)
    check_tensor("cos", cos, dtypes=(torch.float32,), ndim=2, last_dim_contiguous=True)
    check_tensor("sin", sin, dtypes=(torch.float32,), ndim=2, last_dim_contiguous=True)
    t, h, d = x.shape
    if d % 2:
        raise fail("x.shape[-1]", d, "need an even rotary dim")
    if tuple(cos.shape) != (t, d // 2):
        raise fail("cos.shape", tuple(cos.shape), f"need (T, D_rot // 2) = {(t, d // 2)}")
    if sin.shape != cos.shape or sin.stride() != cos.stride():
        raise fail(
            "sin",
            f"shape {tuple(sin.shape)} strides {tuple(sin.stride())}",
            f"need cos's shape {tuple(cos.shape)} and strides {tuple(cos.stride())}",
        )
    check_same_device(x=x, cos=cos, sin=sin)
    out = x if inplace else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if t == 0 or h == 0 or d == 0:
        return out
    block_h = min(16, next_pow2(h))
    grid = (t, triton.cdiv(h, block_h))
    _rope_kernel[grid](
        x,
        out,
        cos,
        sin,
        h,
        x.stride(0),
        x.stride(1),
        out.stride(0),
        out.stride(1),
        cos.stride(0),
        HALF=d // 2,
        BLOCK_H=block_h,
        BLOCK_HALF=next_pow2(d // 2),
        INTERLEAVED=interleaved,
    )
    return out


def rope_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """Rotate-half RoPE.

    x: [T, H, D_rot] float32/float16/bfloat16, last dim contiguous (a per-head view of a fused
    projection is fine); cos, sin: [T, D_rot // 2] float32. With inplace=True x is overwritten
    and returned; otherwise a new contiguous tensor is returned.
    """
    return _rope(x, cos, sin, interleaved=False, inplace=inplace)


def rope_interleaved(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inplace: bool = False
) -> torch.Tensor:
    """Interleaved-pair RoPE (DeepSeek). Shapes and dtypes as rope_neox."""
    return _rope(x, cos, sin, interleaved=True, inplace=inplace)
