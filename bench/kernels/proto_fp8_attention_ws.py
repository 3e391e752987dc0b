"""Prototype (not used by the engine): FP8 decode attention with a producer warp streaming the raw
cache tiles into a ring of shared-memory stages (Gluon, warp-specialised).

What bounds the shipped FP8 decode kernel (paged_attention's chunk kernel, one stage, 128 registers
a thread, four programs a SM) is bytes in flight: each program loads a key tile into registers,
waits for it, dequantises and multiplies, and only then loads the value tile, so a SM has at most a
few 16 KB loads outstanding (bench/kernels/NOTES.md: Nsight Compute found half the issue slots and
half the bandwidth idle, and every attempt to prefetch into registers spilled or cost a program a
SM). Here one producer warp a program issues TMA copies of the next tiles' key and value pages
(16 keys x 128 bytes a page and head) as soon as their stage is free, STAGES tiles ahead, and
keeps nothing in registers; the four consumer warps run the shipped kernel's arithmetic on each
tile once it lands:

    raw FP8 tile (shared) -> registers, 16 bytes a thread -> (float32 * key scale) -> bf16
    -> shared (one 16-bit buffer, keys then values) -> the MMA operand (kWidth 2, as a bf16 cache)

The same layouts as the shipped kernel's compiled code (mma.sync 16x8 tiles, warps along the keys
for the scores and along the value columns for the output), the same operations in the same
order: a decode row whose keys fit one KV chunk should get the shipped kernel's bits (its
direct-store path), which `main` checks beside the timing.

Operand variants (CONFIGS): "local" drops the 16-bit buffer, each warp loading the raw bytes its
own operands hold; "ordered" and "ordered-kv" read a cache whose key rows (and value pages) are
stored in the MMA operands' register order (fp8_decode_batch.permuted_caches), straight into
the operands with no conversion left (bench/kernels/NOTES.md, "Keys and values stored in operand
order").

Decode rows only (one token a sequence, every key of it in one program), head dim 128, one scale
per key, 16-key pages, GQA groups up to 16.

    python bench/kernels/proto_fp8_attention_ws.py [--batch 256 512] [--ctx 640 1024] [--group 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.language.core import builtin

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


from bench.kernels.fp8_decode_batch import (
    HEAD_DIM,
    PAGE_SIZE,
    k_position,
    permuted_caches,
    problem,
    shipped_decode,
    v_position,
)

_LOG2E = 1.4426950408889634

# Triton 3.6 names the TMA load async_copy_global_to_shared; later versions async_load.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@builtin
def _view(desc, dtype, shape, layout, _semantic=None):  # type: ignore[no-untyped-def]
    """desc seen with another dtype, shape and shared layout (Triton 3.6 names the method
    _reinterpret, later versions reinterpret)."""
    method = getattr(desc, "reinterpret", None) or desc._reinterpret
    return method(dtype, shape, layout, _semantic=_semantic)


@gluon.jit
def _produce(
    k_desc,
    v_desc,
    k_ring,
    v_ring,
    ready,
    empty,
    bt_row,
    kvh,
    hk,
    n_pages,
    n_tiles,
    STAGES: gl.constexpr,
    BLOCK_N: gl.constexpr,
    PAGE: gl.constexpr,
    D: gl.constexpr,
    PROBE: gl.constexpr,
    LOCAL: gl.constexpr,
):
    """The producer warp: tile t's key and value pages into stage t % STAGES once it is free (a
    fresh barrier counts as released: the first pass waits on parity 1, which passes at once).
    Pages past the sequence copy page 0; the consumers zero those keys. (PROBE: decode_ws.)
    LOCAL == 3: values stored dim-major a page (permuted_caches), a [D, PAGE] box each."""
    for t in range(n_tiles if PROBE != 1 else 0):
        stage = t % STAGES
        mbarrier.wait(empty.index(stage), ((t // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(stage), 2 * BLOCK_N * D)
        for i in gl.static_range(BLOCK_N // PAGE):
            pg = t * (BLOCK_N // PAGE) + i
            page = gl.load(bt_row + pg, mask=pg < n_pages, other=0)
            _tma_load(
                k_desc, [page * PAGE, kvh * D], ready.index(stage), k_ring.index(stage).slice(i * PAGE, PAGE)
            )
            if LOCAL == 3:
                _tma_load(
                    v_desc,
                    [(page * hk + kvh) * D, 0],
                    ready.index(stage),
                    v_ring.index(stage).slice(i * D, D),
                )
            else:
                _tma_load(
                    v_desc,
                    [page * PAGE, kvh * D],
                    ready.index(stage),
                    v_ring.index(stage).slice(i * PAGE, PAGE),
                )


@gluon.jit
def _online_softmax(s, n_m, seq_len, scale_log2, m_i, l_i):
    """The shipped loop's softmax step on one tile's raw scores: keys past the sequence masked, the
    running max and sum updated. Returns (new max, the old accumulator's factor, probabilities,
    new sum)."""
    s = s * scale_log2
    s = gl.where((n_m < seq_len)[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_safe)
    p = gl.exp2(s - m_safe[:, None])
    return m_new, alpha, p, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _tile(
    q,
    k_raw,
    v_raw,
    tile16,
    release,
    ks,
    vs,
    n_ok,
    n_m,
    seq_len,
    scale_log2,
    m_i,
    l_i,
    acc,
    zero,
    RELEASE: gl.constexpr,
    raw_l: gl.constexpr,
    a_l: gl.constexpr,
    b_l: gl.constexpr,
):
    """One tile of paged_attention's loop on the raw tiles of a stage; the stage is released (when
    RELEASE) once both are in registers."""
    # Scores: keys dequantised exactly into bf16, as the shipped kernel does.
    raw_k = k_raw.load(raw_l)
    kf = (raw_k.to(gl.float32) * ks[:, None]).to(gl.bfloat16)
    tile16.store(kf)
    k_b = tile16.permute((1, 0)).load(b_l)
    m_new, alpha, p, l_i = _online_softmax(mma_v2(q, k_b, zero), n_m, seq_len, scale_log2, m_i, l_i)

    # Values: keys past the sequence zeroed (their probability is 0, but 0 x NaN is not 0).
    raw_v = v_raw.load(raw_l)
    if RELEASE:
        mbarrier.arrive(release, count=1)
    vf = gl.where(n_ok[:, None], raw_v.to(gl.float32) * vs[:, None], 0.0).to(gl.bfloat16)
    tile16.store(vf)
    v_b = tile16.load(b_l)
    p_a = gl.convert_layout(p.to(gl.bfloat16), a_l)
    acc = mma_v2(p_a, v_b, acc * alpha[:, None])
    return m_new, l_i, acc


@gluon.jit
def _tile_local(
    q,
    k_raw,
    v_raw,
    release,
    ks,
    vs,
    v_ok,
    n_m,
    seq_len,
    scale_log2,
    m_i,
    l_i,
    acc,
    zero,
    RELEASE: gl.constexpr,
    k_l: gl.constexpr,
    v_l: gl.constexpr,
    b_l: gl.constexpr,
    a_l: gl.constexpr,
    ORDERED: gl.constexpr,
    kb_l: gl.constexpr,
    k_view: gl.constexpr,
    ORDERED_V: gl.constexpr,
    vb_l: gl.constexpr,
    v_view: gl.constexpr,
    BLOCK_N: gl.constexpr,
    D: gl.constexpr,
):
    """_tile without the restage buffer: each warp loads the raw bytes of exactly the keys (k_l) and
    value columns (v_l) its own MMA operand holds, so no warp needs another's tile; the conversion
    to the operand layout is the compiler's (Triton lowers it through a small shared scratch, with
    barriers: bench/kernels/NOTES.md). ORDERED: the key rows are stored in operand order
    (fp8_decode_batch.permuted_caches), so the raw bytes are read straight into the operand's own layout
    (kb_l, through the shared view k_view) and no conversion is left (asserted trivial); ks is
    then laid out along the operand's key axis. ORDERED_V: the same for the value tile
    (vb_l, v_view); vs and v_ok along the operand's key axis."""
    if ORDERED:
        raw_k = _view(k_raw, gl.float8e4nv, [D, BLOCK_N], k_view).load(kb_l)
        kf = (raw_k.to(gl.float32) * ks[None, :]).to(gl.bfloat16)
        k_b = gl.convert_layout(kf, b_l, assert_trivial=True)
    else:
        raw_k = k_raw.load(k_l)
        kf = (raw_k.to(gl.float32) * ks[:, None]).to(gl.bfloat16)
        k_b = gl.convert_layout(gl.permute(kf, (1, 0)), b_l)
    m_new, alpha, p, l_i = _online_softmax(mma_v2(q, k_b, zero), n_m, seq_len, scale_log2, m_i, l_i)

    if ORDERED_V:  # noqa: SIM108 (a constexpr branch: one load is compiled)
        raw_v = _view(v_raw, gl.float8e4nv, [BLOCK_N, D], v_view).load(vb_l)
    else:
        raw_v = v_raw.load(v_l)
    if RELEASE:
        mbarrier.arrive(release, count=1)
    vf = gl.where(v_ok[:, None], raw_v.to(gl.float32) * vs[:, None], 0.0).to(gl.bfloat16)
    v_b = gl.convert_layout(vf, b_l, assert_trivial=ORDERED_V)
    p_a = gl.convert_layout(p.to(gl.bfloat16), a_l)
    acc = mma_v2(p_a, v_b, acc * alpha[:, None])
    return m_new, l_i, acc


