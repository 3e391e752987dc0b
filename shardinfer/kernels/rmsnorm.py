"""RMSNorm and fused add + RMSNorm.

One program normalises one row, reducing over the whole row in a single fixed-shape block:
no row is ever split across programs, so a row's result does not depend on how many rows
share the launch (batch invariance). Inputs may be 2-D views with a row stride or 3-D views
such as per-head slices of a fused QKV projection ([T, H, D] with strides (S, D, 1)), which is
how Qwen3's q/k norms see them; outputs are fresh contiguous tensors.

Semantics match reference.rms_norm / reference.fused_add_rms_norm: the sum x + residual is
rounded to x's dtype first (it is the next layer's residual), the norm is computed in float32
and the result is cast back to x's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from shardinfer.kernels._common import FLOAT_DTYPES, check_same_device, check_tensor, fail, next_pow2


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, nb, sxa, sxb, sra, srb, n_cols, eps,
                     HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
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
    tl.store(out_ptr + row * n_cols + cols, (w * (xf * inv)).to(out_ptr.dtype.element_ty), mask=mask)


def _row_view(name: str, x: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """(tensor, rows per outer index, outer stride, inner stride) addressing x as rows of its last dim."""
    if x.dim() == 1:
        return x, 1, 0, 0
    if x.dim() == 2:
        return x, 1, x.stride(0), 0
    if x.dim() == 3:
        return x, x.shape[1], x.stride(0), x.stride(1)
    if not x.is_contiguous():
        raise fail(name, f"a {x.dim()}-D view with strides {tuple(x.stride())}",
                   "need a contiguous tensor when it has more than 3 dims")
    flat = x.view(-1, x.shape[-1])
    return flat, 1, flat.stride(0), 0


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
            eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
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
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    summed = torch.empty_like(out) if residual is not None else None
    rows = x.numel() // n if n else 0
    if rows == 0:
        return out, summed
    _rms_norm_kernel[(rows,)](xv, rv, weight, out, summed if summed is not None else out, nb, sxa, sxb,
                              sra, srb, n, float(eps), HAS_RES=residual is not None,
                              BLOCK=next_pow2(n), num_warps=8 if n >= 4096 else 4)
    return out, summed


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim.

    x: [..., N] float32/float16/bfloat16, last dim contiguous (1-3 dims may be strided views);
    weight: [N] any float dtype. Returns a contiguous tensor shaped and typed like x.
    """
    out, _ = _launch(x, None, weight, eps)
    return out


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one pass; residual=None means plain RMSNorm.

    x, residual: [..., N] of one float dtype and one shape; weight [N]. Both outputs are
    contiguous, shaped and typed like x.
    """
    if residual is None:
        return rms_norm(x, weight, eps), x
    out, summed = _launch(x, residual, weight, eps)
    assert summed is not None  # set whenever residual is given
    return out, summed
