"""Fused mixture-of-experts FFN: route-sorted grouped GEMMs with SiLU-and-mul in the epilogue.

    x [T, H]; topk_ids [T, k]; topk_weights [T, k] float32
    w_gate_up [E, 2I, H] ([gate | up] rows per expert); w_down [E, H, I]

1. align (two kernels, one program per expert: count and fill the blanks, then place; no host
   sync, no data-dependent shape, no sort): the T*k (token, slot) pairs are grouped by expert and each
   expert's run is padded to a multiple of BLOCK_M, so every tile of BLOCK_M rows belongs to
   one expert: the expert-sorted layout. Padding rows hold -1; slot_positions maps each slot
   back to its row. The layout has the worst-case size T*k + E*(BLOCK_M - 1) (rounded up to
   whole tiles), computed from shapes alone, and tiles past the last expert's are marked with
   expert id E and exit at once. So the launch grids depend on shapes only, and the whole layer
   can be captured in a CUDA graph.
2. gate/up GEMM, one program per (row tile, I / BLOCK_N column block), launched in groups of
   row tiles (`MoeTiles.group_m`): a tile gathers its tokens' rows of x, multiplies by the
   expert's gate and up weights, and writes silu(gate) * up to its own rows of the layout
   ([P, I]), padding rows included (zeros).
3. down GEMM over the same tiles: its input rows are the tile's own, contiguous, so they load as
   whole tiles (through TMA on Hopper); it writes [P, H] in x's dtype, padding rows skipped.
4. combine, grid (T, H / BLOCK): out[t] = sum_j weight[t, j] * row slot_positions[t*k + j] of the
   down GEMM's output, in slot order, float32.

Batch invariance: each GEMM row is one (token, slot) pair; its dot products run over the K
dim in a fixed BLOCK_K order and MMA rows do not mix, so a token's output does not depend on
which or how many other tokens chose the same expert, nor on the row of the tile it lands in.
The tiling is chosen by batch size only among tilings verified to give every row the same bits
(`moe_tiles`). The combine sums a token's k slots in slot order; nothing is accumulated with
atomics. Rounding mirrors reference_moe.moe_experts: the GEMM outputs are rounded to x's dtype
before the activation and before the weighted sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from shardinfer.kernels._common import (
    FLOAT_DTYPES,
    capability,
    check_same_device,
    check_tensor,
    check_tiles,
    fail,
    interpreting,
    next_pow2,
)
from shardinfer.kernels._mma import mma
from shardinfer.kernels.tuning import TileChooser, Tiling, below


@dataclass(frozen=True)
class MoeTiles:
    """One tiling of both grouped GEMMs. Any fixed tiling is batch invariant; they differ in speed."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    # Expert weights through the tensor-memory accelerator (Hopper and later). The gathered token
    # rows of the gate/up GEMM always use pointer loads: they are scattered over x, which TMA
    # tiles cannot express.
    tma: bool = False
    # Launch order: programs walk every column block of `group_m` consecutive row tiles before
    # the next group, so the programs running at once share a few tiles' token rows and one or
    # two experts' weights in L2. 0: row tiles fastest, every column block's pass over all tiles
    # in turn. Order only: no value depends on it.
    group_m: int = 0
    # The down GEMM reads whole tiles of the expert-sorted activations: through TMA if set.
    tma_rows: bool = False
    # The down GEMM's own column block, warps and stages (0: the gate/up GEMM's). Its block_m is
    # the alignment's, shared.
    down_block_n: int = 0
    down_num_warps: int = 0
    down_num_stages: int = 0

    def __post_init__(self) -> None:
        check_tiles(self, ("block_m", "block_n", "block_k"), ("num_warps", "num_stages"))
        if self.group_m < 0:
            raise ValueError(f"MoeTiles.group_m: got {self.group_m}, need >= 0 (0: row tiles fastest)")
        if self.down_block_n:
            check_tiles(self, ("down_block_n",), ())
        for name in ("down_num_warps", "down_num_stages"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"MoeTiles.{name}: got {getattr(self, name)}, need >= 1 (0: the gate/up GEMM's)"
                )

    def down(self) -> tuple[int, int, int]:
        """(block_n, num_warps, num_stages) of the down GEMM."""
        return (
            self.down_block_n or self.block_n,
            self.down_num_warps or self.num_warps,
            self.down_num_stages or self.num_stages,
        )


