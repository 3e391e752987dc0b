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
           chunk order.

Why this is batch invariant: a row's result is a fixed function of its own chunks. Within a
chunk the key tiles start at the same absolute positions whatever the batch; a tile that is
fully masked for a row (past its position, or before its window) leaves its running (m, l, acc)
bit-for-bit unchanged (alpha = 1, p = 0, or everything stays exactly 0 before the first visible
key); the MMA computes each output row from that row alone. So a row computed alone, in a
prefill chunk, or among 255 decode rows gives identical bits. q blocks are found in-kernel from
query_start_loc (q block i of request s has index qsl[s] // BQ + s + i, or qsl[s] + i when a
block is one token; `_locate` counts the requests starting at or before a block), so the
launcher needs no host copy of the batch layout.
Integer arguments that depend on the batch (block-table width, number of KV chunks) are not
specialized by Triton, so a new batch shape reuses the compiled kernel.

Semantics = reference.paged_attention (causal; key j visible to a query at absolute position p
iff j <= p and, with a sliding window w, j > p - w); only rounding differs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from shardinfer.kernels._common import FLOAT_DTYPES, check_same_device, check_tensor, fail, next_pow2
from shardinfer.kernels.launch_counters import launch_counters

# Tile config, fixed because it fixes the rounding (see paged_attention's docstring). Chosen by
# the sweep in bench/kernels/bench_kernels.py on an H200 (bench/kernels/NOTES.md): 16-row tiles
# read K/V at 61-84% of copy bandwidth in decode vs 42-63% for 64-row tiles, at the cost of
# prefill attention (82 vs 170 TFLOP/s), which is a small share of a prefill step.
KV_CHUNK = 1024
BLOCK_N = 64
_MIN_BLOCK_M = 16
# Upper bound on the phase-1 workspace per launch; larger batches are processed in slices of
# q blocks (the slicing changes which launch a row lands in, never its arithmetic).
_WORKSPACE_BYTES = 256 << 20
_LOG2E = 1.4426950408889634
_LOCATE_SPAN: tl.constexpr = tl.constexpr(256)  # request offsets _locate reads per vector load


