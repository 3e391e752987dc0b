"""What a dense attention layer does between its QKV projection and the attention kernel, in one
launch: per-head RMSNorm of q and k (Qwen3's q_norm / k_norm; optional), rotate-half RoPE of q and
k at each token's position, and the store of k and v into the paged cache (bf16, or FP8 with one
power-of-two scale per 128 values as kv_store.py quantises). Unfused that is up to eight launches
per layer (two norms, two position gathers, two rotations, two stores), each a few microseconds of
a decode step; their sum is most of what the step spends outside the GEMMs and attention.

    qkv       [T, (Hq + 2 Hk) * D]  the projection's output, q heads then k heads then v heads
    positions [T] int               cos_table / sin_table [max_positions, D / 2] float32
    returns q [T, Hq, D] in qkv's dtype; k and v go to the cache at slot_mapping (-1: not stored)

Semantics: exactly the unfused ops in order (rmsnorm.rms_norm on each head, rope.rope_neox,
kv_store.store_kv / store_kv_fp8), each intermediate rounded to qkv's dtype where those ops round
it. The norm comes from rmsnorm's own row function at the launch width rms_norm uses for a head,
the rotation repeats rope.py's arithmetic on the two halves of the head, and the FP8 store uses
fp8_quant's rounding. One program per (token, head), so a token's bits never depend on the batch.
Head dims up to one 128-value scale group (a power of two); the engine fuses the sizes checked
on the GPU (FUSED_HEAD_DIMS) and runs others op by op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from shardinfer.kernels._common import FLOAT_DTYPES, check_same_device, check_tensor, fail
from shardinfer.kernels.fp8_quant import pow2_scale_bits, to_e4m3
from shardinfer.kernels.reference_fp8 import FP8_DTYPE, GROUP
from shardinfer.kernels.rmsnorm import _normed_row, _num_warps
from shardinfer.kernels.rope import rotate_pairs


@triton.jit
def _halves(y, HALF: tl.constexpr):
    """A head's row [2 * HALF] as its two halves (rotate-half's pairs are (i, i + HALF))."""
    pairs = tl.permute(tl.reshape(y, (2, HALF)), (1, 0))
    return tl.split(pairs)


@triton.jit
def _store_cache_row(
    cache_ptr, scale_ptr, slot, head, n_kv, first, second, half, FP8: tl.constexpr, HALF: tl.constexpr
):
    """One head's row (its halves, in the cache's entry dtype) at `slot`; an FP8 cache quantises the
    row as one group: the scale from the row's absolute maximum, then each value rounded."""
    base = (slot * n_kv + head) * (2 * HALF)
    if FP8:
        a = first.to(tl.float32)
        b = second.to(tl.float32)
        scale, inv = pow2_scale_bits(tl.maximum(tl.max(tl.abs(a), axis=0), tl.max(tl.abs(b), axis=0)))
        tl.store(cache_ptr + base + half, to_e4m3(a, inv).to(cache_ptr.dtype.element_ty))
        tl.store(cache_ptr + base + HALF + half, to_e4m3(b, inv).to(cache_ptr.dtype.element_ty))
        tl.store(scale_ptr + slot * n_kv + head, scale)
    else:
        tl.store(cache_ptr + base + half, first.to(cache_ptr.dtype.element_ty))
        tl.store(cache_ptr + base + HALF + half, second.to(cache_ptr.dtype.element_ty))


