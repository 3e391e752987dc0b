"""Attention of generated tokens over an FP8 paged cache with the raw keys in FP8 tensor-core
products, transposed (an alternative to paged_attention_fma for wider GQA groups; off by default:
`paged_attention.WGMMA_GENERATED_ROWS`, and bench/kernels/NOTES.md, "A lead: the keys straight into
FP8 warpgroup MMAs, products transposed").

Where it runs: the same rows as paged_attention_fma (every query row at a position at or after its
request's prompt length), chosen by the same fixed function of the request and the position, so a
row's bits never depend on its batch. Applies to an FP8 cache with one scale per key, head dim
128, GROUPS query heads per KV head, 16-bit queries, no sliding window, on a GPU with FP8 tensor
cores (compute capability 8.9 and up) or in the interpreter.

The chunk kernel converts every key and value to 16 bits for 16-row products, of which a GQA group
of four fills four rows. Here one program computes a query token's group over its whole context,
per 128-key tile:

- the group's queries are written once a row as the sum of two e4m3 terms, each with one
  power-of-two scale a head (the second holds what the first rounded away: about a 16-bit value's
  precision), so the scores need no 16-bit key;
- scores^T [keys, heads] = K x Q_term^T for each term: the key tile is the product's rows, read as
  stored (e4m3), and the group's heads its columns, padded to eight (the narrowest warpgroup
  product); the terms' scales, the key's scale and the softmax's scale multiply the scores after
  (powers of two but the softmax's);
- out^T [128, heads] = V^T x P^T: the value tile converted to the queries' dtype (exact), its
  per-key scale folded into the probabilities before they are rounded to that dtype.

The key tile fixes the order of the online softmax's updates, so it is a constant (BLOCK_N), never
chosen per batch. Slices of a request's rows and the one-row programs of a decode step are
paged_attention_fma's (its docstring), for the same reasons.

In the interpreter (CPU tests) the value product runs in float32 on the same rounded operands,
because the interpreter's 16-bit `tl.dot` is unreliable; the interpreter also rounds e4m3
subnormals toward zero where the GPU rounds to nearest, so its query terms can differ in their
smallest elements. Both stay within the bound the tests check; the bits are the GPU's only there.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from shardinfer.kernels._common import interpreting
from shardinfer.kernels.reference_fp8 import FP8_DTYPE

_LOG2E = 1.4426950408889634
HEAD_DIM = 128
GROUPS = (4,)  # query heads per KV head this kernel serves
BLOCK_N = 128  # keys a tile (fixed: it fixes the rounding)
WARPS = 4  # one warpgroup
MAX_SLICES = 8  # at most this many programs per request and KV head (paged_attention_fma's)
ONE_ROW_PROGRAMS = True


def may_apply(head_dim: int, num_heads: int, num_kv_heads: int) -> bool:
    """Whether a model of this attention shape can have rows for this kernel (on an FP8 cache)."""
    return (
        head_dim == HEAD_DIM
        and num_kv_heads > 0
        and num_heads % num_kv_heads == 0
        and num_heads // num_kv_heads in GROUPS
    )


@functools.cache
def _has_fp8_products(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (8, 9)


def applies(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor | None,
    sliding_window: int | None,
) -> bool:
    """Whether generated rows of this attention go through this kernel (see the module docstring)."""
    return (
        k_scale is not None
        and k_cache.dtype == FP8_DTYPE
        and v_cache.dtype == FP8_DTYPE
        and q.dtype in (torch.bfloat16, torch.float16)
        and sliding_window is None
        and may_apply(q.shape[-1], q.shape[1], k_cache.shape[2])
        and k_cache.shape[-1] == HEAD_DIM
        and v_cache.shape[-1] == HEAD_DIM
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
        and (interpreting() or (q.is_cuda and _has_fp8_products(q.device)))
    )


@triton.jit
def _e4m3_term(x):
    """x [G, D] float32 as e4m3 values times one power-of-two scale a row, the smallest that keeps
    the row's largest magnitude within e4m3's 448 = 1.75 * 2^8: returns (values, scales [G]). The
    scale comes from the exponent and mantissa bits of that magnitude, so it is exact."""
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), 2.0**-100)
    bits = amax.to(tl.int32, bitcast=True)
    exponent = (bits >> 23) - 127
    # amax = m * 2^e with m in [1, 2): 2^(e - 8) keeps it within 448 when m <= 1.75, else 2^(e - 7).
    s = exponent - 8 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    scale = ((s + 127) << 23).to(tl.float32, bitcast=True)
    inverse = ((127 - s) << 23).to(tl.float32, bitcast=True)
    return (x * inverse[:, None]).to(tl.float8e4nv), scale


@triton.jit(do_not_specialize=["sbt", "n_slices"])
def _generated_rows_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    bt_ptr,
    qsl_ptr,
    sl_ptr,
    pl_ptr,
    out_ptr,
    sqt,
    sqh,
    sot,
    soh,
    sbt,
    n_slices,
    scale_log2,
    HK: tl.constexpr,
    GROUP: tl.constexpr,
    GPAD: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ONE_ROW: tl.constexpr,
    F32_PRODUCT: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    ctx0 = tl.load(sl_ptr + seq) - q_len  # keys before this step's first token
    first = tl.maximum(tl.load(pl_ptr + seq) - ctx0, 0)  # the first generated token of the step
    g = tl.arange(0, GPAD)
    g_ok = g < GROUP
    heads = kvh * GROUP + g
    d = tl.arange(0, D)
    bt_row = bt_ptr + seq.to(tl.int64) * sbt
    if ONE_ROW:  # constant bounds: the compiler drops the loop (paged_attention_fma's ONE_ROW_PROGRAMS)
        lo, hi, step = 0, 1, 1
    else:
        lo, hi, step = first + tl.program_id(2), q_len, n_slices
    for j in range(lo, hi, step):
        t = (q_start + j).to(tl.int64)
        live = j >= first  # a prompt row (ONE_ROW only) computes nothing and stores nothing
        ctx = (ctx0 + j + 1) * live.to(tl.int32)  # keys 0 .. the token's own position
        q = tl.load(q_ptr + t * sqt + heads[:, None] * sqh + d[None, :], mask=g_ok[:, None], other=0.0)
        q = q.to(tl.float32)
        q0, qs0 = _e4m3_term(q)
        q1, qs1 = _e4m3_term(q - q0.to(tl.float32) * qs0[:, None])  # what the first term rounded away
        m_i = tl.full([GPAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GPAD], tl.float32)
        acc = tl.zeros([D, GPAD], tl.float32)
        for start in range(0, ctx, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            n_ok = n < ctx
            page = tl.load(bt_row + n // PAGE, mask=n_ok, other=0).to(tl.int64)
            row = (page * PAGE + n % PAGE) * HK + kvh  # [BLOCK_N]: the key's cache row
            k = tl.load(k_ptr + row[:, None] * D + d[None, :], mask=n_ok[:, None], other=0.0)
            ks = tl.load(ks_ptr + row, mask=n_ok, other=0.0)
            s = tl.dot(k, tl.trans(q0)) * qs0[None, :] + tl.dot(k, tl.trans(q1)) * qs1[None, :]
            s = s * (ks * scale_log2)[:, None]
            s = tl.where(n_ok[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            # A head with no visible key yet keeps m = -inf; shift by 0 so exp2 gives exact zeros.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[None, :])
            l_i = l_i * alpha + tl.sum(p, 0)
            v = tl.load(v_ptr + row[:, None] * D + d[None, :], mask=n_ok[:, None], other=0.0)
            v = v.to(out_ptr.dtype.element_ty)
            vs = tl.load(vs_ptr + row, mask=n_ok, other=0.0)
            pv = (p * vs[:, None]).to(out_ptr.dtype.element_ty)  # the value's scale on its probabilities
            if F32_PRODUCT:
                out_t = tl.dot(tl.trans(v.to(tl.float32)), pv.to(tl.float32), input_precision="ieee")
            else:
                out_t = tl.dot(tl.trans(v), pv)  # [D, GPAD]
            acc = acc * alpha[None, :] + out_t
            m_i = m_new
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[None, :]
        keep = g_ok[None, :] & (tl.zeros([D, GPAD], tl.int32) + live.to(tl.int32) != 0)
        o_ptrs = out_ptr + t * sot + heads[None, :] * soh + d[:, None]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=keep)


def overwrite_generated_rows(
    out: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    prompt_lens: torch.Tensor,
    scale: float,
) -> None:
    """Write into out [T, Hq, 128] the attention of every row at a position >= its request's
    prompt_lens entry; leave the other rows as they are. Inputs as paged_attention's, already
    validated there (and `applies` true); prompt_lens [B] int32 on q's device."""
    t, hq, d = q.shape
    hk = k_cache.shape[2]
    b = seq_lens.shape[0]
    if t == 0 or b == 0:
        return
    slices = max(1, min(MAX_SLICES, -(-t // b)))
    group = hq // hk
    _generated_rows_kernel[(b, hk, slices)](
        q,
        k_cache,
        v_cache,
        k_scale,
        v_scale,
        block_tables,
        query_start_loc,
        seq_lens,
        prompt_lens,
        out,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        slices,
        float(scale) * _LOG2E,
        HK=hk,
        GROUP=group,
        GPAD=max(8, triton.next_power_of_2(group)),
        D=d,
        PAGE=k_cache.shape[1],
        BLOCK_N=BLOCK_N,
        ONE_ROW=ONE_ROW_PROGRAMS and t == b,  # every request has a row: t == b is a decode step
        F32_PRODUCT=interpreting(),
        num_warps=WARPS,
        num_stages=1,
    )
