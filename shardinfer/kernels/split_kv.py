"""Split-KV attention's shared half: the tile layout, the partials workspace and the merge.

Paged attention (paged_attention.py) and absorbed MLA (mla_decode.py) both cut each row's keys
into chunks of a fixed length of absolute positions, run an online softmax per chunk (their own
phase-1 kernels) and write each row's unnormalised partial (m, l, acc) per chunk to a float32
workspace; this module then merges a row's chunks in increasing chunk order, a fixed function of
the row, so the result does not depend on the batch. Both kernels share from here:

    locate / tile_rows / partial_rows   which request, tokens, heads and workspace rows a
                                        program's tile covers (q blocks, head slices)
    Workspace, two_phase                the workspace layout and the driver: phase 1 over slices
                                        of q blocks, each followed by the merge (merge_kernel),
                                        or with the merge inside phase 1 (merge_in_phase1)
    merge_rows                          the in-order merge itself, called by merge_kernel or by
                                        a chunk kernel's last program of a tile (mla_decode)

The merge's arithmetic is one function (merge_rows) whichever kernel runs it, so merging in
phase 1 or in a second kernel gives the same bits. The layout and invariance argument is in
paged_attention.py's docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from shardinfer.kernels._common import next_pow2
from shardinfer.kernels.launch_counters import launch_counters

# Upper bound on the phase-1 workspace per launch; larger batches are processed in slices of
# q blocks (the slicing changes which launch a row lands in, never its arithmetic).
WORKSPACE_BYTES = 256 << 20
_LOCATE_SPAN: tl.constexpr = tl.constexpr(256)  # request offsets locate reads per vector load


@triton.jit
def locate(qsl_ptr, num_seqs, qblock, BQ: tl.constexpr):
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
    seq, q_start, tok0 = locate(qsl_ptr, num_seqs, block_base, BQ)
    return tl.minimum(q_start + tok0, tl.load(qsl_ptr + seq + 1))


@triton.jit
def partial_rows(qsl_ptr, num_seqs, block_base, q_start, tok, head, n_heads, n_chunks, BQ: tl.constexpr):
    """Workspace index of chunk 0 of each tile row's partials (rows of this slice of q blocks)."""
    tok_base = _slice_token_base(qsl_ptr, num_seqs, block_base, BQ)
    return ((q_start + tok - tok_base).to(tl.int64) * n_heads + head) * n_chunks


@triton.jit
def tile_rows(
    kvh_split,
    tok0,
    q_len,
    GROUP: tl.constexpr,
    HB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BQ: tl.constexpr,
    N_HSPLIT: tl.constexpr,
):
    """Row r of a tile: token tok0 + r // HB, query head of this tile's head slice r % HB."""
    kvh = kvh_split // N_HSPLIT
    rows = tl.arange(0, BLOCK_M)
    tok = tok0 + rows // HB
    head = kvh * GROUP + (kvh_split % N_HSPLIT) * HB + rows % HB
    row_ok = (rows < BQ * HB) & (tok < q_len)
    return kvh, tok, head, row_ok


@triton.jit
def first_row_generated(plen_ptr, seq, ctx, tok0):
    """Whether a tile's first row (token tok0 after ctx cached ones) sits at or after its request's
    prompt length: then every row of the tile does, and with prompt lengths given the chunk kernel
    and the merge both skip it (paged_attention_fma writes those rows; the two must agree)."""
    return ctx + tok0 >= tl.load(plen_ptr + seq)


@triton.jit
def ends_in_first_chunk(ctx, tok0, n_tok, CHUNK: tl.constexpr):
    """Whether every row of a tile (tokens tok0 .. tok0 + n_tok - 1 after ctx cached ones) ends in
    KV chunk 0: the chunk kernel then writes it itself and the merge skips it (the two must agree)."""
    return ctx + tok0 + n_tok - 1 < CHUNK


@triton.jit
def _load_partial(pacc_ptr, pm_ptr, pl_ptr, w_row, c, use, dv, DV: tl.constexpr, CACHE: tl.constexpr):
    """Chunk c's (m, l, acc slice) of each row; rows not using it read (-inf, 0, 0), an exact
    no-op in _merge_partial."""
    m_c = tl.load(pm_ptr + w_row + c, mask=use, other=float("-inf"), cache_modifier=CACHE)
    l_c = tl.load(pl_ptr + w_row + c, mask=use, other=0.0, cache_modifier=CACHE)
    a_c = tl.load(
        pacc_ptr + (w_row + c)[:, None] * DV + dv[None, :],
        mask=use[:, None] & (dv < DV)[None, :],
        other=0.0,
        cache_modifier=CACHE,
    )
    return m_c, l_c, a_c


