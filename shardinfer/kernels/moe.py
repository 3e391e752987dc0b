"""Fused mixture-of-experts FFN: route-sorted grouped GEMMs with SiLU-and-mul in the epilogue.

    x [T, H]; topk_ids [T, k]; topk_weights [T, k] float32
    w_gate_up [E, 2I, H] ([gate | up] rows per expert); w_down [E, H, I]

1. align (two kernels, one program per expert: count, then place; no host sync, no
   data-dependent shape, no sort): the T*k (token, slot)
   pairs are grouped by expert and each expert's run is padded to a multiple of BLOCK_M, so every tile of
   BLOCK_M rows belongs to one expert. Padding rows hold -1. The buffer has the worst-case size
   T*k + E*(BLOCK_M - 1) (rounded up to whole tiles), computed from shapes alone, and tiles past
   the last expert's are marked with expert id E and exit at once. So the launch grids depend
   on shapes only, and the whole layer can be captured in a CUDA graph.
2. gate/up GEMM, one program per (row tile, I / BLOCK_N column block), launched in groups of
   row tiles (`MoeTiles.group_m`): a tile gathers its tokens' rows of x, multiplies by
   the expert's gate and up weights, and writes silu(gate) * up per slot ([T*k, I]).
3. down GEMM, one program per (row tile, H / BLOCK_N column block): per slot, [T*k, H] in x's dtype.
4. combine, grid (T, H / BLOCK): out[t] = sum_j weight[t, j] * slot_out[t, j], in slot order, float32.

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


@dataclass(frozen=True)
class MoeTiles:
    """One tiling of both grouped GEMMs. Any fixed tiling is batch invariant; they differ in speed."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    # Expert weights through the tensor-memory accelerator (Hopper and later). The gathered token
    # rows always use pointer loads: they are scattered over x, which TMA tiles cannot express.
    tma: bool = False
    # Launch order: programs walk every column block of `group_m` consecutive row tiles before
    # the next group, so the programs running at once share a few tiles' token rows and one or
    # two experts' weights in L2. 0: row tiles fastest, every column block's pass over all tiles
    # in turn. Order only: no value depends on it.
    group_m: int = 0

    def __post_init__(self) -> None:
        check_tiles(self, ("block_m", "block_n", "block_k"), ("num_warps", "num_stages"))
        if self.group_m < 0:
            raise ValueError(f"MoeTiles.group_m: got {self.group_m}, need >= 0 (0: row tiles fastest)")


DEFAULT_TILES = MoeTiles(group_m=8)
# Prefill-sized batches (at least LARGE_TILE_ROWS (token, slot) rows per expert on average): twice
# the rows and columns per tile, so each weight and token tile loaded feeds twice the MMA work.
# bench_moe.py on an H200 (bench/kernels/NOTES.md): 8192 tokens 2.53 -> 1.93 ms, 2048 tokens
# 0.86 -> 0.78 ms; at 1024 tokens and below the small tiles are as fast or faster.
LARGE_TILES = MoeTiles(128, 128, 64, 8, 3, group_m=8)
LARGE_TILE_ROWS = 128
# Measured winners per (hidden, intermediate, dtype), replacing both tilings above.
TILE_OVERRIDES: dict[tuple[int, int, torch.dtype], MoeTiles] = {}


def moe_tiles(hidden: int, inter: int, dtype: torch.dtype, rows_per_expert: float = 0.0,
              device: torch.device | None = None) -> MoeTiles:
    """The tiling for an expert shape and batch size (rows_per_expert = tokens * top_k / experts).

    A tiling chosen by batch size must give every row the bits it gets at any other size. On
    Hopper the two tilings do: both run the K loop in BLOCK_K = 64 steps on wgmma, whose rows do
    not mix (GPU test: test_wgmma_tilings_compute_the_default_bits). Elsewhere (other GPUs, the
    CPU interpreter) that is not verified, so one tiling serves every size there.
    """
    if (hidden, inter, dtype) in TILE_OVERRIDES:
        return TILE_OVERRIDES[(hidden, inter, dtype)]
    hopper = device is not None and device.type == "cuda" and capability(device.index or 0) == (9, 0)
    if hopper and rows_per_expert >= LARGE_TILE_ROWS:
        return LARGE_TILES
    return DEFAULT_TILES