@triton.jit
def _qkv_prologue_kernel(
    qkv_ptr,
    q_ptr,
    qw_ptr,
    kw_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    slots_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    stride_t,
    stride_c,
    n_q,
    n_kv,
    head_dim,
    eps,
    NORM: tl.constexpr,
    FP8: tl.constexpr,
    HALF: tl.constexpr,
    HEADS: tl.constexpr,
):
    """Program (token, group of HEADS heads): the token's slot, position, cos and sin are loaded
    once for its heads, each head then done alone, as a program of one head would do it."""
    t = tl.program_id(0).to(tl.int64)
    half = tl.arange(0, HALF)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    c = tl.load(cos_ptr + pos * stride_c + half)
    s = tl.load(sin_ptr + pos * stride_c + half)
    for i in tl.static_range(HEADS):
        h = tl.program_id(1) * HEADS + i
        if h < n_q + n_kv:  # a q or k head: norm, rotate
            is_q = h < n_q
            head = tl.where(is_q, h, h - n_q)
            nb = tl.where(is_q, n_q, n_kv)
            src = qkv_ptr + tl.where(is_q, 0, n_q * 2 * HALF)
            w_ptr = tl.where(is_q, qw_ptr, kw_ptr)
            if NORM:
                # rms_norm's row function over the head as rms_norm's launch would see it (rows of
                # [T, heads, D] with strides (stride_t, D)), so the rounding is its own.
                y = _normed_row(
                    src,
                    src,
                    w_ptr,
                    src,
                    t * nb + head,
                    nb,
                    stride_t,
                    head_dim,
                    stride_t,
                    head_dim,
                    head_dim,
                    eps,
                    False,
                    2 * HALF,
                )
                x1, x2 = _halves(y, HALF)
            else:
                row = src + t * stride_t + head * (2 * HALF)
                x1 = tl.load(row + half)
                x2 = tl.load(row + HALF + half)
            # rope.py's arithmetic (its own function), rounded once to the activation dtype.
            f1, f2 = rotate_pairs(x1.to(tl.float32), x2.to(tl.float32), c, s)
            o1 = f1.to(qkv_ptr.dtype.element_ty)
            o2 = f2.to(qkv_ptr.dtype.element_ty)
            if is_q:
                out = q_ptr + (t * n_q + head) * (2 * HALF)
                tl.store(out + half, o1)
                tl.store(out + HALF + half, o2)
            elif slot >= 0:
                _store_cache_row(k_cache_ptr, k_scale_ptr, slot, head, n_kv, o1, o2, half, FP8, HALF)
        elif (h < n_q + 2 * n_kv) & (slot >= 0):  # a v head, stored as it is (none past the last)
            head = h - n_q - n_kv
            row = qkv_ptr + t * stride_t + (n_q + n_kv + head) * (2 * HALF)
            _store_cache_row(
                v_cache_ptr,
                v_scale_ptr,
                slot,
                head,
                n_kv,
                tl.load(row + half),
                tl.load(row + HALF + half),
                half,
                FP8,
                HALF,
            )


def takes(head_dim: int) -> bool:
    """Whether qkv_prologue can run heads of this size (a power of two within one scale group)."""
    return 2 <= head_dim <= GROUP and head_dim & (head_dim - 1) == 0


# Heads a program does, one after the other, sharing the token's position, cos and sin loads:
# fewer, longer programs than one a head. A launch setting: each head's arithmetic is its own
# either way. Four was the fastest of 1, 2, 4 and 8 at every shape timed (bench/kernels/NOTES.md,
# "Four heads a program in the attention prologue").
HEADS_PER_PROGRAM = 4

# Head sizes the engine fuses: those at which the compiled kernel was checked on the GPU to give
# the unfused ops' bits (the GPU test). At 32-value float32 heads the compiled norm summed in
# another order than rms_norm's launch (a few values one unit apart), so smaller heads, until
# checked, run op by op.
FUSED_HEAD_DIMS = (GROUP,)


def fusable(head_dim: int) -> bool:
    """Whether the engine runs a layer with these heads through qkv_prologue."""
    return head_dim in FUSED_HEAD_DIMS


