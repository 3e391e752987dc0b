"""Per-head batch-invariant matmul: out[t, h] = x[t, h] @ w_nk[h].T for all heads in one launch.

    x [T, H, K] (any row and head strides, last dim contiguous); w_nk [H, N, K] contiguous
    -> out [T, H, N] contiguous, in x's dtype, accumulated in float32.

DeepSeek's absorbed MLA multiplies every head's query by its own W_UK (K=128 -> N=512) and every
head's attention output by its own W_UV (K=512 -> N=128). One launch per head costs 2 * H tiny
launches per layer; here the grid is (row tiles of T, column tiles of N, heads), so a decode
step launches once per product. x is typically a strided view (q[..., :nope]) and is read in
place through its strides.

Batch invariance (row t's values bitwise independent of T and of where row t lands in a tile):
- One tiling per (H, K, N, dtype) (`heads_tiles`), never chosen from T; T only sets the number
  of row tiles in the grid.
- Each output tile is computed by one program that walks K from 0 in BLOCK_K steps into one
  float32 accumulator (no split-K), and MMA rows do not mix, so a row's reduction order is the
  same at every T and every tile row.
- Rows past T read row 0 instead of being masked (their results are dropped at the store), so
  the K loop does not depend on T; the kernel is compiled without specialising on T, and an x
  whose alignment differs from a fresh [T, H, K] tensor's is copied, so every T runs the very
  same machine code (Triton compiles one variant per pointer alignment and stride divisibility).
- Under Triton's CPU interpreter tl.dot is numpy's BLAS, which rounds a row differently at
  different positions of the block; `_mma.mma` uses a broadcast product summed over K in order
  there, so the CPU tests check invariance bit for bit, as the GPU tests do.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from shardinfer.kernels._common import (
    FLOAT_DTYPES,
    check_same_device,
    check_tensor,
    check_tiles,
    fail,
    interpreting,
)
from shardinfer.kernels._mma import k_loop
from shardinfer.kernels.tuning import TileChooser, Tiling

MAX_GRID_YZ = 65535  # CUDA's limit on the grid's 2nd and 3rd dims (column tiles, heads)


@dataclass(frozen=True)
class HeadsTiles:
    """One tiling. Any fixed tiling is batch invariant; they differ only in speed."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        check_tiles(self, ("block_m", "block_n", "block_k"), ("num_warps", "num_stages"))


# Measured winners per (H, K, N, dtype). Never key an entry on T: a row would then be reduced
# in another order at another batch size.
TILE_OVERRIDES: dict[tuple[int, int, int, torch.dtype], HeadsTiles] = {}


def _default_tiling(
    key: tuple[int, int, int, torch.dtype], device: torch.device | None
) -> Tiling[HeadsTiles]:
    if key[3] == torch.float32:
        # IEEE float32 runs on the FMA units; a 32-wide K step keeps the operand tiles small.
        return Tiling(HeadsTiles(64, 64, 32))
    return Tiling(HeadsTiles(64, 64, 64))


_CHOOSER: TileChooser[tuple[int, int, int, torch.dtype], HeadsTiles] = TileChooser(
    TILE_OVERRIDES, _default_tiling
)


def heads_tiles(h: int, k: int, n: int, dtype: torch.dtype) -> HeadsTiles:
    """The one tiling used for every T of an (H, K, N, dtype) problem (kernels/tuning.py)."""
    return _CHOOSER.choose((h, k, n, dtype))


@triton.jit(do_not_specialize=["T"])
def _heads_matmul_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    T,
    N,
    K,
    stride_xt,
    stride_xh,
    stride_wh,
    stride_wn,
    stride_yt,
    stride_yh,
    EVEN_K: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    head = tl.program_id(2).to(tl.int64)
    # Rows past T and columns past N load row/column 0, so the K loop needs no row or column masks.
    safe_rows = tl.where(rows < T, rows, 0).to(tl.int64)
    safe_cols = tl.where(cols < N, cols, 0).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + head * stride_xh + safe_rows[:, None] * stride_xt + offs_k[None, :]
    w_ptrs = w_ptr + head * stride_wh + safe_cols[None, :] * stride_wn + offs_k[:, None]  # w_nk[h].T tile
    acc = k_loop(
        x_ptrs,
        w_ptrs,
        tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32),
        0,
        tl.cdiv(K, BLOCK_K),
        K,
        EVEN_K,
        BLOCK_K,
        PRECISION,
        INTERPRET,
    )
    y_ptrs = y_ptr + head * stride_yh + rows.to(tl.int64)[:, None] * stride_yt + cols[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(rows[:, None] < T) & (cols[None, :] < N))