@triton.jit
def _weight_tile(w_base, w_desc, desc_row, cols, col_ok, k0, k_dim, swn,
                 BLOCK_K: tl.constexpr, TMA: tl.constexpr):
    """The [BLOCK_K, BLOCK_N] tile (w[expert, cols, k0:k0 + BLOCK_K])^T of a row-major [E, rows, K] weight.

    TMA: the descriptor sees the weight as [E * rows, K] and desc_row = expert * rows + first col;
    tile rows past the expert's own (a partial last column block) read the next expert's rows or
    zeros, and are dropped at the store; columns past K are zero-filled by the copy engine.
    """
    if TMA:
        tile = w_desc.load([desc_row, k0]).T
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        tile = tl.load(w_base + cols[None, :] * swn + ks[:, None], mask=col_ok[None, :] & (ks < k_dim)[:, None],
                       other=0.0)
    return tile


@triton.jit(do_not_specialize=["n_tiles"])
def _grouped_gemm_kernel(a_ptr, w_ptr, w_desc, out_ptr, sorted_ptr, block_expert_ptr, n_cols, k_dim, a_row_div,
                         sa, swe, swn, so, n_experts, up_offset, rows_per_expert, n_tiles,
                         GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr,
                         TMA: tl.constexpr, GROUP_M: tl.constexpr):
    """out[slot, n] = a[slot // a_row_div] . w[e, n] (GATED: silu(. w[e, n]) * (. w[e, up_offset + n]))."""
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
        rows = tl.arange(0, BLOCK_M)
        slot = tl.load(sorted_ptr + tile * BLOCK_M + rows)
        row_ok = slot >= 0
        a_row = tl.where(row_ok, slot // a_row_div, 0).to(tl.int64)
        n0 = col_block * BLOCK_N
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < n_cols
        w_base = w_ptr + expert.to(tl.int64) * swe
        desc_row = expert * rows_per_expert + n0
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, k_dim, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(a_ptr + a_row[:, None] * sa + ks[None, :], mask=row_ok[:, None] & (ks < k_dim)[None, :],
                        other=0.0)
            w = _weight_tile(w_base, w_desc, desc_row, cols, col_ok, k0, k_dim, swn, BLOCK_K, TMA)
            acc = mma(a, w, acc, PRECISION, INTERPRET)
            if GATED:
                wu = _weight_tile(w_base + up_offset * swn, w_desc, desc_row + up_offset, cols, col_ok, k0, k_dim,
                                  swn, BLOCK_K, TMA)
                acc_up = mma(a, wu, acc_up, PRECISION, INTERPRET)
        dtype = out_ptr.dtype.element_ty
        if GATED:
            g = acc.to(dtype).to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
            res = (act * acc_up.to(dtype).to(tl.float32)).to(dtype)
        else:
            res = acc.to(dtype)
        out_rows = tl.where(row_ok, slot, 0).to(tl.int64)
        tl.store(out_ptr + out_rows[:, None] * so + cols[None, :], res, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _combine_kernel(slot_out_ptr, weight_ptr, out_ptr, hidden, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < hidden
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(TOP_K):  # slot order: a token's sum does not depend on its batch
        v = tl.load(slot_out_ptr + (t * TOP_K + j) * hidden + cols, mask=mask, other=0.0).to(tl.float32)
        acc = acc + v * tl.load(weight_ptr + t * TOP_K + j)
    tl.store(out_ptr + t * hidden + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _weight_descriptor(w: torch.Tensor, cfg: MoeTiles) -> TensorDescriptor | torch.Tensor:
    """A [E * rows, K] TMA descriptor of an expert weight [E, rows, K], or the weight itself
    (an unused stand-in) on the pointer path."""
    if not cfg.tma:
        return w
    e, rows, k = w.shape
    if (k * w.element_size()) % 16 or w.data_ptr() % 16:
        raise fail("expert weight", f"shape {tuple(w.shape)} at a {w.data_ptr() % 16}-byte offset",
                   "a tma=True tiling needs 16-byte aligned rows; use a tma=False tiling for this shape")
    return TensorDescriptor(w, [e * rows, k], [k, 1], [cfg.block_n, cfg.block_k])


def padded_slots(n_slots: int, n_experts: int, block_m: int) -> int:
    """Worst-case length of the expert-sorted slot list: every expert's run padded to whole tiles."""
    return -(-(n_slots + n_experts * (block_m - 1)) // block_m) * block_m


@triton.jit(do_not_specialize=["n_slots"])
def _count_kernel(ids_ptr, counts_ptr, n_slots, BLOCK: tl.constexpr):
    """counts[e] = how many slots chose expert e (program e scans every slot)."""
    e = tl.program_id(0)
    hits = tl.zeros([BLOCK], tl.int32)
    for s0 in range(0, n_slots, BLOCK):
        s = s0 + tl.arange(0, BLOCK)
        hits += (tl.load(ids_ptr + s, mask=s < n_slots, other=-1) == e).to(tl.int32)
    tl.store(counts_ptr + e, tl.sum(hits, 0))


@triton.jit(do_not_specialize=["n_slots"])
def _place_kernel(ids_ptr, counts_ptr, sorted_ptr, block_expert_ptr, n_slots, n_experts,
                  BLOCK_M: tl.constexpr, BLOCK: tl.constexpr, E_POW2: tl.constexpr):
    """Program e writes its slots, in slot order, from its padded run's start, and marks its tiles."""
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
        rank = seen + tl.cumsum(hit, 0) - 1
        tl.store(sorted_ptr + start + rank, s.to(tl.int32), mask=hit > 0)
        seen += tl.sum(hit, 0)


def align_to_experts(topk_ids: torch.Tensor, n_experts: int, block_m: int = DEFAULT_TILES.block_m
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_slots [P] int32 with -1 padding, block_expert [P / block_m] int32, n_experts = none).

    Slots (t * k + j) are grouped by expert in increasing slot order; each expert's group starts
    at a multiple of block_m (semantics: reference_moe.align_to_experts). P = padded_slots(...)
    is a static bound. Two small kernels with one program per expert (count, then place by a
    running count in slot order) and two fills: fixed shapes, no host read, so it can be captured
    in a CUDA graph (CUB's sorts are not capturable at every size). Integer counts are exact.
    """
    flat = topk_ids.reshape(-1)
    n_slots = flat.numel()
    total = padded_slots(n_slots, n_experts, block_m)
    sorted_slots = torch.full((total,), -1, dtype=torch.int32, device=flat.device)
    block_expert = torch.full((total // block_m,), n_experts, dtype=torch.int32, device=flat.device)
    if n_slots == 0 or n_experts == 0:
        return sorted_slots, block_expert
    counts = torch.empty(n_experts, dtype=torch.int32, device=flat.device)
    block = 1024
    _count_kernel[(n_experts,)](flat, counts, n_slots, BLOCK=block, num_warps=4)
    _place_kernel[(n_experts,)](flat, counts, sorted_slots, block_expert, n_slots, n_experts, BLOCK_M=block_m,
                                BLOCK=block, E_POW2=next_pow2(n_experts), num_warps=4)
    return sorted_slots, block_expert


def _check_inputs(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w_gate_up: torch.Tensor,
                  w_down: torch.Tensor) -> None:
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
        raise fail("topk_ids/topk_weights shapes", (tuple(topk_ids.shape), tuple(topk_weights.shape)),
                   f"need both ({t}, k)")
    check_same_device(x=x, topk_ids=topk_ids, topk_weights=topk_weights, w_gate_up=w_gate_up, w_down=w_down)


def fused_moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w_gate_up: torch.Tensor,
              w_down: torch.Tensor, tiles: MoeTiles | None = None) -> torch.Tensor:
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
    out = torch.empty_like(x)
    if t == 0 or top_k == 0:
        return out.zero_()
    if x.data_ptr() % 16:
        # Triton compiles a variant per pointer alignment; one alignment keeps every call on the
        # same machine code (the copy changes no value).
        x = x.clone()
    sorted_slots, block_expert = align_to_experts(topk_ids, n_experts, cfg.block_m)
    n_tiles = block_expert.shape[0]
    common = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                  PRECISION="ieee" if x.dtype == torch.float32 else "tf32", INTERPRET=interpreting(),
                  TMA=cfg.tma, GROUP_M=cfg.group_m, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    act = torch.empty(t * top_k, inter, dtype=x.dtype, device=x.device)
    _grouped_gemm_kernel[(n_tiles * triton.cdiv(inter, cfg.block_n),)](
        x, w_gate_up, _weight_descriptor(w_gate_up, cfg), act, sorted_slots, block_expert, inter, hidden, top_k,
        x.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), act.stride(0), n_experts, inter, two_i, n_tiles,
        GATED=True, **common)
    slot_out = torch.empty(t * top_k, hidden, dtype=x.dtype, device=x.device)
    _grouped_gemm_kernel[(n_tiles * triton.cdiv(hidden, cfg.block_n),)](
        act, w_down, _weight_descriptor(w_down, cfg), slot_out, sorted_slots, block_expert, hidden, inter, 1,
        act.stride(0), w_down.stride(0), w_down.stride(1), slot_out.stride(0), n_experts, 0, hidden, n_tiles,
        GATED=False, **common)
    block = min(1024, next_pow2(hidden))
    _combine_kernel[(t, triton.cdiv(hidden, block))](slot_out, topk_weights, out, hidden, TOP_K=top_k, BLOCK=block)
    return out
