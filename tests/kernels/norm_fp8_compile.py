"""Compile the plain and the FP8-quantising RMSNorm kernels for Hopper (sm_90) on a machine without a
GPU and print, as JSON lines, the layout in which each reduces its row's sum of squares.

The fused kernel's bits equal the plain kernel's only if that float32 sum is taken in the same
order, and the order follows the layout of the reduced tensor (what each thread sums on its own,
then across lanes and warps). The fused kernel reshapes the normalised row into 128-channel groups
afterwards; were the compiler to carry that tile's layout back to the load, the sum would change
order on the GPU while the interpreter (which has no layouts) still agreed. Run as a script with
TRITON_INTERPRET unset; hopper_compile.py's stand-in driver answers the compiler's questions and
nothing runs.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

import torch
from hopper_compile import _compile_only

from shardinfer.kernels import rmsnorm

# A 1-D row reduced to one float32: the sum of squares (the group maxima reduce 2-D tiles).
_ROW_SUM = re.compile(r"\}\) : \(tensor<\d+xf32, (#\w+)>\) -> f32")


def _sum_layouts(kernel: Any) -> list[str]:
    out = []
    for caches in kernel.device_caches.values():
        for compiled in caches[0].values():
            ir = compiled.asm["ttgir"]
            for name in _ROW_SUM.findall(ir):
                out.append(re.search(rf"^{name} = (.*)$", ir, re.M).group(1))  # type: ignore[union-attr]
    return out


def main() -> None:
    _compile_only()
    rmsnorm.check_same_device = lambda **tensors: torch.device("cpu")  # type: ignore[assignment]
    # Widths below one group, with a tail, at 4 and 8 warps, and a block past the width.
    for n, residual in ((48, True), (200, True), (2048, True), (4096, True), (4096, False), (5120, True)):
        x, w = torch.randn(2, n, dtype=torch.bfloat16), torch.randn(n, dtype=torch.bfloat16)
        r = torch.randn(2, n, dtype=torch.bfloat16) if residual else None
        launches = (
            (
                "plain",
                rmsnorm._rms_norm_kernel,
                lambda x=x, r=r, w=w: rmsnorm.fused_add_rms_norm(x, r, w, 1e-6),
            ),
            (
                "fp8",
                rmsnorm._rms_norm_fp8_kernel,
                lambda x=x, r=r, w=w: rmsnorm.fused_add_rms_norm_fp8(x, r, w, 1e-6),
            ),
        )
        for name, kernel, launch in launches:
            for caches in kernel.device_caches.values():
                caches[0].clear()
            with contextlib.suppress(AttributeError, RuntimeError):
                launch()  # the stand-in driver cannot launch: the compiled kernel is cached by then
            print(
                json.dumps(
                    {"kernel": name, "n": n, "residual": residual, "sum_layouts": _sum_layouts(kernel)}
                )
            )


if __name__ == "__main__":
    main()