@triton.jit
def _locate(qsl_ptr, num_seqs, qblock, BQ: tl.constexpr):
    """(request, first token index within it) of global q block `qblock`.

    Request i's first q block is qsl[i] // BQ + i (qsl[i] when BQ is 1: a block is a token, and no
    request needs a partial block), increasing in i, so the request is the number of i in
    [1, num_seqs) whose first block is <= qblock (with BQ 1, an empty request shares its start with
    the next, which counts too and owns the token). Counted over vector loads of
    _LOCATE_SPAN start offsets: one load round trip for up to that many requests, where a binary
    search makes log2(num_seqs) dependent ones, which a program with a large tile (one resident
    per SM) cannot hide behind other programs' work."""
    lo = num_seqs * 0
    for s0 in range(1, num_seqs, _LOCATE_SPAN):
        i = s0 + tl.arange(0, _LOCATE_SPAN)
        live = i < num_seqs
        if BQ == 1:
            ok = live & (tl.load(qsl_ptr + i, mask=live, other=0) <= qblock)
        else:
            ok = live & (tl.load(qsl_ptr + i, mask=live, other=0) // BQ + i <= qblock)
        lo += tl.sum(ok.to(tl.int32), axis=0)
    q_start = tl.load(qsl_ptr + lo)
    tok0 = qblock - q_start if BQ == 1 else (qblock - (q_start // BQ + lo)) * BQ
    return lo, q_start, tok0


@triton.jit
def _slice_token_base(qsl_ptr, num_seqs, block_base, BQ: tl.constexpr):
    """First flat token index covered by the slice starting at q block `block_base`."""
    seq, q_start, tok0 = _locate(qsl_ptr, num_seqs, block_base, BQ)
    return tl.minimum(q_start + tok0, tl.load(qsl_ptr + seq + 1))


@triton.jit
def partial_rows(qsl_ptr, num_seqs, block_base, q_start, tok, head, n_heads, n_chunks, BQ: tl.constexpr):
    """Workspace index of chunk 0 of each tile row's partials (rows of this slice of q blocks)."""
    tok_base = _slice_token_base(qsl_ptr, num_seqs, block_base, BQ)
    return ((q_start + tok - tok_base).to(tl.int64) * n_heads + head) * n_chunks


@triton.jit
def _tile_rows(kvh_split, tok0, q_len, GROUP: tl.constexpr, HB: tl.constexpr, BLOCK_M: tl.constexpr,
               BQ: tl.constexpr, N_HSPLIT: tl.constexpr):
    """Row r of a tile: token tok0 + r // HB, query head of this tile's head slice r % HB."""
    kvh = kvh_split // N_HSPLIT
    rows = tl.arange(0, BLOCK_M)
    tok = tok0 + rows // HB
    head = kvh * GROUP + (kvh_split % N_HSPLIT) * HB + rows % HB
    row_ok = (rows < BQ * HB) & (tok < q_len)
    return kvh, tok, head, row_ok


@triton.jit(do_not_specialize=["sbt", "num_seqs", "block_base", "window", "n_chunks"])
def _attn_chunk_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, qsl_ptr, sl_ptr, pacc_ptr, pm_ptr, pl_ptr,
                       sqt, sqh, skb, sks, skh, svb, svs, svh, sbt,
                       num_seqs, block_base, scale_log2, window, n_heads, n_chunks,
                       GROUP: tl.constexpr, HB: tl.constexpr, N_HSPLIT: tl.constexpr,
                       BLOCK_M: tl.constexpr, BQ: tl.constexpr,
                       BLOCK_N: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                       DV: tl.constexpr, BLOCK_DV: tl.constexpr, CHUNK: tl.constexpr,
                       PAGE: tl.constexpr, HAS_WINDOW: tl.constexpr, PRECISION: tl.constexpr):
    qblock = block_base + tl.program_id(0)
    c = tl.program_id(2)
    seq, q_start, tok0 = _locate(qsl_ptr, num_seqs, qblock, BQ)
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
    if (n_tok > 0) & (kv_lo < kv_hi):
        kvh, tok, head, row_ok = _tile_rows(tl.program_id(1), tok0, q_len, GROUP, HB, BLOCK_M, BQ, N_HSPLIT)
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
            s = tl.dot(q, k, input_precision=PRECISION)
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
            v = tl.load(v_ptr + v_off[:, None] + dv[None, :], mask=n_ok[:, None] & (dv < DV)[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        w = partial_rows(qsl_ptr, num_seqs, block_base, q_start, tok, head, n_heads, n_chunks, BQ) + c
        tl.store(pm_ptr + w, m_i, mask=row_ok)
        tl.store(pl_ptr + w, l_i, mask=row_ok)
        tl.store(pacc_ptr + w[:, None] * DV + dv[None, :], acc, mask=row_ok[:, None] & (dv < DV)[None, :])


@triton.jit
def _load_partial(pacc_ptr, pm_ptr, pl_ptr, w_row, c, use, dv, DV: tl.constexpr, CACHE: tl.constexpr):
    """Chunk c's (m, l, acc slice) of each row; rows not using it read (-inf, 0, 0), an exact
    no-op in _merge_partial."""
    m_c = tl.load(pm_ptr + w_row + c, mask=use, other=float("-inf"), cache_modifier=CACHE)
    l_c = tl.load(pl_ptr + w_row + c, mask=use, other=0.0, cache_modifier=CACHE)
    a_c = tl.load(pacc_ptr + (w_row + c)[:, None] * DV + dv[None, :], mask=use[:, None] & (dv < DV)[None, :],
                  other=0.0, cache_modifier=CACHE)
    return m_c, l_c, a_c


@triton.jit
def _merge_partial(m_run, l_run, acc, m_c, l_c, a_c):
    m_new = tl.maximum(m_run, m_c)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_run - m_safe)
    beta = tl.exp2(m_c - m_safe)
    return m_new, l_run * alpha + l_c * beta, acc * alpha[:, None] + a_c * beta[:, None]


@triton.jit
def merge_rows(out_ptr, sot, soh, pacc_ptr, pm_ptr, pl_ptr, w_row, q_start, tok, head, row_ok, ctx, tok0, n_tok,
               window, dv, DV: tl.constexpr, DV_SLICE: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
               HAS_WINDOW: tl.constexpr, CACHE: tl.constexpr):
    """Merge a tile's rows' chunk partials, value columns `dv`, and store the normalised output.

    Each row's chunks are merged one at a time in increasing order, a fixed function of the row.
    The loads of four consecutive chunks are issued before their four merges (a chunk a row does
    not use is an exact no-op), so a program waits on one memory round trip per four chunks
    instead of one per chunk, without changing any arithmetic. CACHE is the partials' load cache
    modifier (".cg" when other programs of the same launch wrote them)."""
    pos = ctx + tok
    c_last = pos // CHUNK
    c_first = pos * 0
    c_begin = 0
    if HAS_WINDOW:
        c_first = tl.maximum(pos - window + 1, 0) // CHUNK
        c_begin = tl.maximum(ctx + tok0 - window + 1, 0) // CHUNK
    c_end = (ctx + tok0 + n_tok - 1) // CHUNK + 1
    m_run = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_run = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV_SLICE], tl.float32)
    for c in range(c_begin, c_end, 4):
        # c_last < c_end, so chunks past the end are masked out like any unused chunk.
        m0, l0, a0 = _load_partial(pacc_ptr, pm_ptr, pl_ptr, w_row, c, row_ok & (c >= c_first) & (c <= c_last),
                                   dv, DV, CACHE)
        m1, l1, a1 = _load_partial(pacc_ptr, pm_ptr, pl_ptr, w_row, c + 1,
                                   row_ok & (c + 1 >= c_first) & (c + 1 <= c_last), dv, DV, CACHE)
        m2, l2, a2 = _load_partial(pacc_ptr, pm_ptr, pl_ptr, w_row, c + 2,
                                   row_ok & (c + 2 >= c_first) & (c + 2 <= c_last), dv, DV, CACHE)
        m3, l3, a3 = _load_partial(pacc_ptr, pm_ptr, pl_ptr, w_row, c + 3,
                                   row_ok & (c + 3 >= c_first) & (c + 3 <= c_last), dv, DV, CACHE)
        m_run, l_run, acc = _merge_partial(m_run, l_run, acc, m0, l0, a0)
        m_run, l_run, acc = _merge_partial(m_run, l_run, acc, m1, l1, a1)
        m_run, l_run, acc = _merge_partial(m_run, l_run, acc, m2, l2, a2)
        m_run, l_run, acc = _merge_partial(m_run, l_run, acc, m3, l3, a3)
    out = acc / tl.where(row_ok, l_run, 1.0)[:, None]
    o_rows = (q_start + tok).to(tl.int64) * sot + head * soh
    tl.store(out_ptr + o_rows[:, None] + dv[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (dv < DV)[None, :])


@triton.jit(do_not_specialize=["num_seqs", "block_base", "window", "n_chunks"])
def _combine_kernel(out_ptr, qsl_ptr, sl_ptr, pacc_ptr, pm_ptr, pl_ptr, sot, soh,
                    num_seqs, block_base, window, n_heads, n_chunks,
                    GROUP: tl.constexpr, HB: tl.constexpr, N_HSPLIT: tl.constexpr,
                    BLOCK_M: tl.constexpr, BQ: tl.constexpr,
                    DV: tl.constexpr, DV_SLICE: tl.constexpr, CHUNK: tl.constexpr,
                    HAS_WINDOW: tl.constexpr):
    """Grid (q blocks, head slices, DV / DV_SLICE): merges one slice of the value columns of a
    tile's rows (splitting the columns over programs changes no arithmetic)."""
    qblock = block_base + tl.program_id(0)
    seq, q_start, tok0 = _locate(qsl_ptr, num_seqs, qblock, BQ)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    ctx = tl.load(sl_ptr + seq) - q_len
    n_tok = tl.minimum(q_len - tok0, BQ)
    if n_tok > 0:
        _, tok, head, row_ok = _tile_rows(tl.program_id(1), tok0, q_len, GROUP, HB, BLOCK_M, BQ, N_HSPLIT)
        w_row = partial_rows(qsl_ptr, num_seqs, block_base, q_start, tok, head, n_heads, n_chunks, BQ)
        dv = tl.program_id(2) * DV_SLICE + tl.arange(0, DV_SLICE)
        merge_rows(out_ptr, sot, soh, pacc_ptr, pm_ptr, pl_ptr, w_row, q_start, tok, head, row_ok, ctx, tok0, n_tok,
                   window, dv, DV, DV_SLICE, BLOCK_M, CHUNK, HAS_WINDOW, "")


def combine_slice(block_m: int, dv: int, per_chunk: int = 2048) -> int:
    """Value columns per merge program: at most `per_chunk` float32 per loaded chunk of a tile
    (2048 for the merge kernel: four chunks in flight stay within the registers), at least 16."""
    return max(16, min(next_pow2(dv), per_chunk // block_m))


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, query_start_loc: torch.Tensor,
           seq_lens: torch.Tensor, block_tables: torch.Tensor, sliding_window: int | None,
           kv_chunk: int, max_seq_len: int | None) -> None:
    check_tensor("q", q, dtypes=FLOAT_DTYPES, ndim=3, last_dim_contiguous=True)
    check_tensor("k_cache", k_cache, dtypes=(q.dtype,), ndim=4, last_dim_contiguous=True)
    check_tensor("v_cache", v_cache, dtypes=(q.dtype,), ndim=4, last_dim_contiguous=True)
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
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, query_start_loc=query_start_loc,
                      seq_lens=seq_lens, block_tables=block_tables)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                    scale: float, sliding_window: int | None = None, max_seq_len: int | None = None,
                    kv_chunk: int = KV_CHUNK, block_n: int = BLOCK_N, num_warps: int = 4,
                    num_stages: int = 2) -> torch.Tensor:
    """Causal GQA attention of a flat varlen batch over a paged KV cache (after this step's store).

    q [T, Hq, D] float32/float16/bfloat16 (last dim contiguous); k_cache [num_blocks, block_size,
    Hk, D] and v_cache [..., Hk, Dv] of q's dtype; query_start_loc [B + 1], seq_lens [B] and
    block_tables [B, max_blocks], all int32 on q's device. Request s's queries are
    q[qsl[s]:qsl[s+1]], at absolute positions seq_lens[s] - q_len .. seq_lens[s] - 1.
    max_seq_len (the largest seq_lens entry) sizes the chunk grid; pass it to avoid a device
    sync. Returns [T, Hq, Dv] in q's dtype. Results do not depend on the rest of the batch; they
    do depend on kv_chunk and the tile config (block_n, num_warps, num_stages), which must
    therefore be fixed per deployment, never chosen per batch.
    """
    _check(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, sliding_window, kv_chunk, max_seq_len)
    if max(q.shape[-1], v_cache.shape[-1]) > 256:
        raise fail("head dim", max(q.shape[-1], v_cache.shape[-1]), "need <= 256")
    hk = k_cache.shape[2]
    group = q.shape[1] // hk
    return launch(q, k_cache, v_cache, (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2)),
                  (v_cache.stride(0), v_cache.stride(1), v_cache.stride(2)), hk, q.shape[-1],
                  v_cache.shape[-1], query_start_loc, seq_lens, block_tables, scale, sliding_window,
                  max_seq_len, kv_chunk, max(_MIN_BLOCK_M, next_pow2(group)), block_n, num_warps, num_stages)


def launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           k_strides: tuple[int, int, int], v_strides: tuple[int, int, int], hk: int, d: int, dv: int,
           query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float,
           sliding_window: int | None, max_seq_len: int | None, kv_chunk: int, block_m: int, block_n: int,
           num_warps: int, num_stages: int) -> torch.Tensor:
    """Shared launcher of the two phases (inputs already validated by the public wrappers).

    k/v strides are (block, slot, kv head).
    """
    if block_n not in (16, 32, 64, 128) or kv_chunk % block_n:
        raise fail("block_n", block_n, f"need 16, 32, 64 or 128, dividing kv_chunk={kv_chunk}")
    window = int(sliding_window) if sliding_window is not None else 0
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    page = k_cache.shape[1]

    def phase1(grid: tuple[int, int, int], base: int, ws: Workspace, common: dict[str, object]) -> None:
        _attn_chunk_kernel[grid](
            q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, ws.acc, ws.m, ws.l,
            q.stride(0), q.stride(1), *k_strides, *v_strides,
            block_tables.stride(0), seq_lens.shape[0], base, float(scale) * _LOG2E, window, q.shape[1],
            ws.n_chunks, BLOCK_N=block_n, D=d, BLOCK_D=max(16, next_pow2(d)), DV=dv,
            BLOCK_DV=max(16, next_pow2(dv)), PAGE=page, PRECISION=precision,
            num_warps=num_warps, num_stages=num_stages, **common)

    return two_phase(q, hk, dv, query_start_loc, seq_lens, max_seq_len, kv_chunk, block_m, sliding_window, phase1)


