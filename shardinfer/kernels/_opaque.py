"""An identity the Triton compiler cannot see into, for tiles dequantised from FP8.

A dot operand computed from 8-bit loads is laid out for them (kWidth 4 where a 16-bit tile gets
2), which groups the MMA's products over k differently and so rounds differently from the same
values loaded as a 16-bit tile. Passing the dequantised tile through `opaque` gives it the 16-bit
tile's layout, so a kernel on an FP8 cache computes bit for bit what it computes on a cache holding
the dequantised values. Not for the interpreter, which runs no inline assembly.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def opaque(x):
    """x itself (16-bit floats through a non-pure register move; other dtypes unchanged)."""
    y = x
    if x.dtype.primitive_bitwidth == 16:
        bits = x.to(tl.int16, bitcast=True)
        bits = tl.inline_asm_elementwise(
            "mov.b16 $0, $1;", "=h,h", [bits], dtype=tl.int16, is_pure=False, pack=1
        )
        y = bits.to(x.dtype, bitcast=True)
    return y
