"""Exact e4m3 -> bfloat16 dequantisation by bit placement, for the attention kernels' FP8 caches.

An e4m3 byte s.eeee.mmm whose exponent bits go to the low end of bfloat16's 8-bit exponent field
and whose mantissa bits go to the top of bfloat16's mantissa is the bfloat16 of the same value
times 2^-120 (e4m3's exponent bias is 7, bfloat16's 127; e4m3's subnormals land on bfloat16's,
which keep the same relation). One paired bfloat16 multiply by scale * 2^120 then gives value *
scale exactly: with a power-of-two scale the product is a 3-bit mantissa times a power of two,
which bfloat16 holds whenever float32 does. That is what the float32 route computes (e4m3 ->
float16 -> float32, multiply, round to bfloat16), so the bits are the same, in two instructions a
value where that route takes three (the attention kernels' decode loops wait on them:
bench/kernels/NOTES.md, "Dequantising by bit placement").

The factor scale * 2^120 is a finite bfloat16 only for scales up to 2^7, i.e. 128-value groups
whose largest magnitude is at most 448 * 2^7 = 57344. `split_scale` cuts a scale into that part
and the rest (1 for every smaller group), which a caller applies elsewhere, exactly: paged
attention on the scores' and probabilities' columns, `dequantise_bf16_any_scale` as a second
multiply. e4m3's two NaN bytes do not come out as NaN (the quantising store never writes them
from finite values). Not for the interpreter, which runs no inline assembly.
"""

from __future__ import annotations

import triton
import triton.language as tl

# The attention launchers' fp8_dequant choices: by bit placement (here), or the float32 route.
FP8_DEQUANT_MODES = ("bits", "float32")
# Largest scale whose factor scale * 2^120 is a finite bfloat16.
MAX_BIT_PLACEMENT_SCALE = tl.constexpr(128.0)
_BIAS_FACTOR = tl.constexpr(2.0**120)  # 2^(bfloat16's exponent bias minus e4m3's)

# Per 4 packed bytes b0..b3: byte-permute each pair into two halfwords (sign byte, byte), shift the
# exponent and mantissa into bfloat16's places, keep sign | exponent | mantissa, then multiply each
# pair by its factors (an fma with -0 is an exact multiply that keeps the sign of a zero). $0, $1:
# the 4 results; $2: the 4 bytes; $3, $4: the 4 factors; $5, $6 (second form): 4 more factors.
_PLACE = """.reg .b32 t0, t1, nz;
mov.b32 nz, 0x80008000;
prmt.b32 t0, $2, 0, 0x9180;
prmt.b32 t1, $2, 0, 0xB3A2;
shl.b32 t0, t0, 4;
shl.b32 t1, t1, 4;
and.b32 t0, t0, 0x87F087F0;
and.b32 t1, t1, 0x87F087F0;
"""
_PLACE_AND_SCALE = tl.constexpr("{\n" + _PLACE + """fma.rn.bf16x2 $0, t0, $3, nz;
fma.rn.bf16x2 $1, t1, $4, nz;
}""")
_PLACE_AND_SCALE_TWICE = tl.constexpr("{\n" + _PLACE + """fma.rn.bf16x2 t0, t0, $3, nz;
fma.rn.bf16x2 t1, t1, $4, nz;
fma.rn.bf16x2 $0, t0, $5, nz;
fma.rn.bf16x2 $1, t1, $6, nz;
}""")


@triton.jit
def split_scale(scale):
    """(the part of each power-of-two scale up to 2^7, the rest): their product is the scale, exactly.
    The rest is 1 unless the scale's group held a value beyond 57344."""
    on_tile = tl.minimum(scale, MAX_BIT_PLACEMENT_SCALE)
    return on_tile, tl.maximum(scale * (1.0 / MAX_BIT_PLACEMENT_SCALE), 1.0)


@triton.jit
def dequantise_bf16(x, scale):
    """x (a float8e4nv tile) times scale (float32 powers of two of at most 2^7, broadcastable to x),
    as bfloat16, exactly."""
    factor = tl.broadcast_to((scale * _BIAS_FACTOR).to(tl.bfloat16), x.shape)
    bits = x.to(tl.uint8, bitcast=True)
    return tl.inline_asm_elementwise(_PLACE_AND_SCALE, "=r,=r,r,r,r", [bits, factor], dtype=tl.bfloat16,
                                     is_pure=True, pack=4)


@triton.jit
def dequantise_bf16_any_scale(x, scale):
    """dequantise_bf16 for any power-of-two scale: the part above 2^7 is a second exact multiply
    (by 1 unless the group held a value beyond 57344), for tiles whose scales cannot go elsewhere."""
    on_tile, rest = split_scale(scale)
    factor = tl.broadcast_to((on_tile * _BIAS_FACTOR).to(tl.bfloat16), x.shape)
    rest = tl.broadcast_to(rest.to(tl.bfloat16), x.shape)
    bits = x.to(tl.uint8, bitcast=True)
    return tl.inline_asm_elementwise(_PLACE_AND_SCALE_TWICE, "=r,=r,r,r,r,r,r", [bits, factor, rest],
                                     dtype=tl.bfloat16, is_pure=True, pack=4)
