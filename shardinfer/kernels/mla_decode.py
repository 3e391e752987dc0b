"""Multi-head latent attention (MLA) over the paged latent cache, in the weight-absorbed form.

    q_latent [T, H, R]   q_nope folded through W_UK: one R-wide (512) query per head
    q_pe     [T, H, Dr]  roped part of the query (64)
    cache    [num_blocks, block_size, R + Dr]: per token [latent c | roped shared key k_pe]
    out      [T, H, R]   sum_j p_hj c_j (the caller applies W_UV afterwards)

    score_hj = (q_latent_h . c_j + q_pe_h . k_pe_j) * scale

This is multi-query attention with a single 576-wide key head whose first R columns are also
the value. It runs on the two-phase, fixed-chunk machinery it shares with paged attention
(split_kv.py, `split_kv.two_phase`: same
causal varlen semantics, same workspace, same in-order chunk merge, same batch invariance
argument) with its own chunk kernel, shaped for the latent:

* a key tile is BLOCK_N consecutive cache rows, loaded once and used for the scores (three
  dots: both halves of the latent and the rope part) and again, as is, for the values;
* the latent is handled as two R/2-wide halves with one float32 accumulator each, so no
  operand is wider than 256 columns (the tensor-memory accelerator's box limit, and half the
  registers per accumulator);
* with `tma=True` (Hopper and later; measured slower, so off by default) the three operand tiles come through TMA descriptors over
  the cache seen as [num_blocks * block_size, R + Dr]; a tile then must not cross a page
  (block_size % BLOCK_N == 0), and rows past the sequence's last key, which hold whatever the
  pool has there, are zeroed before the value product (their scores are masked to -inf);
* a tile holds BLOCK_M (token, head) rows; with 16 heads (the moe-16b shape) a decode token
  fills one tile exactly;
* the chunks are merged inside the chunk kernel (`merge=True`, the default): each of a tile's
  chunk programs, once its partial is stored, counts itself in on an arrival counter
  (`launch_counters`), and the last to arrive runs the in-order merge
  (`split_kv.merge_rows`, the merge kernel's own code, so the same bits) and resets the counter. This
  saves the merge kernel's launch and its dependent loads at the end of every call.

Why it is batch invariant: a row's result is a fixed function of its own keys, cut into chunks
and tiles at absolute positions; masked keys leave (m, l, acc) bit-for-bit unchanged (see
paged_attention's docstring), and MMA rows do not mix. The tile config, kv_chunk and the TMA
switch fix the rounding: keep them constant per deployment.
Semantics = reference_mla.mla_paged_attention; only rounding differs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from shardinfer.kernels import paged_attention as pa
from shardinfer.kernels import split_kv
from shardinfer.kernels._common import (
    FLOAT_DTYPES,
    check_same_device,
    check_tensor,
    fail,
    interpreting,
    next_pow2,
    sm_count,
)
from shardinfer.kernels._opaque import opaque
from shardinfer.kernels.reference_fp8 import FP8_DTYPE, GROUP

# Tile config, fixed because it fixes the rounding. Chosen by bench/kernels/bench_kernels.py's MLA
# sweep, timed as CUDA-graph replays (the numbers: bench/kernels/NOTES.md, "MLA decode"): 64-key
# pointer tiles, 4 warps and 1024-key chunks read the latent fastest (against 512-key chunks and
# 8 warps). The pipeline depth does not change the arithmetic: 3 stages when the (q block, chunk)
# programs fit in one wave (no more than SMs: each SM runs one program and must keep more of its
# own loads in flight), 2 when there are several waves; see pipeline_stages. An FP8 cache runs one
# stage at every batch: its raw tile then goes from global memory straight to registers and the
# kernel's shared memory shrinks enough for two programs to share an SM, which on the H200 was the
# faster depth at every batch and context timed (bench/kernels/NOTES.md, "One stage for the FP8
# cache").
MLA_BLOCK_M = 16
MLA_BLOCK_N = 64
MLA_NUM_WARPS = 4
MLA_NUM_STAGES = 2
MLA_NUM_STAGES_ONE_WAVE = 3
MLA_FP8_NUM_STAGES = 1
MLA_KV_CHUNK = 1024
MLA_PAGE_PREFETCH = True
# The last chunk program of a tile merges the tile's chunks (no second kernel; same arithmetic as
# split_kv's merge kernel, so the same bits).
MLA_MERGE_IN_KERNEL = True
_LOG2E = 1.4426950408889634


@triton.jit
def _dequantise(x, scale, out_dtype: tl.constexpr, OPAQUE: tl.constexpr):
    """e4m3 values times their power-of-two scales: in float32, then rounded once to out_dtype, as
    the dequantised cache is (exact but for float16's range). OPAQUE gives the tile a 16-bit tile's
    MMA layout (kernels/_opaque.py); bfloat16 arithmetic and per-column scale selection measured
    slower (bench/kernels/NOTES.md, "Three ways of dequantising")."""
    y = (x.to(tl.float32) * scale).to(out_dtype)
    if OPAQUE:  # not under the interpreter, which runs no inline assembly (and has no layouts)
        y = opaque(y)
    return y


@triton.jit(do_not_specialize=["sbt", "num_seqs", "block_base", "n_chunks"])
def _mla_chunk_kernel(
    q_ptr,
    qpe_ptr,
    c_ptr,
    cs_ptr,
    lat_desc,
    pe_desc,
    bt_ptr,
    qsl_ptr,
    sl_ptr,
    pacc_ptr,
    pm_ptr,
    pl_ptr,
    out_ptr,
    cnt_ptr,
    sqt,
    sqh,
    spt,
    sph,
    sot,
    soh,
    sbt,
    num_seqs,
    block_base,
    scale_log2,
    n_heads,
    n_chunks,
    GROUP: tl.constexpr,
    HB: tl.constexpr,
    N_HSPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BQ: tl.constexpr,
    CHUNK: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RH: tl.constexpr,
    DPE: tl.constexpr,
    PAGE: tl.constexpr,
    PRECISION: tl.constexpr,
    TMA: tl.constexpr,
    CHUNK_PAGES: tl.constexpr,
    PAGE_PREFETCH: tl.constexpr,
    MERGE: tl.constexpr,
    DV_SLICE: tl.constexpr,
    KV_FP8: tl.constexpr,
    NG: tl.constexpr,
    OPAQUE: tl.constexpr,
):
    qblock = block_base + tl.program_id(0)
    c = tl.program_id(2)
    seq, q_start, tok0 = split_kv.locate(qsl_ptr, num_seqs, qblock, BQ)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    ctx = tl.load(sl_ptr + seq) - q_len
    n_tok = tl.minimum(q_len - tok0, BQ)
    kv_lo = c * CHUNK
    kv_hi = tl.minimum(c * CHUNK + CHUNK, ctx + tok0 + n_tok)
    _, tok, head, row_ok = split_kv.tile_rows(tl.program_id(1), tok0, q_len, GROUP, HB, BLOCK_M, BQ, N_HSPLIT)
    if (n_tok > 0) & (kv_lo < kv_hi):
        pos = ctx + tok
        h = tl.arange(0, RH)
        e = tl.arange(0, DPE)
        q_rows = (q_start + tok).to(tl.int64) * sqt + head * sqh
        q_lo = tl.load(q_ptr + q_rows[:, None] + h[None, :], mask=row_ok[:, None], other=0.0)
        q_hi = tl.load(q_ptr + q_rows[:, None] + RH + h[None, :], mask=row_ok[:, None], other=0.0)
        pe_rows = (q_start + tok).to(tl.int64) * spt + head * sph
        q_pe = tl.load(qpe_ptr + pe_rows[:, None] + e[None, :], mask=row_ok[:, None], other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc_lo = tl.zeros([BLOCK_M, RH], tl.float32)
        acc_hi = tl.zeros([BLOCK_M, RH], tl.float32)
        # The chunk's page ids, read once: no key tile's address then waits on a block-table load.
        first_page = kv_lo // PAGE
        pslot = tl.arange(0, CHUNK_PAGES)
        bt_row = bt_ptr + seq.to(tl.int64) * sbt
        chunk_pages = tl.load(
            bt_row + first_page + pslot, mask=(first_page + pslot) * PAGE < kv_hi, other=0
        ).to(tl.int64)
        for start in range(kv_lo, kv_hi, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            n_ok = n < kv_hi
            if TMA:
                # The whole tile lies in one page (PAGE % BLOCK_N == 0): one block-table read.
                page = tl.load(bt_row + start // PAGE)
                row0 = page * PAGE + start % PAGE
                lat_lo = lat_desc.load([row0, 0])
                lat_hi = lat_desc.load([row0, RH])
                k_pe = pe_desc.load([row0, 0])
            else:
                if PAGE_PREFETCH:
                    sel = (n // PAGE - first_page)[:, None] == pslot[None, :]
                    page = tl.sum(tl.where(sel, chunk_pages[None, :], 0), axis=1)
                else:
                    page = tl.load(bt_row + n // PAGE, mask=n_ok, other=0).to(tl.int64)
                row = (page * PAGE + n % PAGE) * (2 * RH + DPE)
                lat_lo = tl.load(c_ptr + row[:, None] + h[None, :], mask=n_ok[:, None], other=0.0)
                lat_hi = tl.load(c_ptr + row[:, None] + RH + h[None, :], mask=n_ok[:, None], other=0.0)
                k_pe = tl.load(c_ptr + row[:, None] + 2 * RH + e[None, :], mask=n_ok[:, None], other=0.0)
                if (
                    KV_FP8
                ):  # dequantise in registers: exact in q's dtype (3-bit mantissas, power-of-two scales)
                    srow = (page * PAGE + n % PAGE) * NG
                    if RH % 128 == 0:
                        # Whole groups per half: scales [BLOCK_N, RH / 128] times the half seen as
                        # [BLOCK_N, RH / 128, 128] (no per-element scale gather).
                        gi = tl.arange(0, RH // 128)
                        s_lo = tl.load(cs_ptr + srow[:, None] + gi[None, :], mask=n_ok[:, None], other=0.0)
                        s_hi = tl.load(
                            cs_ptr + srow[:, None] + RH // 128 + gi[None, :], mask=n_ok[:, None], other=0.0
                        )
                        lat_lo = tl.reshape(
                            _dequantise(
                                tl.reshape(lat_lo, (BLOCK_N, RH // 128, 128)),
                                s_lo[:, :, None],
                                q_lo.dtype,
                                OPAQUE,
                            ),
                            (BLOCK_N, RH),
                        )
                        lat_hi = tl.reshape(
                            _dequantise(
                                tl.reshape(lat_hi, (BLOCK_N, RH // 128, 128)),
                                s_hi[:, :, None],
                                q_lo.dtype,
                                OPAQUE,
                            ),
                            (BLOCK_N, RH),
                        )
                    else:
                        s_lo = tl.load(
                            cs_ptr + srow[:, None] + (h // 128)[None, :], mask=n_ok[:, None], other=0.0
                        )
                        s_hi = tl.load(
                            cs_ptr + srow[:, None] + ((RH + h) // 128)[None, :], mask=n_ok[:, None], other=0.0
                        )
                        lat_lo = _dequantise(lat_lo, s_lo, q_lo.dtype, OPAQUE)
                        lat_hi = _dequantise(lat_hi, s_hi, q_lo.dtype, OPAQUE)
                    if (2 * RH) % 128 + DPE <= 128:  # the rope key sits in one group: one scale per key
                        s_pe = tl.load(cs_ptr + srow + (2 * RH) // 128, mask=n_ok, other=0.0)[:, None]
                    else:
                        s_pe = tl.load(
                            cs_ptr + srow[:, None] + ((2 * RH + e) // 128)[None, :],
                            mask=n_ok[:, None],
                            other=0.0,
                        )
                    k_pe = _dequantise(k_pe, s_pe, q_lo.dtype, OPAQUE)
            s = tl.dot(q_lo, tl.trans(lat_lo), input_precision=PRECISION)
            s = tl.dot(q_hi, tl.trans(lat_hi), s, input_precision=PRECISION)
            s = tl.dot(q_pe, tl.trans(k_pe), s, input_precision=PRECISION)
            s = s * scale_log2
            s = tl.where(n_ok[None, :] & (n[None, :] <= pos[:, None]), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # A row with no visible key yet keeps m = -inf; shift by 0 so exp2 gives exact zeros.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if TMA:  # rows past the last key are stale pool memory, possibly NaN: 0 * NaN is NaN
                lat_lo = tl.where(n_ok[:, None], lat_lo, 0.0)
                lat_hi = tl.where(n_ok[:, None], lat_hi, 0.0)
            p = p.to(lat_lo.dtype)
            acc_lo = acc_lo * alpha[:, None] + tl.dot(p, lat_lo, input_precision=PRECISION)
            acc_hi = acc_hi * alpha[:, None] + tl.dot(p, lat_hi, input_precision=PRECISION)
            m_i = m_new
        w = (
            split_kv.partial_rows(qsl_ptr, num_seqs, block_base, q_start, tok, head, n_heads, n_chunks, BQ)
            + c
        )
        tl.store(pm_ptr + w, m_i, mask=row_ok)
        tl.store(pl_ptr + w, l_i, mask=row_ok)
        acc_rows = pacc_ptr + w[:, None] * (2 * RH) + h[None, :]
        tl.store(acc_rows, acc_lo, mask=row_ok[:, None])
        tl.store(acc_rows + RH, acc_hi, mask=row_ok[:, None])
    if MERGE:  # noqa: SIM102 (a constexpr test of its own drops the block at compile time)
        if n_tok > 0:
            # Every chunk program of the tile (with keys or not) counts itself in once its partial
            # is stored; the last to arrive merges the tile's chunks in order and resets the counter
            # for the next launch. The barrier puts all of this program's stores before the release;
            # the merge reads the others' partials past L1 (".cg").
            tl.debug_barrier()
            slot = cnt_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
            if tl.atomic_add(slot, 1, sem="acq_rel", scope="gpu") == n_chunks - 1:
                tl.store(slot, 0)
                w_row = split_kv.partial_rows(
                    qsl_ptr, num_seqs, block_base, q_start, tok, head, n_heads, n_chunks, BQ
                )
                for d0 in range(0, 2 * RH, DV_SLICE):
                    split_kv.merge_rows(
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
                        0,
                        d0 + tl.arange(0, DV_SLICE),
                        2 * RH,
                        DV_SLICE,
                        BLOCK_M,
                        CHUNK,
                        False,
                        ".cg",
                    )


def pipeline_stages(
    tokens: int,
    heads: int,
    max_seq_len: int,
    kv_chunk: int,
    block_m: int,
    sms: int,
    element_size: int = 2,
    fp8_cache: bool = False,
) -> int:
    """MLA_NUM_STAGES_ONE_WAVE when the (q block, chunk) programs fit one wave on `sms` SMs, else
    MLA_NUM_STAGES (same bits either way); MLA_FP8_NUM_STAGES at every size for an FP8 cache.

    Float32 tiles (element_size 4) always take MLA_NUM_STAGES: one more stage of 4-byte latent
    tiles needs more shared memory than a Hopper SM gives one block at the largest rank (found by
    compiling the kernel for sm_90; bench/kernels/NOTES.md, "Float32 tiles and shared memory").

    Chunks are counted up to two: decode steps run as CUDA graphs captured with the longest
    allowed context, so there max_seq_len says nothing about the real one; up to two chunks
    is where one wave gains most, and beyond it both depths are within a few points
    (bench/kernels/NOTES.md, "MLA decode").
    """
    if fp8_cache:
        return MLA_FP8_NUM_STAGES
    tokens_per_block = block_m // split_kv.heads_per_tile(heads, block_m)
    programs = -(-tokens // tokens_per_block) * min(2, max(1, -(-max_seq_len // kv_chunk)))
    return MLA_NUM_STAGES_ONE_WAVE if programs <= sms and element_size <= 2 else MLA_NUM_STAGES


def mla_paged_attention(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    max_seq_len: int | None = None,
    kv_chunk: int = MLA_KV_CHUNK,
    block_m: int = MLA_BLOCK_M,
    block_n: int = MLA_BLOCK_N,
    num_warps: int = MLA_NUM_WARPS,
    num_stages: int | None = None,
    tma: bool = False,
    page_prefetch: bool = MLA_PAGE_PREFETCH,
    merge: bool = MLA_MERGE_IN_KERNEL,
    cache_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal absorbed MLA of a flat varlen batch; returns the latent output [T, H, R] in q's dtype.

    q_latent [T, H, R] and q_pe [T, H, Dr] of one float dtype, last dims contiguous; cache
    [num_blocks, block_size, R + Dr] contiguous, same dtype; query_start_loc [B + 1], seq_lens [B],
    block_tables [B, max_blocks] int32 on the same device. R (32..512) and Dr (16..256) must be
    powers of two (512 and 64 for DeepSeek-V3). tma=True (Hopper and later) loads key tiles through
    TMA descriptors; measured slower than the pointer path (bench/kernels/NOTES.md), so off by default.
    page_prefetch (pointer path): read the chunk's page ids once before its key tiles instead of
    one block-table read per tile. merge: the last of a tile's chunk programs to finish merges the
    chunks (same bits as the separate merge kernel, which merge=False launches).
    Tile config, kv_chunk and tma fix the rounding: keep them constant. num_stages (None: by the
    number of programs and the cache, see pipeline_stages) only sets how far loads run ahead.
    An FP8 cache (float8_e4m3fn, pointer path only) comes with cache_scale [num_blocks, block_size,
    ceil((R + Dr) / 128)] float32 (kv_store.store_kv_fp8): the rope key is its own group when
    R is a multiple of 128. Tiles are dequantised in registers into q's dtype, exactly, so the
    result is bit for bit this kernel's on a q-dtype cache holding those values.
    """
    fp8 = cache_scale is not None
    check_tensor("q_latent", q_latent, dtypes=FLOAT_DTYPES, ndim=3, last_dim_contiguous=True)
    check_tensor("q_pe", q_pe, dtypes=(q_latent.dtype,), ndim=3, last_dim_contiguous=True)
    check_tensor("cache", cache, dtypes=(FP8_DTYPE if fp8 else q_latent.dtype,), ndim=3, contiguous=True)
    groups = -(-cache.shape[-1] // GROUP)
    if cache_scale is not None:
        check_tensor("cache_scale", cache_scale, dtypes=(torch.float32,), ndim=3, contiguous=True)
        if tuple(cache_scale.shape) != (*cache.shape[:2], groups):
            raise fail(
                "cache_scale.shape",
                tuple(cache_scale.shape),
                f"need {(*cache.shape[:2], groups)}: one scale per 128 values of each cache row",
            )
        if tma:
            raise fail("tma", True, "an FP8 cache is read through the pointer path only; pass tma=False")
    t, h, r = q_latent.shape
    dr = q_pe.shape[-1]
    if tuple(q_pe.shape[:2]) != (t, h):
        raise fail("q_pe.shape", tuple(q_pe.shape), f"need ({t}, {h}, Dr) like q_latent")
    if cache.shape[-1] != r + dr:
        raise fail("cache.shape[-1]", cache.shape[-1], f"need R + Dr = {r + dr}")
    if not (32 <= r <= 512 and 16 <= dr <= 256 and next_pow2(r) == r and next_pow2(dr) == dr):
        raise fail("(R, Dr)", (r, dr), "need powers of two with 32 <= R <= 512 and 16 <= Dr <= 256")
    if num_stages is not None and num_stages < 1:
        raise fail(
            "num_stages", num_stages, "need >= 1, or None for the launcher's choice by waves of programs"
        )
    if block_m not in (16, 32, 64):
        raise fail("block_m", block_m, "need 16, 32 or 64")
    if block_n not in (16, 32, 64, 128) or kv_chunk % block_n:
        raise fail("block_n", block_n, f"need 16, 32, 64 or 128, dividing kv_chunk={kv_chunk}")
    page = cache.shape[1]
    if tma and page % block_n:
        raise fail(
            "tma",
            True,
            f"a TMA key tile of {block_n} rows must not cross a {page}-token page; "
            "pass tma=False or a block_n dividing the page",
        )
    empty_k = cache.view(cache.shape[0], page, 1, cache.shape[2])
    # Reuse the dense launcher's checks on the index tensors (one KV head, D = R + Dr).
    pa._check(
        torch.empty(0, h, r + dr, dtype=q_latent.dtype, device=q_latent.device),
        empty_k,
        empty_k,
        query_start_loc,
        seq_lens,
        block_tables,
        None,
        kv_chunk,
        max_seq_len,
        fp8,
    )
    check_same_device(q_latent=q_latent, q_pe=q_pe, cache=cache, cache_scale=cache_scale)
    if tma:
        rows = cache.view(-1, r + dr)
        lat_desc: TensorDescriptor | torch.Tensor = TensorDescriptor(
            rows, list(rows.shape), [r + dr, 1], [block_n, r // 2]
        )
        pe_desc: TensorDescriptor | torch.Tensor = TensorDescriptor(
            rows[:, r:], [rows.shape[0], dr], [r + dr, 1], [block_n, dr]
        )
    else:
        lat_desc = pe_desc = cache  # unused stand-ins on the pointer path
    precision = "ieee" if q_latent.dtype == torch.float32 else "tf32"
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item()) if seq_lens.numel() else 0
    if num_stages is None:
        sms = sm_count(q_latent.device.index or 0) if q_latent.is_cuda else 0
        num_stages = pipeline_stages(t, h, max_seq_len, kv_chunk, block_m, sms, q_latent.element_size(), fp8)
    chunk_pages = next_pow2(-(-kv_chunk // page) + 1)  # pages a chunk can touch (it need not start on one)
    # The merging program takes the value columns in slices of 4096 float32 per chunk (half the
    # latent with 16-row tiles), four chunks in flight: twice the merge kernel's slices, which the
    # registers freed by the key loop hold without spilling (whole rows spill).
    merge_slice = split_kv.combine_slice(block_m, r, per_chunk=4096)

    def phase1(
        grid: tuple[int, int, int], base: int, ws: split_kv.Workspace, common: dict[str, object]
    ) -> None:
        # Without the merge the counters are never touched: ws.m stands in for them.
        _mla_chunk_kernel[grid](
            q_latent,
            q_pe,
            cache,
            cache_scale if cache_scale is not None else cache,
            lat_desc,
            pe_desc,
            block_tables,
            query_start_loc,
            seq_lens,
            ws.acc,
            ws.m,
            ws.l,
            ws.out,
            ws.counters if merge else ws.m,
            q_latent.stride(0),
            q_latent.stride(1),
            q_pe.stride(0),
            q_pe.stride(1),
            ws.out.stride(0),
            ws.out.stride(1),
            block_tables.stride(0),
            seq_lens.shape[0],
            base,
            float(scale) * _LOG2E,
            h,
            ws.n_chunks,
            BLOCK_N=block_n,
            RH=r // 2,
            DPE=dr,
            PAGE=page,
            PRECISION=precision,
            TMA=tma,
            CHUNK_PAGES=chunk_pages,
            PAGE_PREFETCH=page_prefetch,
            MERGE=merge,
            DV_SLICE=merge_slice,
            KV_FP8=fp8,
            NG=groups,
            OPAQUE=not interpreting(),
            num_warps=num_warps,
            num_stages=num_stages,
            **common,
        )

    return split_kv.two_phase(
        q_latent,
        1,
        r,
        query_start_loc,
        seq_lens,
        max_seq_len,
        kv_chunk,
        block_m,
        None,
        phase1,
        merge_in_phase1=merge,
    )
