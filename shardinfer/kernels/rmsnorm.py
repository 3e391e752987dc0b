"""RMSNorm and fused add + RMSNorm.

One program normalises one row, reducing over the whole row in a single fixed-shape block:
no row is ever split across programs, so a row's result does not depend on how many rows
share the launch (batch invariance). Inputs may be 2-D views with a row stride or 3-D views
such as per-head slices of a fused QKV projection ([T, H, D] with strides (S, D, 1)), which is
how Qwen3's q/k norms see them; outputs are fresh contiguous tensors.

Semantics match reference.rms_norm / reference.fused_add_rms_norm: the sum x + residual is
rounded to x's dtype first (it is the next layer's residual), the norm is computed in float32
and the result is cast back to x's dtype.

The _fp8 variants serve a norm whose consumer is an FP8 linear: instead of the normalised rows
they write what fp8_quant.quantize_groups would make of them (codes and per-128-channel scales),
saving that launch and the round trip through memory. Same bits as the two launches: the row is
computed by the same code at the same block and warp count, rounded to x's dtype, then quantised
by fp8_quant's own step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from shardinfer.kernels._common import FLOAT_DTYPES, check_same_device, check_tensor, fail, next_pow2
from shardinfer.kernels.fp8_quant import quantize_tile
from shardinfer.kernels.reference_fp8 import FP8_DTYPE, GROUP


@triton.jit
def _normed_row(
    x_ptr,
    res_ptr,
    w_ptr,
    sum_ptr,
    row,
    nb,
    sxa,
    sxb,
    sra,
    srb,
    n_cols,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Row `row` normalised and rounded to x's dtype, over BLOCK lanes (those past n_cols hold 0).
    Both kernels below take their row from here, so the fused one's values are the plain one's."""
    a = row // nb
    b = row % nb
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + a * sxa + b * sxb + cols, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + a * sra + b * srb + cols, mask=mask, other=0.0)
        # Round the sum to the storage dtype: it is what the next layer adds to.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(sum_ptr + row * n_cols + cols, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n_cols
    inv = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return (w * (xf * inv)).to(x.dtype)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    sum_ptr,
    nb,
    sxa,
    sxb,
    sra,
    srb,
    n_cols,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    y = _normed_row(x_ptr, res_ptr, w_ptr, sum_ptr, row, nb, sxa, sxb, sra, srb, n_cols, eps, HAS_RES, BLOCK)
    cols = tl.arange(0, BLOCK)
    tl.store(out_ptr + row * n_cols + cols, y, mask=cols < n_cols)


