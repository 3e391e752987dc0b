"""Varlen paged attention for mixed prefill + decode batches, batch invariant by construction.

Layout (one step's flat batch; see engine/forward_context.py):

    q            [T, Hq, D]                         query_start_loc [B + 1] int32
    k_cache      [num_blocks, block_size, Hk, D]    seq_lens        [B] int32 (keys incl. this step)
    v_cache      [num_blocks, block_size, Hk, Dv]   block_tables    [B, max_blocks] int32
    out          [T, Hq, Dv]

Work split. The queries of one request are cut into "q blocks" of BQ tokens; a q block times
one KV head is a tile of BLOCK_M = BQ * group rows (row r = token r // group, query head
r % group of that KV head), so each key tile is loaded once for the whole GQA group (a group
larger than BLOCK_M, e.g. MLA's 128 heads, is split into head slices over several programs).
Keys are cut into chunks of KV_CHUNK absolute positions (a fixed length, never from the batch).

  phase 1  grid (q blocks, Hk, chunks): each program runs an online softmax over one chunk
           and writes the row's unnormalised partial (m, l, acc) to a float32 workspace.
  phase 2  grid (q blocks, Hk, value-column slices): merges each row's chunks in increasing
           chunk order (split_kv.py: the tile layout, workspace and merge MLA shares).
           On an FP8 cache a tile whose rows all end in the first chunk is written by phase 1
           itself (acc / l, what the merge of one chunk returns exactly) and skipped here.

Why this is batch invariant: a row's result is a fixed function of its own chunks. Within a
chunk the key tiles start at the same absolute positions whatever the batch; a tile that is
fully masked for a row (past its position, or before its window) leaves its running (m, l, acc)
bit-for-bit unchanged (alpha = 1, p = 0, or everything stays exactly 0 before the first visible
key); the MMA computes each output row from that row alone. So a row computed alone, in a
prefill chunk, or among 255 decode rows gives identical bits. q blocks are found in-kernel from
query_start_loc (q block i of request s has index qsl[s] // BQ + s + i, or qsl[s] + i when a
block is one token; `split_kv.locate` counts the requests starting at or before a block), so the
launcher needs no host copy of the batch layout.
Integer arguments that depend on the batch (block-table width, number of KV chunks) are not
specialized by Triton, so a new batch shape reuses the compiled kernel.

Semantics = reference.paged_attention (causal; key j visible to a query at absolute position p
iff j <= p and, with a sliding window w, j > p - w); only rounding differs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from shardinfer.kernels import paged_attention_fma, split_kv
from shardinfer.kernels._common import (
    FLOAT_DTYPES,
    check_same_device,
    check_tensor,
    fail,
    interpreting,
    next_pow2,
)
from shardinfer.kernels._opaque import opaque
from shardinfer.kernels.reference_fp8 import FP8_DTYPE, GROUP

# Tile config, fixed because it fixes the rounding (see paged_attention's docstring). Chosen by
# the sweep in bench/kernels/bench_kernels.py (the numbers: bench/kernels/NOTES.md): 16-row tiles
# read K/V in decode much closer to copy bandwidth than 64-row tiles, at the cost of prefill
# attention, which is a small share of a prefill step.
KV_CHUNK = 1024
BLOCK_N = 64
# An FP8 cache with one scale per key reads 128-key tiles: on the H200 its decode was faster at 128
# than at 64 on every batch and context tried, where the bf16 cache's was not (bench_kernels.py
# --only fp8_attention; docs/performance.md). A separate numerics setting, so a separate tile.
FP8_BLOCK_N = 128
# Launch settings that change no arithmetic (the same bits; bench_kernels.py --only fp8_attention
# checks it): on the H200 the decode kernel was fastest with at most 128 registers per thread (four
# programs per SM instead of three; the compiler spills a few bytes) and, on an FP8 cache's 128-key
# tiles, with one stage: the raw FP8 tile skips the cp.async buffer, which halves the shared memory
# per program. The measurements: docs/performance.md ("Paged attention: registers and stages").
# The cap applies where it was measured (head dims <= 128, 16-bit queries); elsewhere a capped
# kernel would spill far more.
NUM_STAGES = 2
FP8_NUM_STAGES = 1
MAX_REGISTERS = 128
# On an FP8 cache, a tile whose rows all end inside the first KV chunk (decode rows up to KV_CHUNK
# tokens of context) writes its normalised output from the chunk kernel: the merge of one chunk is
# acc / l exactly, so the bits are the same, and the partials' round trip and the merge program are
# saved. On the H200 that was faster on the FP8 cache and not on the bf16 cache's kernel (numbers:
# bench/kernels/NOTES.md, "One-chunk tiles"), which keeps the merge.
SINGLE_CHUNK_DIRECT = True
# A numerics setting of the FP8 cache: its dequantised tiles take the 16-bit cache's MMA operand
# layout (kernels/_opaque.py), so an FP8 cache gives the bits of a 16-bit cache holding the same
# values. Off, the compiler may keep the raw FP8 tile in shared memory and dequantise the operand
# in registers (another grouping of the products over k, so other bits; still batch invariant).
OPAQUE_FP8_TILES = True
# A numerics setting of the FP8 cache: with prompt lengths given, generated tokens' rows go through
# paged_attention_fma where it applies (its docstring: where, and why that keeps batch invariance).
# Off, every row takes the chunk kernel. On since it ran faster end to end with its GPU tests passing
# (docs/quantization.md, "Generated tokens' rows on the FMA units").
FMA_GENERATED_ROWS = True
_CAPPED_HEAD_DIM = 128
_MIN_BLOCK_M = 16
_LOG2E = 1.4426950408889634


@triton.jit(do_not_specialize=["sbt", "num_seqs", "block_base", "window", "n_chunks"])
def _attn_chunk_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    bt_ptr,
    qsl_ptr,
    sl_ptr,
    plen_ptr,
    pacc_ptr,
    pm_ptr,
    pl_ptr,
    out_ptr,
    sot,
    soh,
    sqt,
    sqh,
    skb,
    sks,
    skh,
    svb,
    svs,
    svh,
    sksb,
    skss,
    sksh,
    svsb,
    svss,
    svsh,
    sbt,
    num_seqs,
    block_base,
    scale_log2,
    window,
    n_heads,
    n_chunks,
    GROUP: tl.constexpr,
    HB: tl.constexpr,
    N_HSPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BQ: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    CHUNK: tl.constexpr,
    PAGE: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
    SCALE_SCORES: tl.constexpr,
    OPAQUE: tl.constexpr,
    DIRECT: tl.constexpr,
    SKIP_GENERATED: tl.constexpr,
):
    qblock = block_base + tl.program_id(0)
    c = tl.program_id(2)
    seq, q_start, tok0 = split_kv.locate(qsl_ptr, num_seqs, qblock, BQ)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    seq_len = tl.load(sl_ptr + seq)
    ctx = seq_len - q_len
    n_tok = tl.minimum(q_len - tok0, BQ)
    max_pos = ctx + tok0 + n_tok - 1
    kv_lo = c * CHUNK
    if HAS_WINDOW:
        # Tiles before every row's window are skipped; they would be exact no-ops anyway.
        first = tl.maximum(ctx + tok0 - window + 1, 0)
        kv_lo = tl.maximum(kv_lo, (first // BLOCK_N) * BLOCK_N)
    kv_hi = tl.minimum(c * CHUNK + CHUNK, max_pos + 1)
    todo = (n_tok > 0) & (kv_lo < kv_hi)
    if SKIP_GENERATED:  # tiles of generated tokens only: paged_attention_fma's
        todo = todo & ~split_kv.first_row_generated(plen_ptr, seq, ctx, tok0)
    if todo:
        kvh, tok, head, row_ok = split_kv.tile_rows(
            tl.program_id(1), tok0, q_len, GROUP, HB, BLOCK_M, BQ, N_HSPLIT
        )
        pos = ctx + tok
        d = tl.arange(0, BLOCK_D)
        dv = tl.arange(0, BLOCK_DV)
        q_rows = (q_start + tok).to(tl.int64) * sqt + head * sqh
        q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=row_ok[:, None] & (d < D)[None, :], other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        for start in range(kv_lo, kv_hi, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            n_ok = n < kv_hi
            page = tl.load(bt_ptr + seq.to(tl.int64) * sbt + n // PAGE, mask=n_ok, other=0).to(tl.int64)
            k_off = page * skb + (n % PAGE) * sks + kvh * skh
            k = tl.load(k_ptr + k_off[None, :] + d[:, None], mask=n_ok[None, :] & (d < D)[:, None], other=0.0)
            if KV_FP8:
                ks_off = page * sksb + (n % PAGE) * skss + kvh * sksh
                if SCALE_SCORES:  # one scale per key, applied to its column of scores below
                    ks = tl.load(ks_ptr + ks_off, mask=n_ok, other=0.0)
                    k = k.to(q.dtype)
                elif (
                    D <= 128
                ):  # dequantise in registers: exact in q's dtype (3-bit mantissas, power-of-two scales)
                    ks = tl.load(ks_ptr + ks_off, mask=n_ok, other=0.0)
                    k = (k.to(tl.float32) * ks[None, :]).to(q.dtype)
                else:  # D <= 256 (checked): two groups, two scale vectors selected by row, no 2D gather
                    ks_lo = tl.load(ks_ptr + ks_off, mask=n_ok, other=0.0)
                    ks_hi = tl.load(ks_ptr + ks_off + 1, mask=n_ok, other=0.0)
                    ks2 = tl.where((d < 128)[:, None], ks_lo[None, :], ks_hi[None, :])
                    k = (k.to(tl.float32) * ks2).to(q.dtype)
                if OPAQUE:  # the 16-bit cache's MMA operand layout, so its rounding (kernels/_opaque.py)
                    k = opaque(k)
            s = tl.dot(q, k, input_precision=PRECISION)
            if SCALE_SCORES:
                s = s * ks[None, :]
            s = s * scale_log2
            visible = n_ok[None, :] & (n[None, :] <= pos[:, None])
            if HAS_WINDOW:
                visible = visible & (n[None, :] > pos[:, None] - window)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # A row with no visible key yet keeps m = -inf; shift by 0 so exp2 gives exact zeros.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v_off = page * svb + (n % PAGE) * svs + kvh * svh
            v = tl.load(
                v_ptr + v_off[:, None] + dv[None, :], mask=n_ok[:, None] & (dv < DV)[None, :], other=0.0
            )
            pv = p
            if KV_FP8:
                vs_off = page * svsb + (n % PAGE) * svss + kvh * svsh
                if SCALE_SCORES:  # one scale per key, applied to its column of probabilities
                    vs = tl.load(vs_ptr + vs_off, mask=n_ok, other=0.0)
                    pv = p * vs[None, :]
                    v = v.to(q.dtype)
                elif DV <= 128:
                    vs = tl.load(vs_ptr + vs_off, mask=n_ok, other=0.0)
                    v = (v.to(tl.float32) * vs[:, None]).to(q.dtype)
                else:
                    vs_lo = tl.load(vs_ptr + vs_off, mask=n_ok, other=0.0)
                    vs_hi = tl.load(vs_ptr + vs_off + 1, mask=n_ok, other=0.0)
                    vs2 = tl.where((dv < 128)[None, :], vs_lo[:, None], vs_hi[:, None])
                    v = (v.to(tl.float32) * vs2).to(q.dtype)
                if OPAQUE:
                    v = opaque(v)
            acc = acc * alpha[:, None] + tl.dot(pv.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        if DIRECT and split_kv.ends_in_first_chunk(ctx, tok0, n_tok, CHUNK):
            # Every row of the tile has one chunk, whose merge gives acc / l exactly (the running
            # state starts empty: alpha 0, beta 1); split_kv.merge_kernel skips these tiles.
            split_kv.store_rows(out_ptr, sot, soh, q_start, tok, head, row_ok, acc, l_i, dv, DV)
        else:
            w = (
                split_kv.partial_rows(
                    qsl_ptr, num_seqs, block_base, q_start, tok, head, n_heads, n_chunks, BQ
                )
                + c
            )
            tl.store(pm_ptr + w, m_i, mask=row_ok)
            tl.store(pl_ptr + w, l_i, mask=row_ok)
            tl.store(pacc_ptr + w[:, None] * DV + dv[None, :], acc, mask=row_ok[:, None] & (dv < DV)[None, :])


def _check(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    sliding_window: int | None,
    kv_chunk: int,
    max_seq_len: int | None,
    fp8: bool = False,
) -> None:
    check_tensor("q", q, dtypes=FLOAT_DTYPES, ndim=3, last_dim_contiguous=True)
    cache_dtype = FP8_DTYPE if fp8 else q.dtype
    check_tensor("k_cache", k_cache, dtypes=(cache_dtype,), ndim=4, last_dim_contiguous=True)
    check_tensor("v_cache", v_cache, dtypes=(cache_dtype,), ndim=4, last_dim_contiguous=True)
    check_tensor("query_start_loc", query_start_loc, dtypes=(torch.int32,), ndim=1, contiguous=True)
    check_tensor("seq_lens", seq_lens, dtypes=(torch.int32,), ndim=1, contiguous=True)
    check_tensor("block_tables", block_tables, dtypes=(torch.int32,), ndim=2, last_dim_contiguous=True)
    _t, hq, d = q.shape
    nb, bs, hk, dk = k_cache.shape
    if dk != d:
        raise fail("k_cache.shape[-1]", dk, f"need q's head dim {d}")
    if tuple(v_cache.shape[:3]) != (nb, bs, hk):
        raise fail("v_cache.shape", tuple(v_cache.shape), f"need ({nb}, {bs}, {hk}, Dv) like k_cache")
    if hk == 0 or hq % hk:
        raise fail("q.shape[1]", hq, f"need a multiple of the cache's KV heads ({hk})")
    b = seq_lens.shape[0]
    if query_start_loc.shape[0] != b + 1:
        raise fail("query_start_loc.shape", tuple(query_start_loc.shape), f"need ({b + 1},): B + 1 offsets")
    if block_tables.shape[0] != b:
        raise fail("block_tables.shape[0]", block_tables.shape[0], f"need B = {b} rows")
    if kv_chunk <= 0 or kv_chunk % BLOCK_N:
        raise fail("kv_chunk", kv_chunk, f"need a positive multiple of {BLOCK_N}")
    if sliding_window is not None and sliding_window < 1:
        raise fail("sliding_window", sliding_window, "need None or >= 1")
    if max_seq_len is not None and max_seq_len < 0:
        raise fail("max_seq_len", max_seq_len, "need >= 0 (the longest seq_lens entry)")
    check_same_device(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        block_tables=block_tables,
    )


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    max_seq_len: int | None = None,
    kv_chunk: int = KV_CHUNK,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    fp8_scale_scores: bool = False,
    max_registers: int | None = -1,
    prompt_lens: torch.Tensor | None = None,
    generated_only: bool = False,
) -> torch.Tensor:
    """Causal GQA attention of a flat varlen batch over a paged KV cache (after this step's store).

    q [T, Hq, D] float32/float16/bfloat16 (last dim contiguous); k_cache [num_blocks, block_size,
    Hk, D] and v_cache [..., Hk, Dv] of q's dtype; query_start_loc [B + 1], seq_lens [B] and
    block_tables [B, max_blocks], all int32 on q's device. Request s's queries are
    q[qsl[s]:qsl[s+1]], at absolute positions seq_lens[s] - q_len .. seq_lens[s] - 1.
    max_seq_len (the largest seq_lens entry) sizes the chunk grid; pass it to avoid a device
    sync. Returns [T, Hq, Dv] in q's dtype. Results do not depend on the rest of the batch; they
    do depend on kv_chunk and the tile config (block_n, num_warps, num_stages), which must
    therefore be fixed per deployment, never chosen per batch (block_n None: BLOCK_N, or
    FP8_BLOCK_N for an FP8 cache with head dims <= 128 when it divides kv_chunk; num_stages
    None: FP8_NUM_STAGES with that FP8 tile, else NUM_STAGES). max_registers caps the registers
    per thread of the chunk kernel (-1: MAX_REGISTERS for head dims <= 128 and 16-bit queries,
    else none; None: none); a launch setting, it changes no arithmetic.

    An FP8 cache (float8_e4m3fn k_cache/v_cache) comes with k_scale/v_scale [num_blocks,
    block_size, Hk, ceil(D / 128)] float32 contiguous (kv_store.store_kv_fp8). Its tiles are
    dequantised in registers into q's dtype, exactly (3-bit mantissas times powers of two), and
    given the 16-bit tiles' MMA operand layout (kernels/_opaque.py), so the result is bit for bit
    what this kernel gives on a q-dtype cache holding those values. fp8_scale_scores=True (one
    scale per key, head dims <= 128, bfloat16 or float32 queries) applies the scales to the
    scores' and the probabilities' columns instead of to the key and value tiles: a power-of-two
    factor commutes with every rounding in between, so the bits are the same (short of a
    probability so small that, times its scale, it falls below float32's normal range, about
    2^-126: there the two can differ in a term far below the sum's last place). On the H200 it was
    the faster path until the tiles took the 16-bit layout; since then it is the slower one
    (docs/quantization.md), so it is no longer the default. (float16 is left out: its
    probabilities times small scales fall into its subnormal range, where scaling and rounding
    stop commuting.)

    prompt_lens [B] int32 (each request's prompt length, on q's device): on an FP8 cache where
    paged_attention_fma applies (and FMA_GENERATED_ROWS), the rows at positions at or after it
    (generated tokens) are computed by that kernel instead, and the chunk kernel and the merge skip
    the tiles holding only such rows. Its bits differ from the chunk kernel's, but which kernel
    computes a row depends only on the request and the position, so results stay batch invariant.
    None: every row takes the chunk kernel. generated_only=True (with prompt_lens where that kernel
    applies): the caller guarantees every row is a generated token's (a decode step), so the chunk
    kernel and the merge are not launched at all; a prompt row would be left unwritten.
    """
    fp8 = k_scale is not None or v_scale is not None
    _check(
        q,
        k_cache,
        v_cache,
        query_start_loc,
        seq_lens,
        block_tables,
        sliding_window,
        kv_chunk,
        max_seq_len,
        fp8,
    )
    if fp8:
        _check_scales(k_cache, v_cache, k_scale, v_scale)
    # The flag and shape first: this runs per layer in eager steps, and is all that runs where the
    # FMA kernel does not apply.
    if not (
        prompt_lens is not None
        and FMA_GENERATED_ROWS
        and paged_attention_fma.applies(q, k_cache, v_cache, k_scale, sliding_window)
    ):
        prompt_lens = None
    if prompt_lens is not None:
        check_tensor("prompt_lens", prompt_lens, dtypes=(torch.int32,), ndim=1, contiguous=True)
        if prompt_lens.shape != seq_lens.shape:
            raise fail(
                "prompt_lens.shape", tuple(prompt_lens.shape), f"need ({seq_lens.shape[0]},): one per request"
            )
        check_same_device(q=q, prompt_lens=prompt_lens)
    if max(q.shape[-1], v_cache.shape[-1]) > 256:
        raise fail("head dim", max(q.shape[-1], v_cache.shape[-1]), "need <= 256")
    hk = k_cache.shape[2]
    group = q.shape[1] // hk
    if num_stages is not None and num_stages < 1:
        raise fail("num_stages", num_stages, "need >= 1, or None for the cache's default")
    if max_registers not in (None, -1) and not 16 <= max_registers <= 255:
        raise fail(
            "max_registers",
            max_registers,
            "need 16..255 registers per thread, -1 for the default cap, or None for no cap",
        )
    wide = fp8 and _one_scale_per_key(q.shape[-1], v_cache.shape[-1]) and kv_chunk % FP8_BLOCK_N == 0
    if block_n is None:
        block_n = FP8_BLOCK_N if wide else BLOCK_N
    if num_stages is None:
        num_stages = FP8_NUM_STAGES if wide and block_n == FP8_BLOCK_N else NUM_STAGES
    if max_registers == -1:
        small = max(q.shape[-1], v_cache.shape[-1]) <= _CAPPED_HEAD_DIM and q.dtype in (
            torch.bfloat16,
            torch.float16,
        )
        max_registers = MAX_REGISTERS if small else None
    return launch(
        q,
        k_cache,
        v_cache,
        (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2)),
        (v_cache.stride(0), v_cache.stride(1), v_cache.stride(2)),
        hk,
        q.shape[-1],
        v_cache.shape[-1],
        query_start_loc,
        seq_lens,
        block_tables,
        scale,
        sliding_window,
        max_seq_len,
        kv_chunk,
        max(_MIN_BLOCK_M, next_pow2(group)),
        block_n,
        num_warps,
        num_stages,
        k_scale,
        v_scale,
        fp8_scale_scores,
        max_registers,
        prompt_lens,
        generated_only,
    )


def _one_scale_per_key(d: int, dv: int) -> bool:
    """Whether an FP8 cache holds one scale per key and head (heads of at most one 128-value group)."""
    return max(d, dv) <= GROUP


def _check_scales(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None
) -> None:
    for name, cache, sc in (("k_scale", k_cache, k_scale), ("v_scale", v_cache, v_scale)):
        want = (*cache.shape[:3], -(-cache.shape[3] // GROUP))
        t = check_tensor(name, sc, dtypes=(torch.float32,), ndim=4, contiguous=True)
        if tuple(t.shape) != want:
            raise fail(
                f"{name}.shape", tuple(t.shape), f"need {want}: one scale per 128 values per head and slot"
            )


def launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_strides: tuple[int, int, int],
    v_strides: tuple[int, int, int],
    hk: int,
    d: int,
    dv: int,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    max_seq_len: int | None,
    kv_chunk: int,
    block_m: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    fp8_scale_scores: bool = False,
    max_registers: int | None = None,
    prompt_lens: torch.Tensor | None = None,
    generated_only: bool = False,
) -> torch.Tensor:
    """Shared launcher of the two phases (inputs already validated by the public wrappers).

    k/v strides are (block, slot, kv head); k_scale/v_scale (an FP8 cache) are contiguous.
    prompt_lens: generated rows go through paged_attention_fma (the caller checked it applies);
    generated_only: every row is one, so the two phases are not launched.
    """
    fp8 = k_scale is not None and v_scale is not None
    scores_ok = _one_scale_per_key(d, dv) and q.dtype in (torch.bfloat16, torch.float32)
    if fp8_scale_scores and not scores_ok:
        raise fail(
            "fp8_scale_scores",
            fp8_scale_scores,
            f"need head dims <= {GROUP} and bfloat16/float32 queries (got {d}, {dv}, {q.dtype})",
        )
    scale_scores = fp8 and bool(fp8_scale_scores)
    ks = k_scale if k_scale is not None else k_cache
    vs = v_scale if v_scale is not None else v_cache
    ks_strides = tuple(k_scale.stride()[:3]) if k_scale is not None else (0, 0, 0)
    vs_strides = tuple(v_scale.stride()[:3]) if v_scale is not None else (0, 0, 0)
    if block_n not in (16, 32, 64, 128) or kv_chunk % block_n:
        raise fail("block_n", block_n, f"need 16, 32, 64 or 128, dividing kv_chunk={kv_chunk}")
    window = int(sliding_window) if sliding_window is not None else 0
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    page = k_cache.shape[1]
    limits = {"maxnreg": max_registers} if max_registers is not None and not interpreting() else {}
    direct = SINGLE_CHUNK_DIRECT and fp8

    def phase1(
        grid: tuple[int, int, int], base: int, ws: split_kv.Workspace, common: dict[str, object]
    ) -> None:
        _attn_chunk_kernel[grid](
            q,
            k_cache,
            v_cache,
            ks,
            vs,
            block_tables,
            query_start_loc,
            seq_lens,
            prompt_lens if prompt_lens is not None else seq_lens,
            ws.acc,
            ws.m,
            ws.l,
            ws.out,
            ws.out.stride(0),
            ws.out.stride(1),
            q.stride(0),
            q.stride(1),
            *k_strides,
            *v_strides,
            *ks_strides,
            *vs_strides,
            block_tables.stride(0),
            seq_lens.shape[0],
            base,
            float(scale) * _LOG2E,
            window,
            q.shape[1],
            ws.n_chunks,
            BLOCK_N=block_n,
            D=d,
            BLOCK_D=max(16, next_pow2(d)),
            DV=dv,
            BLOCK_DV=max(16, next_pow2(dv)),
            PAGE=page,
            PRECISION=precision,
            KV_FP8=fp8,
            SCALE_SCORES=scale_scores,
            OPAQUE=fp8 and OPAQUE_FP8_TILES and not interpreting(),
            DIRECT=direct,
            SKIP_GENERATED=prompt_lens is not None,
            num_warps=num_warps,
            num_stages=num_stages,
            **limits,
            **common,
        )

    if generated_only and prompt_lens is not None and fp8:
        out = torch.empty(q.shape[0], q.shape[1], dv, dtype=q.dtype, device=q.device)
    else:
        out = split_kv.two_phase(
            q,
            hk,
            dv,
            query_start_loc,
            seq_lens,
            max_seq_len,
            kv_chunk,
            block_m,
            sliding_window,
            phase1,
            single_chunk_direct=direct,
            prompt_lens=prompt_lens,
        )
    if prompt_lens is not None and k_scale is not None and v_scale is not None:
        # After the merge: a tile mixing prompt and generated rows is computed and merged whole,
        # and its generated rows are overwritten here.
        paged_attention_fma.overwrite_generated_rows(
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
        )
    return out