@gluon.jit
def _consume(
    q_ptr,
    ks_ptr,
    vs_ptr,
    out_ptr,
    k_ring,
    v_ring,
    tile16,
    ready,
    empty,
    bt_row,
    seq,
    kvh,
    seq_len,
    n_tiles,
    sqt,
    sqh,
    sksb,
    skss,
    sksh,
    svsb,
    svss,
    svsh,
    sot,
    soh,
    scale_log2,
    GROUP: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    PAGE: gl.constexpr,
    D: gl.constexpr,
    PROBE: gl.constexpr,
    LOCAL: gl.constexpr,
    KB_L: gl.constexpr,
    K_VIEW: gl.constexpr,
    VB_L: gl.constexpr,
    V_VIEW: gl.constexpr,
    num_warps: gl.constexpr,
):
    """The consumer warps: paged_attention's loop over the tiles, reading each from its stage.
    (PROBE: decode_ws.)"""
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[1, num_warps], instr_shape=[16, 8]
    )
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    # A thread reads 16 consecutive bytes of one key row (the shipped kernel's global loads).
    raw_l: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 16], threads_per_warp=[4, 8], warps_per_cta=[num_warps, 1], order=[1, 0]
    )

    rows_a = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, a_l))
    d_a = gl.arange(0, D, layout=gl.SliceLayout(0, a_l))
    q_rows = seq.to(gl.int64) * sqt + (kvh * GROUP + rows_a) * sqh
    q = gl.load(q_ptr + q_rows[:, None] + d_a[None, :], mask=(rows_a < GROUP)[:, None], other=0.0)

    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
    row_ok = rows < GROUP
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, mma))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, mma))
    acc = gl.zeros([BLOCK_M, D], gl.float32, mma)
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
    keys_raw = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, raw_l))
    n_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
    # LOCAL: warp w's MMA operands hold keys (scores) and value columns (output) 8w + 32r + j, so
    # warp w loads those rows of the key tile and those columns of the value tile.
    k_l: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[2, 16], threads_per_warp=[4, 8], warps_per_cta=[num_warps, 1], order=[1, 0]
    )
    v_l: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 8], threads_per_warp=[32, 1], warps_per_cta=[1, num_warps], order=[1, 0]
    )
    # LOCAL == 2: the key operand read in its own layout (KB_L), its scales along its key axis.
    if LOCAL >= 2:
        keys_k = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, KB_L))
    else:
        keys_k = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, k_l))
    if LOCAL == 3:
        keys_v = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, VB_L))
    else:
        keys_v = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, v_l))
    for t in range(n_tiles):
        stage = t % STAGES
        start = t * BLOCK_N
        # The tile's scales from global memory, issued before waiting for its stage.
        if LOCAL:
            nk = start + keys_k
            page_k = gl.load(bt_row + nk // PAGE, mask=nk < seq_len, other=0).to(gl.int64)
            ks_l = gl.load(
                ks_ptr + page_k * sksb + (nk % PAGE) * skss + kvh * sksh, mask=nk < seq_len, other=0.0
            )
            nv = start + keys_v
            v_ok = nv < seq_len
            page_v = gl.load(bt_row + nv // PAGE, mask=v_ok, other=0).to(gl.int64)
            vs_l = gl.load(vs_ptr + page_v * svsb + (nv % PAGE) * svss + kvh * svsh, mask=v_ok, other=0.0)
        else:
            n = start + keys_raw
            n_ok = n < seq_len
            page = gl.load(bt_row + n // PAGE, mask=n_ok, other=0).to(gl.int64)
            ks = gl.load(ks_ptr + page * sksb + (n % PAGE) * skss + kvh * sksh, mask=n_ok, other=0.0)
            vs = gl.load(vs_ptr + page * svsb + (n % PAGE) * svss + kvh * svsh, mask=n_ok, other=0.0)
        if PROBE != 1:
            mbarrier.wait(ready.index(stage), (t // STAGES) & 1)
        if PROBE == 2:
            mbarrier.arrive(empty.index(stage), count=1)
        elif LOCAL:
            m_i, l_i, acc = _tile_local(
                q,
                k_ring.index(stage),
                v_ring.index(stage),
                empty.index(stage),
                ks_l,
                vs_l,
                v_ok,
                start + n_s,
                seq_len,
                scale_log2,
                m_i,
                l_i,
                acc,
                zero,
                PROBE == 0,
                k_l,
                v_l,
                b_l,
                a_l,
                LOCAL >= 2,
                KB_L,
                K_VIEW,
                LOCAL == 3,
                VB_L,
                V_VIEW,
                BLOCK_N,
                D,
            )
        else:
            m_i, l_i, acc = _tile(
                q,
                k_ring.index(stage),
                v_ring.index(stage),
                tile16,
                empty.index(stage),
                ks,
                vs,
                n_ok,
                start + n_s,
                seq_len,
                scale_log2,
                m_i,
                l_i,
                acc,
                zero,
                PROBE == 0,
                raw_l,
                a_l,
                b_l,
            )

    out = acc / gl.where(row_ok, l_i, 1.0)[:, None]
    d_o = gl.arange(0, D, layout=gl.SliceLayout(0, mma))
    o_rows = seq.to(gl.int64) * sot + (kvh * GROUP + rows) * soh
    gl.store(out_ptr + o_rows[:, None] + d_o[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    return ()


@gluon.jit
def _decode_ws_kernel(
    k_desc,
    v_desc,
    q_ptr,
    ks_ptr,
    vs_ptr,
    bt_ptr,
    sl_ptr,
    out_ptr,
    sqt,
    sqh,
    sksb,
    skss,
    sksh,
    svsb,
    svss,
    svsh,
    sbt,
    sot,
    soh,
    scale_log2,
    GROUP: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    PAGE: gl.constexpr,
    D: gl.constexpr,
    PROBE: gl.constexpr,
    LOCAL: gl.constexpr,
    KB_L: gl.constexpr,
    K_VIEW: gl.constexpr,
    VB_L: gl.constexpr,
    V_VIEW: gl.constexpr,
    PRODUCER_REGISTERS: gl.constexpr,
    num_warps: gl.constexpr,
):
    seq = gl.program_id(0)
    kvh = gl.program_id(1)
    seq_len = gl.load(sl_ptr + seq)
    n_tiles = gl.cdiv(seq_len, BLOCK_N)
    n_pages = gl.cdiv(seq_len, PAGE)
    bt_row = bt_ptr + seq.to(gl.int64) * sbt
    k_ring = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, D], k_desc.layout)
    if LOCAL == 3:  # values a page dim-major: [pages x D, PAGE] a stage, the same bytes
        v_ring = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N // PAGE * D, PAGE], v_desc.layout)
    else:
        v_ring = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, D], v_desc.layout)
    # The restage buffer (a token one when LOCAL, which has none).
    tile16 = gl.allocate_shared_memory(
        gl.bfloat16,
        [16 if LOCAL else BLOCK_N, 16 if LOCAL else D],
        gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0]),
    )
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize(
        [
            (
                _consume,
                (
                    q_ptr,
                    ks_ptr,
                    vs_ptr,
                    out_ptr,
                    k_ring,
                    v_ring,
                    tile16,
                    ready,
                    empty,
                    bt_row,
                    seq,
                    kvh,
                    seq_len,
                    n_tiles,
                    sqt,
                    sqh,
                    sksb,
                    skss,
                    sksh,
                    svsb,
                    svss,
                    svsh,
                    sot,
                    soh,
                    scale_log2,
                    GROUP,
                    BLOCK_M,
                    BLOCK_N,
                    STAGES,
                    PAGE,
                    D,
                    PROBE,
                    LOCAL,
                    KB_L,
                    K_VIEW,
                    VB_L,
                    V_VIEW,
                    num_warps,
                ),
            ),
            (
                _produce,
                (
                    k_desc,
                    v_desc,
                    k_ring,
                    v_ring,
                    ready,
                    empty,
                    bt_row,
                    kvh,
                    gl.num_programs(1),
                    n_pages,
                    n_tiles,
                    STAGES,
                    BLOCK_N,
                    PAGE,
                    D,
                    PROBE,
                    LOCAL,
                ),
            ),
        ],
        [1],
        [PRODUCER_REGISTERS],
    )
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))


