"""SiLU-and-multiply: the gated MLP's activation, x [..., 2I] = [gate | up] -> silu(gate) * up.

Elementwise, so trivially batch invariant. Rounding follows reference.silu_and_mul in low
precision dtypes: silu(gate) is rounded to the storage dtype before the product, as the
two-op PyTorch expression does, which keeps the kernel within one rounding of the reference.

silu_and_mul_fp8 serves an FP8 down projection: it writes what fp8_quant.quantize_groups would
make of silu_and_mul's output (codes and per-128-channel scales) instead of the output itself.
The values come from the same function and are quantised by fp8_quant's own step, so they carry
the bits of the two launches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from shardinfer.kernels._common import FLOAT_DTYPES, check_same_device, check_tensor, fail
from shardinfer.kernels.fp8_quant import GROUPS_PER_PROGRAM, quantize_tile
from shardinfer.kernels.reference_fp8 import FP8_DTYPE, GROUP

_BLOCK = 1024


@triton.jit
def _silu_mul(gate, up):
    """silu(gate) * up in gate's dtype, silu rounded to it first (module docstring)."""
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    return (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, sx, n_inter, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_inter
    gate = tl.load(x_ptr + row * sx + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * sx + n_inter + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * n_inter + cols, _silu_mul(gate, up), mask=mask)


@triton.jit
def _silu_and_mul_fp8_kernel(
    x_ptr, q_ptr, s_ptr, sx, n_inter, n_groups, GROUP_SIZE: tl.constexpr, GROUPS: tl.constexpr
):
    """GROUPS consecutive 128-channel groups of one row per program, as fp8_quant's kernel takes
    them: a [GROUPS, GROUP_SIZE] tile whose padding lanes compute silu(0) * 0 = 0."""
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    cols = g[:, None] * GROUP_SIZE + tl.arange(0, GROUP_SIZE)[None, :]
    mask = cols < n_inter
    gate = tl.load(x_ptr + row * sx + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * sx + n_inter + cols, mask=mask, other=0.0)
    q, scale = quantize_tile(_silu_mul(gate, up).to(tl.float32))
    tl.store(q_ptr + row * n_inter + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * n_groups + g, scale, mask=g < n_groups)


def _rows(x: torch.Tensor) -> tuple[int, int, int]:
    """Both launchers' checks; returns (rows, row stride, I)."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES, last_dim_contiguous=True)
    check_same_device(x=x)
    if x.dim() == 0 or x.shape[-1] % 2:
        raise fail("x.shape", tuple(x.shape), "need an even last dim ([gate | up])")
    n_inter = x.shape[-1] // 2
    if x.dim() == 2:
        return x.shape[0], x.stride(0), n_inter
    if x.is_contiguous():
        return x.numel() // max(1, x.shape[-1]), x.shape[-1], n_inter
    raise fail(
        "x", f"a {x.dim()}-D view with strides {tuple(x.stride())}", "need a contiguous tensor or a 2-D view"
    )


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :I]) * x[..., I:].

    x: [..., 2I] float32/float16/bfloat16 whose rows can be addressed with one stride (a
    contiguous tensor, or a 2-D view with a row stride). Returns a contiguous [..., I] tensor.
    """
    rows, sx, n_inter = _rows(x)
    out = torch.empty(*x.shape[:-1], n_inter, dtype=x.dtype, device=x.device)
    if rows == 0 or n_inter == 0:
        return out
    _silu_and_mul_kernel[(rows, triton.cdiv(n_inter, _BLOCK))](x, out, sx, n_inter, BLOCK=_BLOCK)
    return out


def silu_and_mul_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8_quant.quantize_groups(silu_and_mul(x)), bit for bit, in one launch.

    x: as silu_and_mul. Returns (codes [..., I] float8_e4m3fn, scales [..., ceil(I/128)] float32),
    both contiguous.
    """
    rows, sx, n_inter = _rows(x)
    groups = triton.cdiv(n_inter, GROUP)
    q = torch.empty(*x.shape[:-1], n_inter, dtype=FP8_DTYPE, device=x.device)
    s = torch.empty(*x.shape[:-1], groups, dtype=torch.float32, device=x.device)
    if rows == 0 or n_inter == 0:
        return q, s
    per = min(GROUPS_PER_PROGRAM, triton.next_power_of_2(groups))
    _silu_and_mul_fp8_kernel[(rows, triton.cdiv(groups, per))](
        x, q, s, sx, n_inter, groups, GROUP_SIZE=GROUP, GROUPS=per, num_warps=4 if per >= 4 else 1
    )
    return q, s