@triton.jit
def _merge_partial(m_run, l_run, acc, m_c, l_c, a_c):
    m_new = tl.maximum(m_run, m_c)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_run - m_safe)
    beta = tl.exp2(m_c - m_safe)
    return m_new, l_run * alpha + l_c * beta, acc * alpha[:, None] + a_c * beta[:, None]


@triton.jit
def merge_rows(
    out_ptr,
    sot,
    soh,
    pacc_ptr,
    pm_ptr,
    pl_ptr,
    w_row,
    q_start,
    tok,
    head,
    row_ok,
    ctx,
    tok0,
    n_tok,
    window,
    dv,
    DV: tl.constexpr,
    DV_SLICE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    CACHE: tl.constexpr,
):
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
        m0, l0, a0 = _load_partial(
            pacc_ptr, pm_ptr, pl_ptr, w_row, c, row_ok & (c >= c_first) & (c <= c_last), dv, DV, CACHE
        )
        m1, l1, a1 = _load_partial(
            pacc_ptr,
            pm_ptr,
            pl_ptr,
            w_row,
            c + 1,
            row_ok & (c + 1 >= c_first) & (c + 1 <= c_last),
            dv,
            DV,
            CACHE,
        )
        m2, l2, a2 = _load_partial(
            pacc_ptr,
            pm_ptr,
            pl_ptr,
            w_row,
            c + 2,
            row_ok & (c + 2 >= c_first) & (c + 2 <= c_last),
            dv,
            DV,
            CACHE,
        )
        m3, l3, a3 = _load_partial(
            pacc_ptr,
            pm_ptr,
            pl_ptr,
            w_row,
            c + 3,
            row_ok & (c + 3 >= c_first) & (c + 3 <= c_last),
            dv,
            DV,
            CACHE,
        )
        m_run, l_run, acc = _merge_partial(m_run, l_run, acc, m0, l0, a0)
        m_run, l_run, acc = _merge_partial(m_run, l_run, acc, m1, l1, a1)
        m_run, l_run, acc = _merge_partial(m_run, l_run, acc, m2, l2, a2)
        m_run, l_run, acc = _merge_partial(m_run, l_run, acc, m3, l3, a3)
    store_rows(out_ptr, sot, soh, q_start, tok, head, row_ok, acc, l_run, dv, DV)