# Every device and the CPU interpreter: pointer loads only.
DEFAULT_TILES = MoeTiles(group_m=8)
# Hopper (bench_moe.py on an H200, bench/kernels/NOTES.md "The expert-sorted layout"): operands
# through TMA where the layout allows, and the down GEMM on its own wider tiles. Small batches
# (decode): 64-row tiles, the down GEMM 128 columns wide. Batches with at least LARGE_TILE_ROWS
# (token, slot) rows per expert on average (about 680 tokens at top-6 of 64): 128-row tiles,
# four stages, the down GEMM 256 columns wide, so each tile loaded feeds more MMA work.
HOPPER_SMALL_TILES = MoeTiles(64, 64, 64, 4, 3, tma=True, group_m=8, tma_rows=True, down_block_n=128)
HOPPER_LARGE_TILES = MoeTiles(128, 128, 64, 8, 4, tma=True, group_m=8, tma_rows=True, down_block_n=256)
LARGE_TILE_ROWS = 64
# Measured winners per (hidden, intermediate, dtype), replacing the tilings above.
TILE_OVERRIDES: dict[tuple[int, int, torch.dtype], MoeTiles] = {}


def _default_tiling(key: tuple[int, int, torch.dtype], device: torch.device | None) -> Tiling[MoeTiles]:
    hidden, inter, dtype = key
    hopper = device is not None and device.type == "cuda" and capability(device.index or 0) == (9, 0)
    size = dtype.itemsize
    if not hopper or (hidden * size) % 16 or (inter * size) % 16:
        return Tiling(DEFAULT_TILES)
    return Tiling(HOPPER_LARGE_TILES, ((below(LARGE_TILE_ROWS), HOPPER_SMALL_TILES),))


_CHOOSER: TileChooser[tuple[int, int, torch.dtype], MoeTiles] = TileChooser(TILE_OVERRIDES, _default_tiling)


def moe_tiles(
    hidden: int,
    inter: int,
    dtype: torch.dtype,
    rows_per_expert: float = 0.0,
    device: torch.device | None = None,
) -> MoeTiles:
    """The tiling for an expert shape and batch size (rows_per_expert = tokens * top_k / experts).

    A tiling chosen by batch size must give every row the bits it gets at any other size. On
    Hopper the tilings here do: all run the K loop in BLOCK_K = 64 steps on wgmma, whose rows do
    not mix, and how an operand reaches shared memory changes no value (GPU test:
    test_wgmma_tilings_compute_the_default_bits). Elsewhere (other GPUs, the CPU interpreter)
    that is not verified, so one tiling serves every size there. The TMA tilings need 16-byte
    rows in both GEMMs' K dims; other shapes take the pointer tiling. Selection: kernels/tuning.py.
    """
    return _CHOOSER.choose((hidden, inter, dtype), rows_per_expert, device=device)


@triton.jit
def _weight_tile(
    w_base, w_desc, desc_row, cols, col_ok, k0, k_dim, swn, BLOCK_K: tl.constexpr, W_TMA: tl.constexpr
):
    """The [BLOCK_K, BLOCK_N] tile (w[expert, cols, k0:k0 + BLOCK_K])^T of a row-major [E, rows, K] weight.

    W_TMA: the descriptor sees the weight as [E * rows, K] and desc_row = expert * rows + first col;
    tile rows past the expert's own (a partial last column block) read the next expert's rows or
    zeros, and are dropped at the store; columns past K are zero-filled by the copy engine.
    """
    if W_TMA:
        tile = w_desc.load([desc_row, k0]).T
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        tile = tl.load(
            w_base + cols[None, :] * swn + ks[:, None],
            mask=col_ok[None, :] & (ks < k_dim)[:, None],
            other=0.0,
        )
    return tile