# The operand-order caches (fp8_decode_batch.permuted_caches) put thread t's 32 bytes of a key row
# and its 4 bytes of each value row together, in register order; both permutations move bits, so
# the shared views below, which see a ring stage's bytes in logical order, are linear.


def _channel_at(byte: int) -> int:
    """The channel a key row's byte holds (k_position's inverse)."""
    return int(torch.argsort(k_position(torch.arange(HEAD_DIM)))[byte])


def _key_at(position: int) -> int:
    """The page key a value row's position holds (v_position's inverse)."""
    return int(torch.argsort(v_position(torch.arange(PAGE_SIZE)))[position])


def operand_layout(k_extent: int, n_extent: int) -> gl.DistributedLinearLayout:
    """An MMA B operand [k_extent, n_extent] (mma.sync 16x8x16, bf16's kWidth 2, 4 warps along n) as
    a linear layout: the placement of DotOperandLayout(1, that mma, 2). For the scores k is the
    dims and n the keys; for the output k is the keys and n the dims."""
    return gl.DistributedLinearLayout(
        reg_bases=[[1, 0], *[[1 << b, 0] for b in range(3, k_extent.bit_length() - 1)]]
        + [[0, 1 << b] for b in range(5, n_extent.bit_length() - 1)],
        lane_bases=[[2, 0], [4, 0], [0, 1], [0, 2], [0, 4]],
        warp_bases=[[0, 8], [0, 16]],
        block_bases=[],
        shape=[k_extent, n_extent],
    )