def qkv_prologue(
    qkv: torch.Tensor,
    n_q: int,
    n_kv: int,
    head_dim: int,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    eps: float,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Norm (when q_norm and k_norm are given), rotate and store; returns q [T, n_q, head_dim].

    k_cache / v_cache: [num_blocks, block_size, n_kv, head_dim], bf16/fp16/fp32 or float8_e4m3fn
    with k_scale / v_scale [num_blocks, block_size, n_kv, 1] float32 (engine/kv_cache.py's layout).
    """
    check_tensor("qkv", qkv, dtypes=FLOAT_DTYPES, ndim=2, last_dim_contiguous=True)
    t = qkv.shape[0]
    if not takes(head_dim):
        raise fail("head_dim", head_dim, f"need a power of two up to {GROUP}; use the unfused ops")
    if qkv.shape[1] != (n_q + 2 * n_kv) * head_dim:
        raise fail(
            "qkv.shape", tuple(qkv.shape), f"need [T, {(n_q + 2 * n_kv) * head_dim}] = (n_q + 2 n_kv) heads"
        )
    if (q_norm is None) != (k_norm is None):
        raise fail("q_norm / k_norm", "one of them", "pass both head norms' weights or neither")
    for name, w in (("q_norm", q_norm), ("k_norm", k_norm)):
        if w is not None:
            check_tensor(name, w, dtypes=FLOAT_DTYPES, ndim=1, contiguous=True)
            if w.shape[0] != head_dim:
                raise fail(f"{name}.shape", tuple(w.shape), f"need ({head_dim},)")
    for name, table in (("cos_table", cos_table), ("sin_table", sin_table)):
        check_tensor(name, table, dtypes=(torch.float32,), ndim=2, last_dim_contiguous=True)
        if table.shape[1] != head_dim // 2:
            raise fail(f"{name}.shape", tuple(table.shape), f"need [max_positions, {head_dim // 2}]")
    if sin_table.stride() != cos_table.stride():
        raise fail(
            "sin_table",
            f"strides {tuple(sin_table.stride())}",
            f"need cos_table's {tuple(cos_table.stride())}",
        )
    fp8 = k_cache.dtype == FP8_DTYPE
    want = (n_kv, head_dim)
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, cache, dtypes=(*FLOAT_DTYPES, FP8_DTYPE), ndim=4, contiguous=True)
        if tuple(cache.shape[2:]) != want or cache.dtype != k_cache.dtype:
            raise fail(
                f"{name}",
                f"shape {tuple(cache.shape)} dtype {cache.dtype}",
                f"need [blocks, block_size, {n_kv}, {head_dim}] of one dtype for both caches",
            )
    if fp8:
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            if scale is None:
                raise fail(name, None, "an FP8 cache needs its scales")
            check_tensor(name, scale, dtypes=(torch.float32,), contiguous=True)
            if tuple(scale.shape) != (*k_cache.shape[:3], 1):
                raise fail(f"{name}.shape", tuple(scale.shape), f"need {(*k_cache.shape[:3], 1)}")
    for name, index in (("positions", positions), ("slot_mapping", slot_mapping)):
        check_tensor(name, index, dtypes=(torch.int32, torch.int64), ndim=1, contiguous=True)
        if index.shape[0] != t:
            raise fail(f"{name}.shape", tuple(index.shape), f"need ({t},), one per token")
    check_same_device(
        qkv=qkv,
        cos_table=cos_table,
        positions=positions,
        k_cache=k_cache,
        v_cache=v_cache,
        slot_mapping=slot_mapping,
    )
    q = torch.empty((t, n_q, head_dim), dtype=qkv.dtype, device=qkv.device)
    if t == 0:
        return q
    norm = q_norm is not None
    qw = q_norm if q_norm is not None else qkv
    kw = k_norm if k_norm is not None else qkv
    ks = k_scale if fp8 and k_scale is not None else qkv
    vs = v_scale if fp8 and v_scale is not None else qkv
    heads = HEADS_PER_PROGRAM
    _qkv_prologue_kernel[(t, triton.cdiv(n_q + 2 * n_kv, heads))](
        qkv,
        q,
        qw,
        kw,
        cos_table,
        sin_table,
        positions,
        slot_mapping,
        k_cache,
        v_cache,
        ks,
        vs,
        qkv.stride(0),
        cos_table.stride(0),
        n_q,
        n_kv,
        head_dim,
        float(eps),
        NORM=norm,
        FP8=fp8,
        HALF=head_dim // 2,
        HEADS=heads,
        num_warps=_num_warps(head_dim),
    )
    return q