def _spec(v: int) -> tuple[bool, bool]:
    """What Triton specialises an integer argument on: divisibility by 16 and equality to 1."""
    return v % 16 == 0, v == 1


def _check(x: object, w_nk: object) -> tuple[torch.Tensor, torch.Tensor]:
    x = check_tensor("x", x, dtypes=FLOAT_DTYPES, ndim=3, last_dim_contiguous=True)
    w_nk = check_tensor("w_nk", w_nk, dtypes=(x.dtype,), ndim=3, contiguous=True)
    _, h, k = x.shape
    if w_nk.shape[0] != h or w_nk.shape[2] != k:
        raise fail(
            "w_nk.shape",
            tuple(w_nk.shape),
            f"need [{h}, N, {k}]: one [N, K] weight per head of x [T, H, K] = {tuple(x.shape)}",
        )
    check_same_device(x=x, w_nk=w_nk)
    return x, w_nk


def heads_matmul(x: torch.Tensor, w_nk: torch.Tensor, tiles: HeadsTiles | None = None) -> torch.Tensor:
    """out[t, h] = x[t, h] @ w_nk[h].T for every head, each row bitwise independent of T.

    x: [T, H, K] bfloat16/float16/float32 on CUDA, last dim contiguous (any T and H strides);
    w_nk: [H, N, K] contiguous, x's dtype (each head's weight as [N, K] rows).
    Returns a contiguous [T, H, N] tensor of x's dtype, accumulated in float32 (IEEE products
    for float32, never TF32). `tiles` overrides the tiling for tuning and tests; invariance holds
    while one tiling serves every T of a problem. Raises ValueError naming a bad argument.
    """
    x, w_nk = _check(x, w_nk)
    t, h, k = x.shape
    n = w_nk.shape[1]
    cfg = tiles or heads_tiles(h, k, n, x.dtype)
    y = torch.empty((t, h, n), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    if k == 0:
        return y.zero_()
    # A single row's stride is never used (rows past T read row 0); give the fresh tensor's so
    # T=1 compiles to the same variant as every other T.
    stride_xt = x.stride(0) if t > 1 else h * k
    stride_xh = x.stride(1) if h > 1 else k
    fresh = (h * k, k)
    if x.data_ptr() % 16 or _spec(stride_xt) != _spec(fresh[0]) or _spec(stride_xh) != _spec(fresh[1]):
        # Another alignment would compile another variant; the copy (a fresh, aligned [T, H, K]
        # buffer) changes no value. The model's inputs (q[..., :nope], the attention output)
        # never need it.
        x = torch.empty((t, h, k), dtype=x.dtype, device=x.device).copy_(x)
        stride_xt, stride_xh = fresh
    grid = (triton.cdiv(t, cfg.block_m), triton.cdiv(n, cfg.block_n), h)
    if max(grid[1:]) > MAX_GRID_YZ:
        raise fail(
            "w_nk.shape",
            tuple(w_nk.shape),
            f"need H and N / block_n ({cfg.block_n}) <= {MAX_GRID_YZ}, CUDA's grid limit",
        )
    # Triton launches on the current device; switch only when x lives elsewhere.
    switch = x.is_cuda and x.device.index is not None and x.device.index != torch.cuda.current_device()
    with torch.cuda.device(x.device) if switch else contextlib.nullcontext():
        _heads_matmul_kernel[grid](
            x,
            w_nk,
            y,
            t,
            n,
            k,
            stride_xt,
            stride_xh,
            w_nk.stride(0),
            w_nk.stride(1),
            y.stride(0),
            y.stride(1),
            EVEN_K=k % cfg.block_k == 0,
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            INTERPRET=interpreting(),
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return y