def ordered_key_view(block_n: int) -> gl.SharedLinearLayout:
    """A ring stage's key tile ([block_n keys, 128 bytes], as TMA writes it with the 128-byte
    swizzle: a row's 16-byte chunk c sits at chunk c XOR (row mod 8)) seen as K^T [128 channels,
    block_n keys]: offset bit i -> the (channel, key) it steps."""
    bases = [[_channel_at(1 << i), 0] for i in range(7)]  # within a row (row 0: no swizzle)
    for b in range(block_n.bit_length() - 1):  # a row step also moves the chunk by its low 3 bits
        row = 1 << b
        bases.append([_channel_at((row & 7) << 4), row])
    return gl.SharedLinearLayout(offset_bases=bases)


def ordered_value_view(block_n: int) -> gl.SharedLinearLayout:
    """A ring stage's value tile ([pages x 128 dims, 16 positions], unswizzled as TMA writes a
    16-byte box row) seen as V [block_n keys, 128 dims]: offset bit i -> the (key, dim) it steps."""
    bases = [[_key_at(1 << i), 0] for i in range(4)]  # positions: keys of a page
    bases += [[0, 1 << i] for i in range(7)]  # dims
    bases += [[PAGE_SIZE << i, 0] for i in range(block_n.bit_length() - 5)]  # pages
    return gl.SharedLinearLayout(offset_bases=bases)