@triton.jit
def _rms_norm_fp8_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    q_ptr,
    s_ptr,
    sum_ptr,
    nb,
    sxa,
    sxb,
    sra,
    srb,
    n_cols,
    n_groups,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
):
    """_rms_norm_kernel's row, quantised instead of stored: the row seen as a [BLOCK / GROUP_SIZE,
    GROUP_SIZE] tile, one 128-channel group per tile row (GROUP_SIZE = BLOCK when the whole row is
    shorter than a group), each quantised as fp8_quant.quantize_groups does."""
    row = tl.program_id(0)
    y = _normed_row(x_ptr, res_ptr, w_ptr, sum_ptr, row, nb, sxa, sxb, sra, srb, n_cols, eps, HAS_RES, BLOCK)
    g = tl.arange(0, BLOCK // GROUP_SIZE)
    cols = g[:, None] * GROUP_SIZE + tl.arange(0, GROUP_SIZE)[None, :]
    q, scale = quantize_tile(tl.reshape(y.to(tl.float32), (BLOCK // GROUP_SIZE, GROUP_SIZE)))
    tl.store(q_ptr + row * n_cols + cols, q.to(q_ptr.dtype.element_ty), mask=cols < n_cols)
    tl.store(s_ptr + row * n_groups + g, scale, mask=g < n_groups)


def _row_view(name: str, x: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """(tensor, rows per outer index, outer stride, inner stride) addressing x as rows of its last dim."""
    if x.dim() == 1:
        return x, 1, 0, 0
    if x.dim() == 2:
        return x, 1, x.stride(0), 0
    if x.dim() == 3:
        return x, x.shape[1], x.stride(0), x.stride(1)
    if not x.is_contiguous():
        raise fail(
            name,
            f"a {x.dim()}-D view with strides {tuple(x.stride())}",
            "need a contiguous tensor when it has more than 3 dims",
        )
    flat = x.view(-1, x.shape[-1])
    return flat, 1, flat.stride(0), 0


_Rows = tuple[torch.Tensor, int, int, int, torch.Tensor, int, int]


def _check(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float) -> _Rows:
    """Both launchers' checks; returns x's and residual's row views (_row_view)."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("weight", weight, dtypes=FLOAT_DTYPES, ndim=1, contiguous=True)
    n = x.shape[-1]
    if weight.shape[0] != n:
        raise fail("weight.shape", tuple(weight.shape), f"need ({n},) to match x's last dim")
    if residual is not None:
        check_tensor("residual", residual, dtypes=(x.dtype,), last_dim_contiguous=True)
        if residual.shape != x.shape:
            raise fail("residual.shape", tuple(residual.shape), f"need x's shape {tuple(x.shape)}")
    check_same_device(x=x, residual=residual, weight=weight)
    if not eps > 0:
        raise fail("eps", eps, "need eps > 0")
    xv, nb, sxa, sxb = _row_view("x", x)
    rv, sra, srb = xv, sxa, sxb
    if residual is not None:
        rv, _, sra, srb = _row_view("residual", residual)
    return xv, nb, sxa, sxb, rv, sra, srb


# A row of at most HEAD_ROW values (an attention head: Qwen3's q_norm / k_norm, and the fused
# prologue's norm, which must sum as this launch does) runs in HEAD_ROW_WARPS warps. One program
# a (token, head) is tens of thousands of programs a decode step; at four warps each thread held
# one value and every row crossed warps through shared memory, and the launch took several times
# its bytes' time (bench/kernels/NOTES.md, "Head norms in one warp"). The warp count decides the
# order of the row's sum, so it is fixed here, never chosen per batch.
HEAD_ROW = 128
HEAD_ROW_WARPS = 1


def _num_warps(n: int) -> int:
    """Warps a program for rows of n values (the launch setting every kernel here shares, so the
    fused kernels' rows sum in the plain kernel's order)."""
    if n <= HEAD_ROW:
        return HEAD_ROW_WARPS
    return 8 if n >= 4096 else 4


def _launch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    xv, nb, sxa, sxb, rv, sra, srb = _check(x, residual, weight, eps)
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    summed = torch.empty_like(out) if residual is not None else None
    rows = x.numel() // n if n else 0
    if rows == 0:
        return out, summed
    _rms_norm_kernel[(rows,)](
        xv,
        rv,
        weight,
        out,
        summed if summed is not None else out,
        nb,
        sxa,
        sxb,
        sra,
        srb,
        n,
        float(eps),
        HAS_RES=residual is not None,
        BLOCK=next_pow2(n),
        num_warps=_num_warps(n),
    )
    return out, summed


def _launch_fp8(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    xv, nb, sxa, sxb, rv, sra, srb = _check(x, residual, weight, eps)
    n = x.shape[-1]
    groups = triton.cdiv(n, GROUP)
    q = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    s = torch.empty(*x.shape[:-1], groups, dtype=torch.float32, device=x.device)
    summed = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else None
    rows = x.numel() // n if n else 0
    if rows == 0:
        return q, s, summed
    # The plain kernel's block and warps, so that the row's reduction is the same one.
    block = next_pow2(n)
    _rms_norm_fp8_kernel[(rows,)](
        xv,
        rv,
        weight,
        q,
        s,
        summed if summed is not None else xv,
        nb,
        sxa,
        sxb,
        sra,
        srb,
        n,
        groups,
        float(eps),
        HAS_RES=residual is not None,
        BLOCK=block,
        GROUP_SIZE=min(GROUP, block),
        num_warps=_num_warps(n),
    )
    return q, s, summed


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim.

    x: [..., N] float32/float16/bfloat16, last dim contiguous (1-3 dims may be strided views);
    weight: [N] any float dtype. Returns a contiguous tensor shaped and typed like x.
    """
    out, _ = _launch(x, None, weight, eps)
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one pass; residual=None means plain RMSNorm.

    x, residual: [..., N] of one float dtype and one shape; weight [N]. Both outputs are
    contiguous, shaped and typed like x.
    """
    if residual is None:
        return rms_norm(x, weight, eps), x
    out, summed = _launch(x, residual, weight, eps)
    assert summed is not None  # set whenever residual is given
    return out, summed


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """rms_norm(x) handed straight to an FP8 linear: fp8_quant.quantize_groups of the normalised
    rows (rounded to x's dtype first), bit for bit, without writing them.

    x, weight: as rms_norm. Returns (codes [..., N] float8_e4m3fn, scales [..., ceil(N/128)]
    float32), both contiguous.
    """
    q, s, _ = _launch_fp8(x, None, weight, eps)
    return q, s


def fused_add_rms_norm_fp8(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes, scales, x + residual): fused_add_rms_norm with its normalised output quantised as
    rms_norm_fp8 quantises it; the sum is written in x's dtype as there. residual=None means
    rms_norm_fp8, and the sum is x itself."""
    q, s, summed = _launch_fp8(x, residual, weight, eps)
    return q, s, summed if summed is not None else x
