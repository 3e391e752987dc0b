"""SiLU-and-multiply: the gated MLP's activation, x [..., 2I] = [gate | up] -> silu(gate) * up.

Elementwise, so trivially batch invariant. Rounding follows reference.silu_and_mul in low
precision dtypes: silu(gate) is rounded to the storage dtype before the product, as the
two-op PyTorch expression does, which keeps the kernel within one rounding of the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from shardinfer.kernels._common import FLOAT_DTYPES, check_same_device, check_tensor, fail

_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, sx, n_inter, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_inter
    gate = tl.load(x_ptr + row * sx + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * sx + n_inter + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    out = (act.to(tl.float32) * up.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * n_inter + cols, out, mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :I]) * x[..., I:].

    x: [..., 2I] float32/float16/bfloat16 whose rows can be addressed with one stride (a
    contiguous tensor, or a 2-D view with a row stride). Returns a contiguous [..., I] tensor.
    """
    check_tensor("x", x, dtypes=FLOAT_DTYPES, last_dim_contiguous=True)
    check_same_device(x=x)
    if x.dim() == 0 or x.shape[-1] % 2:
        raise fail("x.shape", tuple(x.shape), "need an even last dim ([gate | up])")
    n_inter = x.shape[-1] // 2
    if x.dim() == 2:
        rows, sx = x.shape[0], x.stride(0)
    elif x.is_contiguous():
        rows, sx = x.numel() // max(1, x.shape[-1]), x.shape[-1]
    else:
        raise fail("x", f"a {x.dim()}-D view with strides {tuple(x.stride())}",
                   "need a contiguous tensor or a 2-D view")
    out = torch.empty(*x.shape[:-1], n_inter, dtype=x.dtype, device=x.device)
    if rows == 0 or n_inter == 0:
        return out
    _silu_and_mul_kernel[(rows, triton.cdiv(n_inter, _BLOCK))](x, out, sx, n_inter, BLOCK=_BLOCK)
    return out