def decode_ws(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    stages: int = 2,
    producer_registers: int = 40,
    max_registers: int | None = 128,
    block_n: int = 128,
    probe: int = 0,
    local: bool = False,
    ordered_keys: bool = False,
    ordered_values: bool = False,
) -> torch.Tensor:
    """One decode token a sequence: q [B, Hq, 128] bf16; k/v [blocks, 16, Hk, 128] float8_e4m3fn
    (contiguous) with k_scale/v_scale [blocks, 16, Hk, 1] float32. Returns [B, Hq, 128] bf16.
    ordered_keys (with local): k is fp8_decode_batch.permuted_caches' key cache, read straight into
    the key operand; ordered_values (with ordered_keys): v is its value cache [blocks, Hk, 128, 16],
    read into the value operand the same way.
    max_registers caps the registers a thread of the launch (None: no cap): what a SM holds of
    programs follows from it, since the warps' registers are reserved at the cap. block_n: keys a
    tile (128 is the shipped FP8 tile; 64 halves a stage, and rounds otherwise). probe, for timing
    the two halves apart (the output is then meaningless): 1 runs the consumers' arithmetic on
    whatever the stages hold, with no copies and no waits; 2 runs the copies, the consumers only
    waiting for each stage and releasing it."""
    b, hq, d = q.shape
    nb, page, hk, _ = k.shape
    out = torch.empty_like(q)
    layout = gl.NVMMASharedLayout.get_default_for([page, d], gl.float8e4nv)
    # Each slot row holds every head's 128 bytes, so a page of one head is a [16, 128] box.
    k_desc = TensorDescriptor(k.view(nb * page, hk * d), [nb * page, hk * d], [hk * d, 1], [page, d], layout)
    if ordered_values:  # v [blocks, Hk, 128, 16] (permuted_caches): a [128, 16] box a page and head
        v_layout = gl.NVMMASharedLayout.get_default_for([d, page], gl.float8e4nv)
        v_desc = TensorDescriptor(
            v.view(nb * hk * d, page), [nb * hk * d, page], [page, 1], [d, page], v_layout
        )
    else:
        v_desc = TensorDescriptor(
            v.view(nb * page, hk * d), [nb * page, hk * d], [hk * d, 1], [page, d], layout
        )
    _decode_ws_kernel[(b, hk)](
        k_desc,
        v_desc,
        q,
        k_scale,
        v_scale,
        block_tables,
        seq_lens,
        out,
        q.stride(0),
        q.stride(1),
        *k_scale.stride()[:3],
        *v_scale.stride()[:3],
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        scale * _LOG2E,
        GROUP=hq // hk,
        BLOCK_M=16,
        BLOCK_N=block_n,
        STAGES=stages,
        PAGE=page,
        D=d,
        PRODUCER_REGISTERS=producer_registers,
        PROBE=probe,
        LOCAL=3 if ordered_values else 2 if ordered_keys else int(local),
        KB_L=operand_layout(HEAD_DIM, block_n) if ordered_keys or ordered_values else None,
        K_VIEW=ordered_key_view(block_n) if ordered_keys or ordered_values else None,
        VB_L=operand_layout(block_n, HEAD_DIM) if ordered_values else None,
        V_VIEW=ordered_value_view(block_n) if ordered_values else None,
        num_warps=4,
        **({"maxnreg": max_registers} if max_registers else {}),
    )
    return out