@triton.jit(do_not_specialize=["n_tiles"])
def _grouped_gemm_kernel(
    a_ptr,
    a_desc,
    w_ptr,
    w_desc,
    out_ptr,
    sorted_ptr,
    block_expert_ptr,
    n_cols,
    k_dim,
    a_row_div,
    sa,
    swe,
    swn,
    so,
    n_experts,
    up_offset,
    rows_per_expert,
    n_tiles,
    GATED: tl.constexpr,
    A_SORTED: tl.constexpr,
    A_TMA: tl.constexpr,
    W_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    INTERPRET: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """out[p, n] = a_p . w[e, n] (GATED: silu(a_p . w[e, n]) * (a_p . w[e, up_offset + n])) for every
    row p of the expert-sorted layout, e = the expert of p's tile.

    a_p: A_SORTED, row p of a (the layout's own rows, contiguous per tile; A_TMA loads them with
    the copy engine); else row slot // a_row_div of a, slot = sorted[p] (a gather; padding rows
    (slot -1) read zeros). GATED stores every row of a tile (padding rows: zeros), so the next
    GEMM may read whole tiles; otherwise padding rows are not stored.
    """
    n_blocks = tl.cdiv(n_cols, BLOCK_N)
    pid = tl.program_id(0)
    if GROUP_M == 0:
        tile = pid % n_tiles
        col_block = pid // n_tiles
    else:
        first = pid // (GROUP_M * n_blocks) * GROUP_M
        size = tl.minimum(n_tiles - first, GROUP_M)
        tile = first + pid % (GROUP_M * n_blocks) % size
        col_block = pid % (GROUP_M * n_blocks) // size
    expert = tl.load(block_expert_ptr + tile)
    if expert < n_experts:  # tiles past the last expert's run (worst-case grid) do nothing
        first_row = tile * BLOCK_M
        pos = (first_row + tl.arange(0, BLOCK_M)).to(tl.int64)
        slot = tl.load(sorted_ptr + pos)
        row_ok = slot >= 0
        # A_SORTED: the tile's own rows, all of them defined (the gated GEMM wrote its padding rows).
        a_row = pos if A_SORTED else tl.where(row_ok, slot // a_row_div, 0).to(tl.int64)
        n0 = col_block * BLOCK_N
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < n_cols
        w_base = w_ptr + expert.to(tl.int64) * swe
        desc_row = expert * rows_per_expert + n0
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, k_dim, BLOCK_K):
            if A_TMA:
                a = a_desc.load([first_row, k0])
            else:
                ks = k0 + tl.arange(0, BLOCK_K)
                a_ok = (ks < k_dim)[None, :] if A_SORTED else row_ok[:, None] & (ks < k_dim)[None, :]
                a = tl.load(a_ptr + a_row[:, None] * sa + ks[None, :], mask=a_ok, other=0.0)
            w = _weight_tile(w_base, w_desc, desc_row, cols, col_ok, k0, k_dim, swn, BLOCK_K, W_TMA)
            acc = mma(a, w, acc, PRECISION, INTERPRET)
            if GATED:
                wu = _weight_tile(
                    w_base + up_offset * swn,
                    w_desc,
                    desc_row + up_offset,
                    cols,
                    col_ok,
                    k0,
                    k_dim,
                    swn,
                    BLOCK_K,
                    W_TMA,
                )
                acc_up = mma(a, wu, acc_up, PRECISION, INTERPRET)
        dtype = out_ptr.dtype.element_ty
        if GATED:
            g = acc.to(dtype).to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
            res = (act * acc_up.to(dtype).to(tl.float32)).to(dtype)
            store_ok = col_ok[None, :]
        else:
            res = acc.to(dtype)
            store_ok = col_ok[None, :] & row_ok[:, None]
        tl.store(out_ptr + pos[:, None] * so + cols[None, :], res, mask=store_ok)


@triton.jit
def _combine_kernel(
    slot_out_ptr, slot_pos_ptr, weight_ptr, out_ptr, hidden, TOP_K: tl.constexpr, BLOCK: tl.constexpr
):
    """out[t] = sum_j weight[t, j] * slot_out[position of slot t * TOP_K + j in the sorted layout]."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < hidden
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(TOP_K):  # slot order: a token's sum does not depend on its batch
        row = tl.load(slot_pos_ptr + t * TOP_K + j).to(tl.int64)
        v = tl.load(slot_out_ptr + row * hidden + cols, mask=mask, other=0.0).to(tl.float32)
        acc = acc + v * tl.load(weight_ptr + t * TOP_K + j)
    tl.store(out_ptr + t * hidden + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _descriptor(t: torch.Tensor, block: list[int], what: str, fix: str) -> TensorDescriptor:
    """A 2-D TMA descriptor of a row-major tensor seen as [numel / last dim, last dim]."""
    k = t.shape[-1]
    if (k * t.element_size()) % 16 or t.data_ptr() % 16:
        raise fail(
            what,
            f"shape {tuple(t.shape)} at a {t.data_ptr() % 16}-byte offset",
            f"TMA needs 16-byte aligned rows; {fix}",
        )
    return TensorDescriptor(t, [t.numel() // k, k], [k, 1], block)


def _weight_descriptor(w: torch.Tensor, block_n: int, cfg: MoeTiles) -> TensorDescriptor | torch.Tensor:
    """A [E * rows, K] TMA descriptor of an expert weight [E, rows, K], or the weight itself
    (an unused stand-in) on the pointer path."""
    if not cfg.tma:
        return w
    return _descriptor(w, [block_n, cfg.block_k], "expert weight", "use a tma=False tiling for this shape")


def padded_slots(n_slots: int, n_experts: int, block_m: int) -> int:
    """Worst-case length of the expert-sorted slot list: every expert's run padded to whole tiles."""
    return -(-(n_slots + n_experts * (block_m - 1)) // block_m) * block_m


@triton.jit(do_not_specialize=["n_slots", "n_rows", "n_tiles"])
def _count_kernel(
    ids_ptr,
    counts_ptr,
    sorted_ptr,
    block_expert_ptr,
    n_slots,
    n_rows,
    n_tiles,
    n_experts,
    BLOCK: tl.constexpr,
):
    """counts[e] = how many slots chose expert e (program e scans every slot). The programs also
    fill the layout's blanks, each its share: -1 in every row and n_experts (none) in every tile,
    which the place kernel then overwrites where slots and experts' tiles go (one launch instead
    of two fills and this one)."""
    e = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    for r0 in range(e * BLOCK, n_rows, n_experts * BLOCK):
        tl.store(sorted_ptr + r0 + lanes, tl.full([BLOCK], -1, tl.int32), mask=r0 + lanes < n_rows)
    for b0 in range(e * BLOCK, n_tiles, n_experts * BLOCK):
        tl.store(
            block_expert_ptr + b0 + lanes,
            tl.full([BLOCK], 0, tl.int32) + n_experts,
            mask=b0 + lanes < n_tiles,
        )
    hits = tl.zeros([BLOCK], tl.int32)
    for s0 in range(0, n_slots, BLOCK):
        s = s0 + lanes
        hits += (tl.load(ids_ptr + s, mask=s < n_slots, other=-1) == e).to(tl.int32)
    tl.store(counts_ptr + e, tl.sum(hits, 0))


@triton.jit(do_not_specialize=["n_slots"])
def _place_kernel(
    ids_ptr,
    counts_ptr,
    sorted_ptr,
    slot_pos_ptr,
    block_expert_ptr,
    n_slots,
    n_experts,
    BLOCK_M: tl.constexpr,
    BLOCK: tl.constexpr,
    E_POW2: tl.constexpr,
):
    """Program e writes its slots, in slot order, from its padded run's start, the inverse map
    (slot -> position) for them, and marks its tiles."""
    e = tl.program_id(0)
    ex = tl.arange(0, E_POW2)
    padded = (tl.load(counts_ptr + ex, mask=ex < n_experts, other=0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    start = tl.sum(tl.where(ex < e, padded, 0), 0)
    end = start + tl.sum(tl.where(ex == e, padded, 0), 0)
    for tile in range(start // BLOCK_M, end // BLOCK_M):
        tl.store(block_expert_ptr + tile, e)
    seen = start * 0
    for s0 in range(0, n_slots, BLOCK):
        s = s0 + tl.arange(0, BLOCK)
        hit = (tl.load(ids_ptr + s, mask=s < n_slots, other=-1) == e).to(tl.int32)
        position = start + seen + tl.cumsum(hit, 0) - 1
        tl.store(sorted_ptr + position, s.to(tl.int32), mask=hit > 0)
        tl.store(slot_pos_ptr + s, position, mask=hit > 0)
        seen += tl.sum(hit, 0)


# Slots each alignment program scans per step: its steps run one after another, so wider steps
# finish sooner (measured against 1024 slots and 4 warps as graph replays: bench/kernels/NOTES.md,
# "Fused MoE").
ALIGN_BLOCK = 4096
ALIGN_WARPS = 8


class Alignment(NamedTuple):
    """The expert-sorted layout of the (token, slot) pairs (semantics: reference_moe.align_to_experts).

    sorted_slots [P] int32: the slot (t * k + j) at each position, -1 for padding;
    block_expert [P / block_m] int32: each tile's expert, n_experts for tiles past the last run;
    slot_positions [T * k] int32: each slot's position (the inverse of sorted_slots).
    """

    sorted_slots: torch.Tensor
    block_expert: torch.Tensor
    slot_positions: torch.Tensor


def align_to_experts(
    topk_ids: torch.Tensor, n_experts: int, block_m: int = DEFAULT_TILES.block_m
) -> Alignment:
    """Group the slots (t * k + j) by expert in increasing slot order, each expert's group starting
    at a multiple of block_m. P = padded_slots(...) is a static bound. Two small kernels with one
    program per expert (count and fill the blanks, then place by a running count in slot order):
    fixed shapes, no host read, so it can be captured in a CUDA graph (CUB's sorts are not
    capturable at every size). Integer counts are exact.
    """
    flat = topk_ids.reshape(-1)
    n_slots = flat.numel()
    total = padded_slots(n_slots, n_experts, block_m)
    slot_positions = torch.empty(n_slots, dtype=torch.int32, device=flat.device)
    if n_slots == 0 or n_experts == 0:
        return Alignment(
            torch.full((total,), -1, dtype=torch.int32, device=flat.device),
            torch.full((total // block_m,), n_experts, dtype=torch.int32, device=flat.device),
            slot_positions,
        )
    sorted_slots = torch.empty(total, dtype=torch.int32, device=flat.device)
    block_expert = torch.empty(total // block_m, dtype=torch.int32, device=flat.device)
    counts = torch.empty(n_experts, dtype=torch.int32, device=flat.device)
    block, warps = ALIGN_BLOCK, ALIGN_WARPS
    _count_kernel[(n_experts,)](
        flat,
        counts,
        sorted_slots,
        block_expert,
        n_slots,
        total,
        total // block_m,
        n_experts,
        BLOCK=block,
        num_warps=warps,
    )
    _place_kernel[(n_experts,)](
        flat,
        counts,
        sorted_slots,
        slot_positions,
        block_expert,
        n_slots,
        n_experts,
        BLOCK_M=block_m,
        BLOCK=block,
        E_POW2=next_pow2(n_experts),
        num_warps=warps,
    )
    return Alignment(sorted_slots, block_expert, slot_positions)


def _check_inputs(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
) -> None:
    check_tensor("x", x, dtypes=FLOAT_DTYPES, ndim=2, contiguous=True)
    check_tensor("topk_ids", topk_ids, dtypes=(torch.int32, torch.int64), ndim=2)
    check_tensor("topk_weights", topk_weights, dtypes=(torch.float32,), ndim=2, contiguous=True)
    check_tensor("w_gate_up", w_gate_up, dtypes=(x.dtype,), ndim=3, contiguous=True)
    check_tensor("w_down", w_down, dtypes=(x.dtype,), ndim=3, contiguous=True)
    t, hidden = x.shape
    n_experts, two_i, h_w = w_gate_up.shape
    if h_w != hidden or two_i % 2:
        raise fail("w_gate_up.shape", tuple(w_gate_up.shape), f"need (E, 2I, {hidden})")
    if tuple(w_down.shape) != (n_experts, hidden, two_i // 2):
        raise fail("w_down.shape", tuple(w_down.shape), f"need {(n_experts, hidden, two_i // 2)}")
    if topk_weights.shape != topk_ids.shape or topk_ids.shape[0] != t:
        raise fail(
            "topk_ids/topk_weights shapes",
            (tuple(topk_ids.shape), tuple(topk_weights.shape)),
            f"need both ({t}, k)",
        )
    check_same_device(x=x, topk_ids=topk_ids, topk_weights=topk_weights, w_gate_up=w_gate_up, w_down=w_down)


def fused_moe(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    tiles: MoeTiles | None = None,
) -> torch.Tensor:
    """sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]), expert = down(silu(gate x) * up x).

    x [T, H] float32/float16/bfloat16 contiguous; topk_ids [T, k] int32/int64 in [0, E);
    topk_weights [T, k] float32; w_gate_up [E, 2I, H] and w_down [E, H, I] contiguous, x's dtype.
    Returns [T, H] in x's dtype (semantics of reference_moe.moe_experts). `tiles` overrides the
    tiling for tuning; batch invariance holds while one tiling serves every T of a shape.
    Capturable in a CUDA graph: no host sync, grids sized from shapes only.
    """
    _check_inputs(x, topk_ids, topk_weights, w_gate_up, w_down)
    t, hidden = x.shape
    n_experts, two_i, _ = w_gate_up.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    cfg = tiles or moe_tiles(hidden, inter, x.dtype, t * top_k / max(1, n_experts), x.device)
    if tiles is None and cfg.tma and (w_gate_up.data_ptr() % 16 or w_down.data_ptr() % 16):
        cfg = DEFAULT_TILES  # weights at an offset the copy engine cannot address (same bits on Hopper)
    out = torch.empty_like(x)
    if t == 0 or top_k == 0:
        return out.zero_()
    if x.data_ptr() % 16:
        # Triton compiles a variant per pointer alignment; one alignment keeps every call on the
        # same machine code (the copy changes no value).
        x = x.clone()
    layout = align_to_experts(topk_ids, n_experts, cfg.block_m)
    n_tiles = layout.block_expert.shape[0]
    n_rows = layout.sorted_slots.shape[0]
    common = dict(
        BLOCK_M=cfg.block_m,
        BLOCK_K=cfg.block_k,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        INTERPRET=interpreting(),
        W_TMA=cfg.tma,
        GROUP_M=cfg.group_m,
    )
    # Both GEMMs write rows in the expert-sorted layout, so the down GEMM reads its input as whole
    # contiguous tiles; the combine gathers each token's slots back through slot_positions.
    act = torch.empty(n_rows, inter, dtype=x.dtype, device=x.device)
    _grouped_gemm_kernel[(n_tiles * triton.cdiv(inter, cfg.block_n),)](
        x,
        x,
        w_gate_up,
        _weight_descriptor(w_gate_up, cfg.block_n, cfg),
        act,
        layout.sorted_slots,
        layout.block_expert,
        inter,
        hidden,
        top_k,
        x.stride(0),
        w_gate_up.stride(0),
        w_gate_up.stride(1),
        act.stride(0),
        n_experts,
        inter,
        two_i,
        n_tiles,
        GATED=True,
        A_SORTED=False,
        A_TMA=False,
        BLOCK_N=cfg.block_n,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **common,
    )
    down_n, down_warps, down_stages = cfg.down()
    act_rows = (
        _descriptor(act, [cfg.block_m, cfg.block_k], "activation rows", "use a tma_rows=False tiling")
        if cfg.tma_rows
        else act
    )
    slot_out = torch.empty(n_rows, hidden, dtype=x.dtype, device=x.device)
    _grouped_gemm_kernel[(n_tiles * triton.cdiv(hidden, down_n),)](
        act,
        act_rows,
        w_down,
        _weight_descriptor(w_down, down_n, cfg),
        slot_out,
        layout.sorted_slots,
        layout.block_expert,
        hidden,
        inter,
        1,
        act.stride(0),
        w_down.stride(0),
        w_down.stride(1),
        slot_out.stride(0),
        n_experts,
        0,
        hidden,
        n_tiles,
        GATED=False,
        A_SORTED=True,
        A_TMA=cfg.tma_rows,
        BLOCK_N=down_n,
        num_warps=down_warps,
        num_stages=down_stages,
        **common,
    )
    block = min(1024, next_pow2(hidden))
    _combine_kernel[(t, triton.cdiv(hidden, block))](
        slot_out, layout.slot_positions, topk_weights, out, hidden, TOP_K=top_k, BLOCK=block
    )
    return out
