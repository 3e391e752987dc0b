"""Attention of generated tokens over an FP8 paged cache on the FMA units (no MMA, no shared memory).

Where it runs: `paged_attention` sends every query row at a position at or after its request's
prompt length (a generated token: a decode row, a draft being verified, or a generated token
recomputed after a preemption) here, and every prompt row to the chunk kernel. The choice is a
fixed function of the request and the position, never of the batch, so a row gets the same bits
as a decode row, as a verify row and as a recomputed row alike, which keeps batch invariance while
the two kernels' bits differ. Only where it was measured faster: an FP8 cache with one scale per
key, head dim 128, two query heads per KV head, 16-bit queries, no sliding window (`applies`). The
measurements: bench/kernels/NOTES.md, "FP8 decode attention on the FMA units".

A program computes one query token at a time, for one KV head. A tile of keys is [REPS, WARPS, 4,
128]: each warp owns REPS x 4 of its keys, eight lanes holding a key row's 128 bytes (16 a lane)
and four lanes four keys. Then:

- scores: each lane multiplies its 16 key bytes (as float32) by the matching query values, a
  shuffle across the eight lanes of a row finishes the dot, and the key's scale multiplies the
  score (the tile is only converted, never scaled);
- softmax: each warp keeps its own running maximum and sum over its own keys, so no value crosses
  a warp inside the loop;
- output: each lane keeps float32 partial sums for its 16 channels over the keys it holds (the
  value's scale folded into its probability), summed across lanes and warps once, at the end.

A row's keys are 0 .. its position, cut into tiles from key 0 whatever the batch, so its result
depends on its own keys only. The grid is (requests, KV heads, token slices): program z of a
request computes its generated tokens z, z + slices, ... in turn, each from a fresh state, so how
many slices a launch has changes no bit. A prefill-heavy step's many prompt tokens then cost one
early-exiting program per request and slice, not one per token; a decode step (one token a request)
gets one slice and programs without the row loop (ONE_ROW_PROGRAMS), a verify step as many slices
as its rows per request. Everything comes from the device tensors, so the launch needs no host copy
of the batch layout (and serves CUDA graphs).

The GPU runs the Gluon kernel, which gives every layout so that the loop exchanges nothing through
shared memory; the interpreter (CPU tests) runs the Triton kernel, the same arithmetic with
layouts left to the compiler. The two may round differently from each other; each is batch
invariant on its own, and the engine only ever uses one of them on a device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from shardinfer.kernels._common import interpreting
from shardinfer.kernels.reference_fp8 import FP8_DTYPE

_LOG2E = 1.4426950408889634
HEAD_DIM = 128
GROUPS = (2,)  # query heads per KV head where this kernel was measured faster than the chunk kernel
LANE_KEYS = 4  # keys a warp holds side by side: 32 lanes / (128 bytes a row / 16 bytes a lane)
# The tile (fixed: it fixes the rounding). 4 x 4 x 4 = 64 keys a step was the fastest in the sweep.
REPS = 4
WARPS = 4
# Launch settings (the same arithmetic). A register cap per thread (None: the compiler's choice):
# capped, four programs share an SM instead of three, which was faster (bench/kernels/NOTES.md).
MAX_REGISTERS: int | None = 128
# At most this many programs per request and KV head (token slices).
MAX_SLICES = 8
# A launch with one row per request (a decode step) runs a kernel without the loop over a
# request's rows: its bounds are constants there, so the compiler drops it. The same arithmetic.
ONE_ROW_PROGRAMS = True


def may_apply(head_dim: int, num_heads: int, num_kv_heads: int) -> bool:
    """Whether a model of this attention shape can have rows for this kernel (on an FP8 cache):
    what the engine checks once before building each step's prompt lengths."""
    return (
        head_dim == HEAD_DIM
        and num_kv_heads > 0
        and num_heads % num_kv_heads == 0
        and num_heads // num_kv_heads in GROUPS
    )


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
        and q.dtype in (torch.bfloat16, torch.float16)
        and sliding_window is None
        and may_apply(q.shape[-1], q.shape[1], k_cache.shape[2])
        and k_cache.shape[-1] == HEAD_DIM
        and v_cache.shape[-1] == HEAD_DIM
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
    )


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
    D: tl.constexpr,
    PAGE: tl.constexpr,
    REPS: tl.constexpr,
    WARPS: tl.constexpr,
    LKEYS: tl.constexpr,
    ONE_ROW: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    ctx0 = tl.load(sl_ptr + seq) - q_len  # keys before this step's first token
    first = tl.maximum(tl.load(pl_ptr + seq) - ctx0, 0)  # the first generated token of the step
    TILE: tl.constexpr = REPS * WARPS * LKEYS
    # [GROUP, REPS, WARPS, LKEYS, D]; reductions over D, REPS and LKEYS stay inside a warp.
    r = tl.arange(0, REPS)[:, None, None]
    w = tl.arange(0, WARPS)[None, :, None]
    i = tl.arange(0, LKEYS)[None, None, :]
    key_in_tile = (r * WARPS + w) * LKEYS + i  # [REPS, WARPS, LKEYS]
    d = tl.arange(0, D)[None, None, None, None, :]
    dd = tl.arange(0, D)
    heads = kvh * GROUP + tl.arange(0, GROUP)
    bt_row = bt_ptr + seq.to(tl.int64) * sbt
    if ONE_ROW:  # constant bounds: the compiler drops the loop (ONE_ROW_PROGRAMS)
        lo, hi, step = 0, 1, 1
    else:
        lo, hi, step = first + tl.program_id(2), q_len, n_slices
    for j in range(lo, hi, step):
        t = (q_start + j).to(tl.int64)
        live = j >= first  # a prompt row (ONE_ROW only) computes nothing and stores nothing
        ctx = (ctx0 + j + 1) * live.to(tl.int32)  # keys 0 .. the token's own position
        q = tl.load(q_ptr + (t * sqt + heads * sqh)[:, None, None, None, None] + d).to(tl.float32)
        q = q * scale_log2  # the softmax's scale folded in
        m_i = tl.full([GROUP, WARPS], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP, WARPS, LKEYS], tl.float32)
        acc = tl.zeros([GROUP, WARPS, LKEYS, D], tl.float32)
        for start in range(0, ctx, TILE):
            n = start + key_in_tile
            n_ok = n < ctx
            page = tl.load(bt_row + n // PAGE, mask=n_ok, other=0).to(tl.int64)
            row = (page * PAGE + n % PAGE) * HK + kvh  # [REPS, WARPS, LKEYS]: the key's cache row
            addr = row[None, :, :, :, None] * D + d
            ok5 = n_ok[None, :, :, :, None]
            k = tl.load(k_ptr + addr, mask=ok5, other=0.0).to(tl.float32)
            ks = tl.load(ks_ptr + row, mask=n_ok, other=0.0)
            s = tl.sum(q * k, axis=4) * ks[None, :, :, :]  # [GROUP, REPS, WARPS, LKEYS]
            s = tl.where(n_ok[None, :, :, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(tl.max(s, axis=3), axis=1))  # [GROUP, WARPS]
            # A warp with no visible key yet keeps m = -inf; shift by 0 so exp2 gives exact zeros.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None, :, None])
            l_i = l_i * alpha[:, :, None] + tl.sum(p, axis=1)
            v = tl.load(v_ptr + addr, mask=ok5, other=0.0).to(tl.float32)
            vs = tl.load(vs_ptr + row, mask=n_ok, other=0.0)
            pv = p * vs[None, :, :, :]
            acc = acc * alpha[:, :, None, None] + tl.sum(pv[:, :, :, :, None] * v, axis=1)
            m_i = m_new
        # The warps' states merged once: every partial rescaled to the program's maximum.
        m_all = tl.max(m_i, axis=1)  # [GROUP]
        f = tl.exp2(m_i - m_all[:, None])  # [GROUP, WARPS]
        l_all = tl.sum(tl.sum(l_i * f[:, :, None], axis=2), axis=1)
        o = tl.sum(tl.sum(acc * f[:, :, None, None], axis=2), axis=1) / l_all[:, None]  # [GROUP, D]
        o_rows = t * sot + heads * soh
        keep = (tl.zeros([GROUP, D], tl.int32) + live.to(tl.int32)) != 0
        tl.store(out_ptr + o_rows[:, None] + dd[None, :], o.to(out_ptr.dtype.element_ty), mask=keep)


@gluon.jit
def _generated_rows_gluon_kernel(
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
    HK: gl.constexpr,
    GROUP: gl.constexpr,
    D: gl.constexpr,
    PAGE: gl.constexpr,
    REPS: gl.constexpr,
    WARPS: gl.constexpr,
    LKEYS: gl.constexpr,
    ONE_ROW: gl.constexpr,
):
    """The Triton kernel's arithmetic with every layout given: the per-key indices, scales and
    page ids are loaded straight into the layout the scores have, so nothing in the loop is
    exchanged through shared memory."""
    # [GROUP, REPS, WARPS, LKEYS, D]: sixteen bytes of a key row a lane, eight lanes a row, four
    # keys across the other lanes, the warps along WARPS, the reps and the group in registers.
    L5: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 1, 1, 1, 16],
        threads_per_warp=[1, 1, 1, LKEYS, 32 // LKEYS],
        warps_per_cta=[1, 1, WARPS, 1, 1],
        order=[4, 3, 2, 1, 0],
    )
    S4: gl.constexpr = gl.SliceLayout(4, L5)  # [GROUP, REPS, WARPS, LKEYS]: scores, per-key values
    SM: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(1, S4))  # [GROUP, WARPS]: a warp's max
    SA: gl.constexpr = gl.SliceLayout(1, L5)  # [GROUP, WARPS, LKEYS, D]: a lane's partial output
    SO: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, SA))  # [GROUP, D]: the merged output
    seq = gl.program_id(0)
    kvh = gl.program_id(1)
    q_start = gl.load(qsl_ptr + seq)
    q_len = gl.load(qsl_ptr + seq + 1) - q_start
    ctx0 = gl.load(sl_ptr + seq) - q_len  # keys before this step's first token
    first = gl.maximum(gl.load(pl_ptr + seq) - ctx0, 0)  # the first generated token of the step
    TILE: gl.constexpr = REPS * WARPS * LKEYS
    r = gl.arange(0, REPS, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, S4))))
    w = gl.arange(0, WARPS, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, S4))))
    i = gl.arange(0, LKEYS, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, S4))))
    key_in_tile = (r[None, :, None, None] * WARPS + w[None, None, :, None]) * LKEYS + i[None, None, None, :]
    g = gl.arange(0, GROUP, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, S4))))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, L5)))))
    d5 = d[None, None, None, None, :]
    go = gl.arange(0, GROUP, layout=gl.SliceLayout(1, SO))
    do = gl.arange(0, D, layout=gl.SliceLayout(0, SO))
    bt_row = bt_ptr + seq.to(gl.int64) * sbt
    if ONE_ROW:
        lo, hi, step = 0, 1, 1
    else:
        lo, hi, step = first + gl.program_id(2), q_len, n_slices
    for j in range(lo, hi, step):
        t = (q_start + j).to(gl.int64)
        live = j >= first
        ctx = (ctx0 + j + 1) * live.to(gl.int32)
        q_rows = t * sqt + (kvh * GROUP + g) * sqh
        q = gl.load(q_ptr + q_rows[:, None, None, None, None] + d5).to(gl.float32) * scale_log2
        m_i = gl.full([GROUP, WARPS], float("-inf"), gl.float32, SM)
        l_i = gl.zeros([GROUP, WARPS, LKEYS], gl.float32, gl.SliceLayout(1, S4))
        acc = gl.zeros([GROUP, WARPS, LKEYS, D], gl.float32, SA)
        for start in range(0, ctx, TILE):
            n = start + key_in_tile  # [1, REPS, WARPS, LKEYS]
            n_ok = n < ctx
            page = gl.load(bt_row + n // PAGE, mask=n_ok, other=0).to(gl.int64)
            row = (page * PAGE + n % PAGE) * HK + kvh
            addr = row[:, :, :, :, None] * D + d5
            ok5 = n_ok[:, :, :, :, None]
            k = gl.load(k_ptr + addr, mask=ok5, other=0.0).to(gl.float32)
            ks = gl.load(ks_ptr + row, mask=n_ok, other=0.0)
            s = gl.sum(q * k, axis=4) * ks
            s = gl.where(n_ok, s, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(gl.max(s, axis=1), axis=2))
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_safe)
            m_b = gl.convert_layout(m_safe, gl.SliceLayout(1, gl.SliceLayout(3, S4)), assert_trivial=True)
            p = gl.exp2(s - m_b[:, None, :, None])
            l_i = l_i * alpha[:, :, None] + gl.sum(p, axis=1)
            v = gl.load(v_ptr + addr, mask=ok5, other=0.0).to(gl.float32)
            vs = gl.load(vs_ptr + row, mask=n_ok, other=0.0)
            pv = (p * vs)[:, :, :, :, None]
            alpha_a = gl.convert_layout(alpha, gl.SliceLayout(2, gl.SliceLayout(3, SA)), assert_trivial=True)
            acc = acc * alpha_a[:, :, None, None] + gl.sum(pv * v, axis=1)
            m_i = m_new
        m_all = gl.max(m_i, axis=1)
        f = gl.exp2(m_i - m_all[:, None])
        l_all = gl.sum(gl.sum(l_i * f[:, :, None], axis=2), axis=1)
        f_a = gl.convert_layout(f, gl.SliceLayout(2, gl.SliceLayout(3, SA)), assert_trivial=True)
        o = gl.sum(gl.sum(acc * f_a[:, :, None, None], axis=2), axis=1)  # [GROUP, D] in SO
        o = o / gl.convert_layout(l_all, gl.SliceLayout(1, SO))[:, None]
        o_rows = t * sot + (kvh * GROUP + go) * soh
        keep = (gl.zeros([GROUP, D], gl.int32, SO) + live.to(gl.int32)) != 0
        gl.store(out_ptr + o_rows[:, None] + do[None, :], o.to(out_ptr.dtype.element_ty), mask=keep)


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
    launch(
        out,
        q,
        k_cache,
        v_cache,
        k_scale,
        v_scale,
        query_start_loc,
        seq_lens,
        block_tables,
        prompt_lens,
        scale,
        REPS,
        WARPS,
        not interpreting(),
        MAX_REGISTERS,
    )