# (keys a tile, stages, register cap a thread, operands). Operands: "restage" through one 16-bit
# shared buffer; "local", each warp loading the raw bytes its own operands hold (no restage buffer);
# "ordered", local with the keys stored in operand order (fp8_decode_batch.permuted_caches) and read
# straight into the scores' operand; "ordered-kv", the values too. With 128-key tiles two stages fit two programs a SM by shared memory
# (100 KB each) with the restage buffer, three (70 KB) without it. 64-key tiles are other bits.
CONFIGS = (
    (128, 2, 128, "restage"),
    (128, 2, 128, "local"),
    (128, 2, 128, "ordered"),
    (128, 2, 128, "ordered-kv"),
    (128, 3, 128, "ordered-kv"),
    (64, 4, 128, "ordered-kv"),
)
# The config whose arithmetic and copies are also timed apart.
PROBED = CONFIGS[3]


def compare(batch: int, ctx: int, group: int, bw: float) -> str:
    """One batch and context: the shipped kernel against the prototype at each config (µs per call,
    CUDA-graph replays), each with whether its output equals the shipped kernel's bit for bit and
    its largest difference from it. A config that fails is reported in its column."""
    from bench.gpu_timing import graph_ms_per_call

    pr = problem(batch, ctx, group)
    scale = HEAD_DIM**-0.5

    def shipped() -> torch.Tensor:
        return shipped_decode(pr, scale)

    k_ordered, v_ordered = permuted_caches(pr["k"], pr["v"])

    def ws(cfg: tuple[int, int, int | None, str], probe: int = 0) -> torch.Tensor:
        block_n, stages, cap, operands = cfg
        k = k_ordered if operands.startswith("ordered") else pr["k"]
        v = v_ordered if operands == "ordered-kv" else pr["v"]
        args = (pr["q"], k, v, pr["ks"], pr["vs"], pr["bt"], pr["sl"], scale, stages)
        return decode_ws(
            *args,
            max_registers=cap,
            block_n=block_n,
            probe=probe,
            local=operands != "restage",
            ordered_keys=operands.startswith("ordered"),
            ordered_values=operands == "ordered-kv",
        )

    want = shipped()
    t_ship = 1e3 * graph_ms_per_call([shipped])
    cells = []
    for cfg in CONFIGS:
        try:
            got = ws(cfg)
            torch.cuda.synchronize()
            diff = (want.float() - got.float()).abs().max().item()
            t = 1e3 * graph_ms_per_call([lambda cfg=cfg: ws(cfg)])
            cells.append(f"{t:.1f} ({'equal' if torch.equal(want, got) else f'diff {diff:.2g}'})")
        except Exception as exc:  # a config that fails to compile or run is reported, not fatal
            cells.append(f"error {type(exc).__name__}: {str(exc)[:80]}")
    # PROBED's halves timed apart: its arithmetic alone, then its copies alone.
    for probe in (1, 2):
        try:
            t = 1e3 * graph_ms_per_call([lambda probe=probe: ws(PROBED, probe)])
            cells.append(f"{t:.1f}")
        except Exception as exc:
            cells.append(f"error {type(exc).__name__}: {str(exc)[:80]}")
    floor = 2 * batch * ctx * pr["k"].shape[2] * (HEAD_DIM + 4) / bw * 1e6
    return f"{batch:>5} {ctx:>5} {t_ship:>10.1f} {floor:>9.1f}   " + " | ".join(cells)


def main() -> None:
    from bench.gpu_timing import copy_bandwidth

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--ctx", type=int, nargs="+", default=[640, 1024])
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--out", default=None, help="ignored (device_checks.sh passes it)")
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s, group {args.group}")
    print(
        f"{'batch':>5} {'ctx':>5} {'shipped us':>10} {'floor us':>9}   "
        + " | ".join("ws {}/{}/{}/{}".format(*c) for c in CONFIGS)
        + " | {0} math only | {0} copies only".format("/".join(map(str, PROBED)))
    )
    for batch in args.batch:
        for ctx in args.ctx:
            print(compare(batch, ctx, args.group, bw), flush=True)


if __name__ == "__main__":
    main()
