"""The MMA step every GEMM-shaped kernel here uses (matmul, heads_matmul, the fused MoE), and the
pointer-operand K loop that matmul and heads_matmul share.

Under Triton's CPU interpreter tl.dot is numpy's BLAS matmul, whose result for a row depends on
the row's position in the block (and which mishandles bfloat16); a broadcast product summed over
K in order is position-independent there, so the CPU tests can check batch invariance bit for
bit, as the GPU tests do. On a GPU it is tl.dot: "ieee" keeps float32 products exact (never
TF32); for half-precision operands the precision argument has no effect.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mma(a, b, acc, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """acc + a @ b for one BLOCK_K step, in float32."""
    if INTERPRET:
        acc = acc + tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    else:
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def k_loop(
    x_ptrs,
    w_ptrs,
    acc,
    kt_first,
    kt_last,
    K,
    EVEN_K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """acc + the [BLOCK_M, BLOCK_K] x tiles times the [BLOCK_K, BLOCK_N] weight.T tiles of K steps
    kt_first .. kt_last - 1, in order; the pointers address step kt_first. Rows and columns past
    the problem's edge must already point at valid memory (their results are dropped at the
    store), so only a K that is not a multiple of BLOCK_K masks its last step."""
    offs_k = tl.arange(0, BLOCK_K)
    for kt in range(kt_first, kt_last):
        if EVEN_K:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs)
        else:  # K is fixed per layer, so this tail mask is the same for every batch size
            k_left = K - kt * BLOCK_K
            a = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = mma(a, b, acc, PRECISION, INTERPRET)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    return acc