@dataclass
class Workspace:
    """Phase 1's float32 partials of one slice of q blocks: acc [rows, Hq, chunks, Dv], m and l
    [rows, Hq, chunks]. With the merge in phase 1 also the output and one arrival counter per
    (q block, head slice) of the slice (`launch_counters`: 0 at the start, reset by the merger)."""

    acc: torch.Tensor
    m: torch.Tensor
    l: torch.Tensor  # noqa: E741 (the softmax denominator's usual name)
    n_chunks: int
    out: torch.Tensor
    counters: torch.Tensor | None


def two_phase(q: torch.Tensor, hk: int, dv: int, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
              max_seq_len: int | None, kv_chunk: int, block_m: int, sliding_window: int | None,
              phase1: Callable[[tuple[int, int, int], int, Workspace, dict[str, object]], None],
              merge_in_phase1: bool = False) -> torch.Tensor:
    """Run a chunk kernel (`phase1(grid, first q block, workspace, tile constants)`) over slices of
    q blocks, each followed by the in-order merge of its chunks; returns out [T, Hq, Dv].

    The tile geometry (heads per tile, q-block length, head slices) and the workspace layout come
    from here, so every chunk kernel writing this layout shares the merge and its invariance.
    merge_in_phase1: the chunk kernel merges itself (the last of a tile's chunk programs to
    finish calls merge_rows, see mla_decode), so no merge kernel is launched.
    """
    t, hq = q.shape[0], q.shape[1]
    b = seq_lens.shape[0]
    out = torch.empty(t, hq, dv, dtype=q.dtype, device=q.device)
    if t == 0 or b == 0:
        return out
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item())
    n_chunks = max(1, -(-max_seq_len // kv_chunk))
    group = hq // hk
    hb = heads_per_tile(group, block_m)
    bq = block_m // hb
    n_hsplit = group // hb
    n_qblocks = t if bq == 1 else t // bq + b  # see _locate
    per_token = hq * n_chunks * (dv + 2) * 4
    slice_blocks = max(1, min(n_qblocks, _WORKSPACE_BYTES // max(1, per_token * bq)))
    ws_rows = min(t, slice_blocks * bq)
    pm = torch.empty(ws_rows, hq, n_chunks, dtype=torch.float32, device=q.device)
    counters = launch_counters(q.device, slice_blocks * hk * n_hsplit) if merge_in_phase1 else None
    ws = Workspace(torch.empty(ws_rows, hq, n_chunks, dv, dtype=torch.float32, device=q.device), pm,
                   torch.empty_like(pm), n_chunks, out, counters)
    window = int(sliding_window) if sliding_window is not None else 0
    common: dict[str, object] = dict(GROUP=group, HB=hb, N_HSPLIT=n_hsplit, BLOCK_M=block_m, BQ=bq, CHUNK=kv_chunk,
                                     HAS_WINDOW=sliding_window is not None)
    dv_slice = combine_slice(block_m, dv)
    for base in range(0, n_qblocks, slice_blocks):
        n = min(slice_blocks, n_qblocks - base)
        phase1((n, hk * n_hsplit, n_chunks), base, ws, common)
        if merge_in_phase1:
            continue
        _combine_kernel[(n, hk * n_hsplit, triton.cdiv(dv, dv_slice))](
            out, query_start_loc, seq_lens, ws.acc, ws.m, ws.l, out.stride(0), out.stride(1),
            b, base, window, hq, n_chunks, DV=dv, DV_SLICE=dv_slice, num_warps=4, **common)
    return out


def heads_per_tile(group: int, block_m: int) -> int:
    """The whole GQA group in one tile when it fits, else the largest power of two dividing it."""
    if group <= block_m:
        return group
    hb = block_m
    while group % hb:
        hb //= 2
    return hb