@triton.jit
def store_rows(out_ptr, sot, soh, q_start, tok, head, row_ok, acc, l_run, dv, DV: tl.constexpr):
    """The normalised output acc / l of a tile's rows, value columns `dv` (the one division both
    the merge and a chunk kernel writing a one-chunk tile itself use, so they round alike)."""
    out = acc / tl.where(row_ok, l_run, 1.0)[:, None]
    o_rows = (q_start + tok).to(tl.int64) * sot + head * soh
    tl.store(
        out_ptr + o_rows[:, None] + dv[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & (dv < DV)[None, :],
    )


@triton.jit(do_not_specialize=["num_seqs", "block_base", "window", "n_chunks"])
def merge_kernel(
    out_ptr,
    qsl_ptr,
    sl_ptr,
    plen_ptr,
    pacc_ptr,
    pm_ptr,
    pl_ptr,
    sot,
    soh,
    num_seqs,
    block_base,
    window,
    n_heads,
    n_chunks,
    GROUP: tl.constexpr,
    HB: tl.constexpr,
    N_HSPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BQ: tl.constexpr,
    DV: tl.constexpr,
    DV_SLICE: tl.constexpr,
    CHUNK: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    SKIP_ONE_CHUNK: tl.constexpr,
    SKIP_GENERATED: tl.constexpr,
):
    """Grid (q blocks, head slices, DV / DV_SLICE): merges one slice of the value columns of a
    tile's rows (splitting the columns over programs changes no arithmetic). SKIP_ONE_CHUNK: the
    chunk kernel wrote the tiles whose rows all end in the first chunk itself. SKIP_GENERATED: the
    tiles of generated rows are another kernel's (first_row_generated; plen_ptr: prompt lengths)."""
    qblock = block_base + tl.program_id(0)
    seq, q_start, tok0 = locate(qsl_ptr, num_seqs, qblock, BQ)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    ctx = tl.load(sl_ptr + seq) - q_len
    n_tok = tl.minimum(q_len - tok0, BQ)
    todo = n_tok > 0
    if SKIP_ONE_CHUNK:
        todo = todo & ~ends_in_first_chunk(ctx, tok0, n_tok, CHUNK)
    if SKIP_GENERATED:
        todo = todo & ~first_row_generated(plen_ptr, seq, ctx, tok0)
    if todo:
        _, tok, head, row_ok = tile_rows(tl.program_id(1), tok0, q_len, GROUP, HB, BLOCK_M, BQ, N_HSPLIT)
        w_row = partial_rows(qsl_ptr, num_seqs, block_base, q_start, tok, head, n_heads, n_chunks, BQ)
        dv = tl.program_id(2) * DV_SLICE + tl.arange(0, DV_SLICE)
        merge_rows(
            out_ptr,
            sot,
            soh,
            pacc_ptr,
            pm_ptr,
            pl_ptr,
            w_row,
            q_start,
            tok,
            head,
            row_ok,
            ctx,
            tok0,
            n_tok,
            window,
            dv,
            DV,
            DV_SLICE,
            BLOCK_M,
            CHUNK,
            HAS_WINDOW,
            "",
        )


def combine_slice(block_m: int, dv: int, per_chunk: int = 2048) -> int:
    """Value columns per merge program: at most `per_chunk` float32 per loaded chunk of a tile
    (2048 for the merge kernel: four chunks in flight stay within the registers), at least 16."""
    return max(16, min(next_pow2(dv), per_chunk // block_m))


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


def two_phase(
    q: torch.Tensor,
    hk: int,
    dv: int,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int | None,
    kv_chunk: int,
    block_m: int,
    sliding_window: int | None,
    phase1: Callable[[tuple[int, int, int], int, Workspace, dict[str, object]], None],
    merge_in_phase1: bool = False,
    single_chunk_direct: bool = False,
    prompt_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run a chunk kernel (`phase1(grid, first q block, workspace, tile constants)`) over slices of
    q blocks, each followed by the in-order merge of its chunks; returns out [T, Hq, Dv].

    The tile geometry (heads per tile, q-block length, head slices) and the workspace layout come
    from here, so every chunk kernel writing this layout shares the merge and its invariance.
    merge_in_phase1: the chunk kernel merges itself (the last of a tile's chunk programs to
    finish calls merge_rows, see mla_decode), so no merge kernel is launched.
    single_chunk_direct: the chunk kernel writes a tile whose rows all end in the first chunk to
    `out` itself (store_rows), and the merge skips it.
    prompt_lens [B] int32: the merge skips the tiles whose rows are all generated tokens
    (first_row_generated), which the chunk kernel must skip too; their rows of `out` are left
    unwritten for the caller.
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
    n_qblocks = t if bq == 1 else t // bq + b  # see locate
    per_token = hq * n_chunks * (dv + 2) * 4
    slice_blocks = max(1, min(n_qblocks, WORKSPACE_BYTES // max(1, per_token * bq)))
    ws_rows = min(t, slice_blocks * bq)
    pm = torch.empty(ws_rows, hq, n_chunks, dtype=torch.float32, device=q.device)
    counters = launch_counters(q.device, slice_blocks * hk * n_hsplit) if merge_in_phase1 else None
    ws = Workspace(
        torch.empty(ws_rows, hq, n_chunks, dv, dtype=torch.float32, device=q.device),
        pm,
        torch.empty_like(pm),
        n_chunks,
        out,
        counters,
    )
    window = int(sliding_window) if sliding_window is not None else 0
    common: dict[str, object] = dict(
        GROUP=group,
        HB=hb,
        N_HSPLIT=n_hsplit,
        BLOCK_M=block_m,
        BQ=bq,
        CHUNK=kv_chunk,
        HAS_WINDOW=sliding_window is not None,
    )
    dv_slice = combine_slice(block_m, dv)
    for base in range(0, n_qblocks, slice_blocks):
        n = min(slice_blocks, n_qblocks - base)
        phase1((n, hk * n_hsplit, n_chunks), base, ws, common)
        # With one chunk every tile ends in it, so a chunk kernel that writes such tiles leaves the
        # merge nothing to do.
        if merge_in_phase1 or (single_chunk_direct and n_chunks == 1):
            continue
        merge_kernel[(n, hk * n_hsplit, triton.cdiv(dv, dv_slice))](
            out,
            query_start_loc,
            seq_lens,
            prompt_lens if prompt_lens is not None else seq_lens,
            ws.acc,
            ws.m,
            ws.l,
            out.stride(0),
            out.stride(1),
            b,
            base,
            window,
            hq,
            n_chunks,
            DV=dv,
            DV_SLICE=dv_slice,
            SKIP_ONE_CHUNK=single_chunk_direct,
            SKIP_GENERATED=prompt_lens is not None,
            num_warps=4,
            **common,
        )
    return out


def heads_per_tile(group: int, block_m: int) -> int:
    """The whole GQA group in one tile when it fits, else the largest power of two dividing it."""
    if group <= block_m:
        return group
    hb = block_m
    while group % hb:
        hb //= 2
    return hb
