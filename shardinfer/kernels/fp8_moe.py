"""The fused MoE (kernels/moe.py) with FP8 expert weights, block-scaled or per-channel scaled.

    x [T, H] -> quantised per token and 128 channels (fp8_quant.py)
    w_gate_up [E, 2I, H] float8_e4m3fn, w_gate_up_scale [E, ceil(2I/128), ceil(H/128)] or [E, 2I] float32
    w_down    [E, H, I]  float8_e4m3fn, w_down_scale    [E, ceil(H/128), ceil(I/128)] or [E, H]  float32

(128x128 block scales, or one scale per output channel of each expert; both weights in the same
layout.) Same expert-sorted layout, tiles and combine as the bf16 kernel (moe.align_to_experts,
its combine kernel); the grouped GEMMs walk K one 128-channel scale group at a time like
fp8_matmul.py: each step's FP8 tensor-core product lands in a fresh float32 tile that is scaled
by the row's activation scale (and a block scale's column scale) and added to the accumulator; a
per-channel scale multiplies the accumulator once, before the epilogue. The
gate/up output (silu(gate) * up, rounded to x's dtype as in the bf16 kernel) is quantised again
per row and 128 channels before the down GEMM. Batch invariance is the bf16 kernel's: a GEMM row
is one (token, slot) pair reduced over K in a fixed order by one program, MMA rows do not mix, one
tiling serves every batch size, and both quantisers work per row.
Semantics = reference_moe.moe_experts_fp8; only the float32 summation order differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from shardinfer.kernels import fp8_quant
from shardinfer.kernels._common import (
    FLOAT_DTYPES,
    check_same_device,
    check_tensor,
    check_tiles,
    fail,
    interpreting,
)
from shardinfer.kernels.moe import _combine_kernel, align_to_experts
from shardinfer.kernels.reference_fp8 import FP8_DTYPE, GROUP

__all__ = ["Fp8MoeTiles", "fused_moe_fp8"]


@dataclass(frozen=True)
class Fp8MoeTiles:
    """One tiling of both FP8 grouped GEMMs (BLOCK_K is the 128-channel scale group)."""

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8

    def __post_init__(self) -> None:
        check_tiles(self, ("block_m", "block_n"), ("num_warps", "num_stages", "group_m"))
        if self.block_n > GROUP:
            raise ValueError(
                f"Fp8MoeTiles.block_n: got {self.block_n}, need <= {GROUP} "
                "(a column tile must sit inside one weight-scale block)"
            )


DEFAULT_TILES = Fp8MoeTiles()


@triton.jit
def _mma_fp8(a, b, INTERPRET: tl.constexpr):
    """a @ b for one 128-channel step into a fresh float32 tile (see fp8_matmul._mma_fp8)."""
    if INTERPRET:
        out = tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    else:
        out = tl.dot(a, b)
    return out


@triton.jit
def _scaled_step(
    a,
    sa,
    w_base,
    ws_base,
    rows_w,
    col_ok,
    kt,
    k_dim,
    swn,
    swsn,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
    CHANNEL_SCALES: tl.constexpr,
):
    """One K step of a against weight rows `rows_w`: the float32 product times the activation
    scale and, for block scales, the weight's (a channel scale is applied after the K loop)."""
    ks = kt * BLOCK_K + tl.arange(0, BLOCK_K)
    w = tl.load(
        w_base + rows_w[None, :] * swn + ks[:, None], mask=col_ok[None, :] & (ks < k_dim)[:, None], other=0.0
    )
    part = _mma_fp8(a, w, INTERPRET) * sa[:, None]
    if not CHANNEL_SCALES:
        sw = tl.load(ws_base + (rows_w // BLOCK_K) * swsn + kt, mask=col_ok, other=0.0)
        part = part * sw[None, :]
    return part


@triton.jit(do_not_specialize=["n_tiles"])
def _fp8_grouped_gemm_kernel(
    a_ptr,
    as_ptr,
    w_ptr,
    ws_ptr,
    out_ptr,
    sorted_ptr,
    block_expert_ptr,
    n_cols,
    k_dim,
    a_row_div,
    sa_row,
    sas_row,
    swe,
    swn,
    swse,
    swsn,
    so,
    n_experts,
    up_offset,
    n_tiles,
    GATED: tl.constexpr,
    A_SORTED: tl.constexpr,
    CHANNEL_SCALES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """moe._grouped_gemm_kernel's tiles and epilogue on FP8 operands with their scales."""
    n_blocks = tl.cdiv(n_cols, BLOCK_N)
    pid = tl.program_id(0)
    first = pid // (GROUP_M * n_blocks) * GROUP_M
    size = tl.minimum(n_tiles - first, GROUP_M)
    tile = first + pid % (GROUP_M * n_blocks) % size
    col_block = pid % (GROUP_M * n_blocks) // size
    expert = tl.load(block_expert_ptr + tile)
    if expert < n_experts:  # tiles past the last expert's run (worst-case grid) do nothing
        pos = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        slot = tl.load(sorted_ptr + pos)
        row_ok = slot >= 0
        a_row = pos if A_SORTED else tl.where(row_ok, slot // a_row_div, 0).to(tl.int64)
        cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < n_cols
        w_base = w_ptr + expert.to(tl.int64) * swe
        ws_base = ws_ptr + expert.to(tl.int64) * swse
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for kt in range(0, tl.cdiv(k_dim, BLOCK_K)):
            ks = kt * BLOCK_K + tl.arange(0, BLOCK_K)
            a_ok = (ks < k_dim)[None, :] if A_SORTED else row_ok[:, None] & (ks < k_dim)[None, :]
            a = tl.load(a_ptr + a_row[:, None] * sa_row + ks[None, :], mask=a_ok, other=0.0)
            if A_SORTED:  # the layout's own rows: all defined (the gated GEMM wrote its padding rows)
                sa = tl.load(as_ptr + a_row * sas_row + kt)
            else:
                sa = tl.load(as_ptr + a_row * sas_row + kt, mask=row_ok, other=0.0)
            acc += _scaled_step(
                a, sa, w_base, ws_base, cols, col_ok, kt, k_dim, swn, swsn, BLOCK_K, INTERPRET, CHANNEL_SCALES
            )
            if GATED:
                acc_up += _scaled_step(
                    a,
                    sa,
                    w_base,
                    ws_base,
                    up_offset + cols,
                    col_ok,
                    kt,
                    k_dim,
                    swn,
                    swsn,
                    BLOCK_K,
                    INTERPRET,
                    CHANNEL_SCALES,
                )
        if CHANNEL_SCALES:  # one scale per output channel (stride swsn), the same for every K step
            acc = acc * tl.load(ws_base + cols * swsn, mask=col_ok, other=0.0)[None, :]
            if GATED:
                acc_up = (
                    acc_up * tl.load(ws_base + (up_offset + cols) * swsn, mask=col_ok, other=0.0)[None, :]
                )
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


def _check(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_gate_up_scale: torch.Tensor,
    w_down: torch.Tensor,
    w_down_scale: torch.Tensor,
) -> None:
    check_tensor("x", x, dtypes=FLOAT_DTYPES, ndim=2, contiguous=True)
    check_tensor("topk_ids", topk_ids, dtypes=(torch.int32, torch.int64), ndim=2)
    check_tensor("topk_weights", topk_weights, dtypes=(torch.float32,), ndim=2, contiguous=True)
    for name, w in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        check_tensor(name, w, dtypes=(FP8_DTYPE,), ndim=3, contiguous=True)
    t, hidden = x.shape
    n_experts, two_i, h_w = w_gate_up.shape
    if h_w != hidden or two_i % 2:
        raise fail("w_gate_up.shape", tuple(w_gate_up.shape), f"need (E, 2I, {hidden})")
    if tuple(w_down.shape) != (n_experts, hidden, two_i // 2):
        raise fail("w_down.shape", tuple(w_down.shape), f"need {(n_experts, hidden, two_i // 2)}")
    for name, sc, w in (
        ("w_gate_up_scale", w_gate_up_scale, w_gate_up),
        ("w_down_scale", w_down_scale, w_down),
    ):
        check_tensor(name, sc, dtypes=(torch.float32,), contiguous=True)
        blocks = (w.shape[0], -(-w.shape[1] // GROUP), -(-w.shape[2] // GROUP))
        channels = (w.shape[0], w.shape[1])
        if tuple(sc.shape) not in (blocks, channels):
            raise fail(
                f"{name}.shape",
                tuple(sc.shape),
                f"need {blocks} (one scale per 128x128 block of each expert) or {channels} (one per output "
                "channel of each expert)",
            )
    if w_gate_up_scale.dim() != w_down_scale.dim():
        raise fail(
            "w_gate_up_scale/w_down_scale ranks",
            (w_gate_up_scale.dim(), w_down_scale.dim()),
            "need both block scales (3-D) or both channel scales (2-D)",
        )
    if topk_weights.shape != topk_ids.shape or topk_ids.shape[0] != t:
        raise fail(
            "topk_ids/topk_weights shapes",
            (tuple(topk_ids.shape), tuple(topk_weights.shape)),
            f"need both ({t}, k)",
        )
    check_same_device(
        x=x,
        topk_ids=topk_ids,
        topk_weights=topk_weights,
        w_gate_up=w_gate_up,
        w_down=w_down,
        w_gate_up_scale=w_gate_up_scale,
        w_down_scale=w_down_scale,
    )


def fused_moe_fp8(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_gate_up_scale: torch.Tensor,
    w_down: torch.Tensor,
    w_down_scale: torch.Tensor,
    tiles: Fp8MoeTiles | None = None,
) -> torch.Tensor:
    """sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]) with FP8 experts (module docstring).

    x [T, H] float contiguous; topk_ids [T, k] in [0, E); topk_weights [T, k] float32; weights and
    scales as in the module docstring, contiguous. Returns [T, H] in x's dtype. One tiling serves
    every T; capturable in a CUDA graph (no host sync, grids from shapes only).
    """
    _check(x, topk_ids, topk_weights, w_gate_up, w_gate_up_scale, w_down, w_down_scale)
    cfg = tiles or DEFAULT_TILES
    t, hidden = x.shape
    n_experts, two_i, _ = w_gate_up.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    out = torch.empty_like(x)
    if t == 0 or top_k == 0:
        return out.zero_()
    xq, xs = fp8_quant.quantize_groups(x)
    layout = align_to_experts(topk_ids, n_experts, cfg.block_m)
    n_tiles = layout.block_expert.shape[0]
    n_rows = layout.sorted_slots.shape[0]
    common = dict(
        CHANNEL_SCALES=w_gate_up_scale.dim() == 2,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=GROUP,
        INTERPRET=interpreting(),
        GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    act = torch.empty(n_rows, inter, dtype=x.dtype, device=x.device)
    _fp8_grouped_gemm_kernel[(n_tiles * triton.cdiv(inter, cfg.block_n),)](
        xq,
        xs,
        w_gate_up,
        w_gate_up_scale,
        act,
        layout.sorted_slots,
        layout.block_expert,
        inter,
        hidden,
        top_k,
        xq.stride(0),
        xs.stride(0),
        w_gate_up.stride(0),
        w_gate_up.stride(1),
        w_gate_up_scale.stride(0),
        w_gate_up_scale.stride(1),
        act.stride(0),
        n_experts,
        inter,
        n_tiles,
        GATED=True,
        A_SORTED=False,
        **common,
    )
    aq, a_s = fp8_quant.quantize_groups(act)  # every row written (padding rows: zeros)
    slot_out = torch.empty(n_rows, hidden, dtype=x.dtype, device=x.device)
    _fp8_grouped_gemm_kernel[(n_tiles * triton.cdiv(hidden, cfg.block_n),)](
        aq,
        a_s,
        w_down,
        w_down_scale,
        slot_out,
        layout.sorted_slots,
        layout.block_expert,
        hidden,
        inter,
        1,
        aq.stride(0),
        a_s.stride(0),
        w_down.stride(0),
        w_down.stride(1),
        w_down_scale.stride(0),
        w_down_scale.stride(1),
        slot_out.stride(0),
        n_experts,
        0,
        n_tiles,
        GATED=False,
        A_SORTED=True,
        **common,
    )
    block = min(1024, triton.next_power_of_2(hidden))
    _combine_kernel[(t, triton.cdiv(hidden, block))](
        slot_out, layout.slot_positions, topk_weights, out, hidden, TOP_K=top_k, BLOCK=block
    )
    return out