def launch(
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
    reps: int,
    warps: int,
    explicit_layouts: bool,
    max_registers: int | None,
    one_row_programs: bool | None = None,
) -> None:
    """overwrite_generated_rows with the tile (reps x warps x 4 keys: other tiles round apart) and
    the launch settings given; explicit_layouts runs the Gluon kernel (GPU only), else the Triton
    one; one_row_programs None: ONE_ROW_PROGRAMS. For the engine's defaults and for bench/kernels'
    sweeps."""
    t, hq, d = q.shape
    hk = k_cache.shape[2]
    b = seq_lens.shape[0]
    if t == 0 or b == 0:
        return
    # Slices: the rows per request when every request has as many (a decode or verify graph),
    # else up to MAX_SLICES; never more than the widest request could use.
    slices = max(1, min(MAX_SLICES, -(-t // b)))
    args = (
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
    )
    tile = dict(HK=hk, GROUP=hq // hk, D=d, PAGE=k_cache.shape[1], REPS=reps, WARPS=warps, LKEYS=LANE_KEYS)
    # Every request of a step has at least one row, so t == b means one row each (a decode step).
    one_row = ONE_ROW_PROGRAMS if one_row_programs is None else one_row_programs
    tile["ONE_ROW"] = one_row and t == b
    limits = {"maxnreg": max_registers} if max_registers is not None and not interpreting() else {}
    kernel = _generated_rows_gluon_kernel if explicit_layouts else _generated_rows_kernel
    kernel[(b, hk, slices)](*args, **tile, num_warps=warps, **limits)
