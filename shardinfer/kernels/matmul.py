"""Batch-invariant linear layer: y = x @ weight.T + bias with a row's result independent of M.

A GEMM library picks its tiling, split-K factor and even its instruction path from the problem
shape, so the same row of x can be reduced over K in a different order at M=1 than inside
M=4096, and round differently. Here every (N, K, dtype) gets ONE reduction order, fixed
without looking at M: each output tile is computed by one program that walks K in BLOCK_K steps
into one float32 accumulator (or a fixed number of K ranges, below). The kernel is compiled
without specialising on M (`do_not_specialize`), and activations whose alignment differs from a
fresh tensor's are copied first, so a tiling runs the very same machine code at every M; M only
decides how many tiles exist and how many programs the grid launches. Row i of the result is
then bitwise identical whether it is computed alone or inside any batch, whichever tile and
tile row it lands in (the tests check this at the engine's shapes).

Tile order (`_tile_coords`): GROUP_M consecutive row tiles sweep the column tiles together so
the band of weight rows they share stays in L2 during prefill. Persistent mode launches at most
one program per SM (per `programs_per_sm`) which loops over tiles; either mode gives the same
numbers, only speed differs.

Operands reach shared memory by one of two paths. The pointer path clamps rows past M and
columns past N to row/column 0 for the loads (their results are discarded at the store), so the
K loop needs no M/N masks; only a K that is not a multiple of BLOCK_K masks the tail. The
`tma=True` path uses the tensor-memory accelerator, which zero-fills everything out of bounds.
The shipped defaults use the pointer path; the benchmark's sweep measures both.

Fixed split-K (`split_k > 1`): K is cut into `split_k` ranges whose boundaries depend on K
and the config only; each range's float32 partial sum goes to a workspace and a second kernel
adds the partials in range order, adds the bias and rounds once. The reduction order is then
still the same for every M (what a library's split-K breaks is that it picks the split from the
shape). It turns a decode GEMM's few long K loops into many short ones, so more SMs stream the
weights; prefill pays for the partials' round trip, which is why it is a per-shape choice.

Tilings by batch size: what fixes a row's result is the order of its K reduction, i.e. the
split into K ranges (split_k, and BLOCK_K, which places the range boundaries) and the chain of
MMA steps over each range. Tile height and width, warps, pipeline stages, persistence and the
operand path only decide which program computes the row and how its operands arrive. On the
H200 every candidate tiling with the same split_k gave bitwise identical rows at all the
engine's shapes, BLOCK_K 64 and 128 included where K is a multiple of both
(`bench/kernels/matmul_equivalence.py`; the GPU tests check the shipped tilings). So a problem
may use a different tiling per range of M as long as all of them are interchangeable
(`check_interchangeable`): same split_k; same BLOCK_K when split (the boundaries move
otherwise) or K a multiple of every BLOCK_K; tensor-core tiles (16-bit inputs, BLOCK_M >= 64,
4+ warps: one warpgroup MMA path). float32 products are IEEE multiply-adds on the FMA units, each
output summed along K in order whatever the tile, so their tilings may differ in anything but
split_k and BLOCK_K (the CPU interpreter sums a BLOCK_K step at once).

Measured tilings: `bench/kernels/bench_matmul.py --write-configs` times fixed tilings per
(N, K) on a GPU and writes the fastest interchangeable set, one tiling per range of M (or with
`--one-tiling` one tiling for every M), to `matmul_configs/<gpu name>.json`; that file, when
present for the GPU in use, overrides the defaults.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from shardinfer.kernels import tuning
from shardinfer.kernels._common import (
    FLOAT_DTYPES,
    check_same_device,
    check_tensor,
    check_tiles,
    fail,
    gpu_name,
    interpreting,
    sm_count,
)
from shardinfer.kernels._mma import k_loop, mma
from shardinfer.kernels.tuning import Tiling  # one (N, K, dtype) problem's tilings by M

# The inputs' dtype as the kernels name it, for rounding a wider output to it (`_output`).
_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}

__all__ = [
    "CONFIG_OVERRIDES",
    "TileConfig",
    "Tiling",
    "check_interchangeable",
    "linear_batch_invariant",
    "linear_with_config",
    "measured_configs",
    "tile_config",
    "tiling",
    "warm_up",
    "warm_up_sizes",
]


@dataclass(frozen=True)
class TileConfig:
    """One fixed tiling. Any fixed config is batch invariant; they differ only in speed."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    persistent: bool = True
    programs_per_sm: int = 1
    tma: bool = False  # operands through the tensor-memory accelerator (Hopper and later)
    split_k: int = 1  # fixed number of K ranges, reduced in order by a second kernel

    def __post_init__(self) -> None:
        check_tiles(
            self,
            ("block_m", "block_n", "block_k"),
            ("num_warps", "num_stages", "group_m", "programs_per_sm", "split_k"),
        )


def check_interchangeable(k: int, dtype: torch.dtype, configs: list[TileConfig]) -> None:
    """Raise ValueError unless every config sums a row's K products in the same order, so a
    problem may switch between them by M and stay batch invariant (module docstring)."""
    distinct = set(configs)
    if len(distinct) < 2:
        return
    splits = {c.split_k for c in distinct}
    if len(splits) > 1:
        raise ValueError(
            f"tilings {sorted(distinct, key=repr)} mix split_k {sorted(splits)}: one problem's "
            "tilings must share split_k, or rows would be summed differently at other batch sizes"
        )
    block_ks = {c.block_k for c in distinct}
    if dtype == torch.float32:
        if len(block_ks) > 1:
            raise ValueError(
                f"float32 tilings {sorted(distinct, key=repr)} mix block_k {sorted(block_ks)}: the "
                "CPU interpreter sums a block_k step at once, so rows would be summed differently there"
            )
        return
    if len(block_ks) > 1 and (splits != {1} or any(k % bk for bk in block_ks)):
        raise ValueError(
            f"tilings with block_k {sorted(block_ks)} at K={k} split K differently; use one block_k "
            "(different block_k are interchangeable only unsplit and with K a multiple of each)"
        )
    if dtype not in (torch.bfloat16, torch.float16) or any(
        c.block_m < 64 or c.num_warps < 4 for c in distinct
    ):
        raise ValueError(
            f"tilings by batch size are only for float32 or for 16-bit inputs on tensor-core tiles "
            f"(block_m >= 64, >= 4 warps); got {dtype} with {sorted(distinct, key=repr)}"
        )


# Measured winners per (N, K, dtype) go here; anything absent falls back to `_default_tiling`.
CONFIG_OVERRIDES: dict[tuple[int, int, torch.dtype], TileConfig | Tiling[TileConfig]] = {}


# The narrow float32 product's warps a program and launch (MoE routers; see _default_config). Two
# warps on a one-tile-a-program grid were the fastest of the tilings bench/kernels/bench_router.py
# times, with the same bits as every other (docs/performance.md); settings, so that
# bench/throughput.py --variant-flags can time the old launch (4 warps, persistent) against it.
ROUTER_WARPS = 2
ROUTER_GRID = True
# From a 32-row grid of this many programs on (about two a SM of a 132-SM Hopper), the narrow
# float32 product takes 64-row tiles: 64 outputs a thread, faster from a few hundred rows on and
# slower below (the same bits at every M, so the threshold is speed only; bench/kernels/NOTES.md,
# "Again, with the wider candidates"). None keeps 32-row tiles at every M.
ROUTER_TALL_PROGRAMS: int | None = 256


def _narrow_float32(n: int, k: int, dtype: torch.dtype) -> bool:
    """A narrow float32 product with a long K: the MoE routers (64-256 experts x hidden)."""
    return dtype == torch.float32 and n <= 256 and k >= 1024


def _default_tiling(n: int, k: int, dtype: torch.dtype) -> Tiling[TileConfig]:
    """The default tiling: one for every M, except the routers' two row heights (ROUTER_TALL_PROGRAMS).
    Chosen at every call of a problem, so it is built once per shape and router settings."""
    return _built_default_tiling(n, k, dtype, ROUTER_WARPS, ROUTER_GRID, ROUTER_TALL_PROGRAMS)


@functools.cache
def _built_default_tiling(
    n: int, k: int, dtype: torch.dtype, warps: int, grid: bool, tall_programs: int | None
) -> Tiling[TileConfig]:
    """_default_tiling for the router settings given (the settings are arguments so that changing
    one, as bench/throughput.py --variant-flags does, builds the tiling again)."""
    cfg = _default_config(n, k, dtype, warps, grid)
    if not _narrow_float32(n, k, dtype) or tall_programs is None:
        return Tiling(cfg)
    programs_a_row_tile = -(-n // cfg.block_n) * cfg.split_k
    first_tall_m = 64 * -(-tall_programs // programs_a_row_tile)
    return Tiling(replace(cfg, block_m=64), ((tuning.below(first_tall_m), cfg),))


def _default_config(n: int, k: int, dtype: torch.dtype, router_warps: int, router_grid: bool) -> TileConfig:
    if dtype == torch.float32:
        # IEEE float32 runs on the FMA units, not the tensor cores; small tiles keep registers in check.
        if _narrow_float32(n, k, dtype):
            # A narrow float32 product with a long K (MoE routers: 64-256 experts x hidden) has a
            # single column of tiles: without a split, M/64 programs each walk all of K on FMAs.
            # A fixed split by K alone keeps the reduction order M-independent; warps and launch
            # change no bits (the FMA chain runs along K in order whatever the tile's shape).
            return TileConfig(
                32,
                64,
                32,
                num_warps=router_warps,
                num_stages=3,
                persistent=not router_grid,
                split_k=min(16, k // 128),
            )
        return TileConfig(64, 64, 32, num_warps=4, num_stages=3)
    # Two warpgroups of wgmma over a 128-row tile. Narrow outputs (o/down projections of small
    # models) get 64-wide column tiles so decode still spreads the weight read over more SMs.
    # Three stages of 128x128 leave room in shared memory for the next tile's loads to overlap
    # this tile's epilogue in the persistent loop.
    if n <= 2048:
        return TileConfig(128, 64, 64, num_warps=8, num_stages=4)
    return TileConfig(128, 128, 64, num_warps=8, num_stages=3)


CONFIG_DIR = Path(__file__).parent / "matmul_configs"


def config_path(gpu_name: str) -> Path:
    """Where the measured tilings for a GPU model live (`NVIDIA H200` -> `NVIDIA_H200.json`)."""
    return tuning.measured_path(CONFIG_DIR, gpu_name)


@functools.cache
def measured_configs(gpu_name: str) -> dict[tuple[int, int, torch.dtype], Tiling[TileConfig]]:
    """The tilings measured for this GPU model, keyed by (N, K, dtype); empty when none were."""
    return tuning.read_measured(
        config_path(gpu_name), _measured_entry, "matmul", "bench/kernels/bench_matmul.py"
    )


def _measured_entry(entry: dict[str, Any]) -> tuple[tuple[int, int, torch.dtype], Tiling[TileConfig]]:
    dtype = getattr(torch, entry["dtype"])
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype {entry['dtype']!r} is not a torch dtype")
    tiling = tuning.tiling_from_entry(entry, lambda fields: TileConfig(**fields))
    check_interchangeable(int(entry["k"]), dtype, tiling.configs)
    return (int(entry["n"]), int(entry["k"]), dtype), tiling


# Overrides first, then the GPU model's measured tilings (read at each choice, so a test may point
# CONFIG_DIR elsewhere), then the defaults, which depend on the shape alone.
_CHOOSER = tuning.TileChooser(
    CONFIG_OVERRIDES,
    lambda key, device: _default_tiling(*key),
    lambda gpu_name: measured_configs(gpu_name),
)


def tiling(n: int, k: int, dtype: torch.dtype, gpu_name: str | None = None) -> Tiling[TileConfig]:
    """The tilings of an (N, K, dtype) problem on a GPU model, by batch size."""
    return _CHOOSER.tiling((n, k, dtype), gpu_name)


def tile_config(
    n: int, k: int, dtype: torch.dtype, gpu_name: str | None = None, m: int | None = None
) -> TileConfig:
    """The configuration an (N, K, dtype) problem runs at batch size m (None: the one for large M)."""
    return _CHOOSER.choose((n, k, dtype), m, gpu_name)


@triton.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    per_group = GROUP_M * num_pid_n
    first_m = (tile // per_group) * GROUP_M
    rows_in_group = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % rows_in_group
    pid_n = (tile % per_group) // rows_in_group
    return pid_m, pid_n


@triton.jit
def _store_tile(
    acc,
    b_ptr,
    y_ptr,
    pid_m,
    pid_n,
    M,
    N,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    ROUND_TO: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        bias = tl.load(b_ptr + cols, mask=cols < N, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    y_ptrs = y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :]
    tl.store(y_ptrs, _output(acc, ROUND_TO, y_ptr), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _output(acc, ROUND_TO: tl.constexpr, y_ptr):
    """The float32 result as stored: rounded to y's dtype, or first to ROUND_TO (the inputs' dtype)
    when y is wider, so a float32 y holds exactly the values the inputs' dtype would."""
    if ROUND_TO is not None:
        acc = acc.to(ROUND_TO)
    return acc.to(y_ptr.dtype.element_ty)


@triton.jit
def _split_range(split, K, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """The BLOCK_K steps [first, last) of K range `split`: a function of K and the config only."""
    k_tiles = tl.cdiv(K, BLOCK_K)
    if SPLIT_K == 1:  # the whole of K, as a loop from a constant 0 (the unsplit kernel's loop)
        first = 0
        last = k_tiles
    else:
        per_split = tl.cdiv(k_tiles, SPLIT_K)
        first = split * per_split
        last = tl.minimum(first + per_split, k_tiles)
    return first, last


@triton.jit
def _store_partial(acc, ws_ptr, split, pid_m, pid_n, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A split's float32 partial tile into workspace [SPLIT_K, M, N]."""
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ptrs = ws_ptr + split.to(tl.int64) * M * N + rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(ptrs, acc, mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _store_result(
    acc,
    out_tile,
    b_ptr,
    y_ptr,
    ws_ptr,
    num_pid_m,
    num_pid_n,
    M,
    N,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    ROUND_TO: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Work item `out_tile`'s accumulator: the output tile itself, or its split's partial."""
    om, on = _tile_coords(out_tile // SPLIT_K, num_pid_m, num_pid_n, GROUP_M)
    if SPLIT_K == 1:
        _store_tile(acc, b_ptr, y_ptr, om, on, M, N, stride_ym, HAS_BIAS, ROUND_TO, BLOCK_M, BLOCK_N)
    else:
        _store_partial(acc, ws_ptr, out_tile % SPLIT_K, om, on, M, N, BLOCK_M, BLOCK_N)


@triton.jit(do_not_specialize=["M"])
def _combine_splits_kernel(
    ws_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    ROUND_TO: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """y = sum of the partials in split order (+ bias), one rounding; elementwise, so M-independent."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    acc = tl.load(ws_ptr + row * N + cols, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(ws_ptr + s * M * N + row * N + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_ym + cols, _output(acc, ROUND_TO, y_ptr), mask=mask)


@triton.jit(do_not_specialize=["M"])
def _linear_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    ws_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    ROUND_TO: tl.constexpr,
    PRECISION: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PERSISTENT: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # With SPLIT_K > 1 a work item is (output tile, K range); the ranges of one tile are adjacent.
    num_tiles = num_pid_m * num_pid_n * SPLIT_K
    offs_k = tl.arange(0, BLOCK_K)
    # Compile-time branches stay plain if/else statements (the form every Triton release
    # resolves at compile time), hence the noqa.
    if PERSISTENT:  # noqa: SIM108
        step = NUM_PROGRAMS
    else:
        step = num_tiles  # one tile per program: the loop body runs once
    # A second tile counter for the epilogue keeps its index math off the main loop's critical
    # path when the compiler flattens the two loops into one software pipeline.
    out_tile = pid - step
    for tile in tl.range(pid, num_tiles, step, flatten=PERSISTENT):
        pid_m, pid_n = _tile_coords(tile // SPLIT_K, num_pid_m, num_pid_n, GROUP_M)
        k_first, k_last = _split_range(tile % SPLIT_K, K, BLOCK_K, SPLIT_K)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = tl.where(rows < M, rows, 0).to(tl.int64)
        cols = tl.where(cols < N, cols, 0).to(tl.int64)
        x_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :] + k_first * BLOCK_K
        w_ptrs = w_ptr + offs_k[:, None] + cols[None, :] * stride_wn + k_first * BLOCK_K  # weight.T tile
        acc = k_loop(
            x_ptrs,
            w_ptrs,
            tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32),
            k_first,
            k_last,
            K,
            EVEN_K,
            BLOCK_K,
            PRECISION,
            INTERPRET,
        )
        out_tile += step
        _store_result(
            acc,
            out_tile,
            b_ptr,
            y_ptr,
            ws_ptr,
            num_pid_m,
            num_pid_n,
            M,
            N,
            stride_ym,
            HAS_BIAS,
            ROUND_TO,
            GROUP_M,
            SPLIT_K,
            BLOCK_M,
            BLOCK_N,
        )


@triton.jit(do_not_specialize=["M"])
def _linear_tma_kernel(
    x_desc,
    w_desc,
    b_ptr,
    y_ptr,
    ws_ptr,
    M,
    N,
    K,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    ROUND_TO: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PERSISTENT: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """The same tiles and K order, with operands fetched by the tensor-memory accelerator.

    The copy engine zero-fills rows past M, columns past N and the K tail, so no masks at all;
    M only enters the descriptor's bounds, never the code.
    """
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n * SPLIT_K
    if PERSISTENT:  # noqa: SIM108
        step = NUM_PROGRAMS
    else:
        step = num_tiles
    out_tile = pid - step
    for tile in tl.range(pid, num_tiles, step, flatten=PERSISTENT):
        pid_m, pid_n = _tile_coords(tile // SPLIT_K, num_pid_m, num_pid_n, GROUP_M)
        k_first, k_last = _split_range(tile % SPLIT_K, K, BLOCK_K, SPLIT_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_first, k_last):
            a = x_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])
            b = w_desc.load([pid_n * BLOCK_N, kt * BLOCK_K])
            acc = mma(a, b.T, acc, PRECISION, INTERPRET)
        out_tile += step
        _store_result(
            acc,
            out_tile,
            b_ptr,
            y_ptr,
            ws_ptr,
            num_pid_m,
            num_pid_n,
            M,
            N,
            stride_ym,
            HAS_BIAS,
            ROUND_TO,
            GROUP_M,
            SPLIT_K,
            BLOCK_M,
            BLOCK_N,
        )


def _check(x: object, weight: object, bias: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    x = check_tensor("x", x, dtypes=FLOAT_DTYPES, ndim=2, last_dim_contiguous=True)
    weight = check_tensor("weight", weight, dtypes=(x.dtype,), ndim=2, contiguous=True)
    if weight.shape[1] != x.shape[1]:
        raise fail(
            "weight.shape", tuple(weight.shape), f"need [N, {x.shape[1]}]: weight's K must equal x's last dim"
        )
    if bias is not None:
        bias = check_tensor("bias", bias, dtypes=(x.dtype,), ndim=1, contiguous=True)
        if bias.shape[0] != weight.shape[0]:
            raise fail(
                "bias.shape", tuple(bias.shape), f"need ({weight.shape[0]},), one value per output column"
            )
    check_same_device(x=x, weight=weight, bias=bias)
    if x.stride(0) < 0:
        raise fail("x", f"row stride {x.stride(0)}", "need non-negative strides (call .contiguous())")
    return x, weight, bias


def _run(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    config: TileConfig,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.copy_(bias.expand(m, n)) if bias is not None else y.zero_()
    # A single row's stride is meaningless (torch may report anything); give the kernel K so
    # M=1 sees the same stride specialisation as every other M.
    stride_xm = x.stride(0) if m > 1 else k
    # Triton compiles one variant per 16-byte alignment of each pointer and per divisibility of
    # each integer argument by 16. An activation whose base or row stride is aligned differently
    # from a fresh [M, K] tensor's (a slice at an odd row, a view into a wider buffer) is copied,
    # so every call of an (N, K, dtype) problem runs the very same machine code; the copy leaves
    # the values, and so the result, unchanged.
    misaligned = x.data_ptr() % 16 or (stride_xm % 16 == 0) != (k % 16 == 0)
    if misaligned or (config.tma and (stride_xm * x.element_size()) % 16):
        x = torch.empty((m, k), dtype=x.dtype, device=x.device).copy_(x)
        stride_xm = k
    on_gpu = x.device.type == "cuda"
    # The interpreter has no SMs; 4 programs still exercise the persistent loop.
    cap = (sm_count(x.device.index or 0) if on_gpu else 4) * config.programs_per_sm
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n) * config.split_k
    grid = (min(cap, tiles) if config.persistent else tiles,)
    common = dict(
        HAS_BIAS=bias is not None,
        ROUND_TO=_TL_DTYPES[x.dtype] if y.dtype != x.dtype else None,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        GROUP_M=config.group_m,
        PERSISTENT=config.persistent,
        NUM_PROGRAMS=cap,
        SPLIT_K=config.split_k,
        INTERPRET=interpreting(),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    b_arg = bias if bias is not None else y
    # Split-K partials [split_k, M, N] float32; without split-K the kernel never touches the
    # workspace and y stands in for it (as for the bias), so nothing is allocated.
    ws = (
        torch.empty((config.split_k, m, n), dtype=torch.float32, device=x.device) if config.split_k > 1 else y
    )
    # Triton launches on the current device; switch only when x lives elsewhere (rare, and the
    # switch costs host time on every call).
    switch = on_gpu and x.device.index is not None and x.device.index != torch.cuda.current_device()
    with torch.cuda.device(x.device) if switch else contextlib.nullcontext():
        if config.tma:
            _check_tma(x, weight)
            x_desc = TensorDescriptor(x, [m, k], [stride_xm, 1], [config.block_m, config.block_k])
            w_desc = TensorDescriptor(weight, [n, k], [k, 1], [config.block_n, config.block_k])
            _linear_tma_kernel[grid](x_desc, w_desc, b_arg, y, ws, m, n, k, y.stride(0), **common)
        else:
            _linear_kernel[grid](
                x,
                weight,
                b_arg,
                y,
                ws,
                m,
                n,
                k,
                stride_xm,
                weight.stride(0),
                y.stride(0),
                EVEN_K=k % config.block_k == 0,
                **common,
            )
        if config.split_k > 1:
            block = 256
            _combine_splits_kernel[(m, triton.cdiv(n, block))](
                ws,
                b_arg,
                y,
                m,
                n,
                y.stride(0),
                HAS_BIAS=bias is not None,
                ROUND_TO=common["ROUND_TO"],
                SPLIT_K=config.split_k,
                BLOCK=block,
                num_warps=4,
            )
    return y


def _check_tma(x: torch.Tensor, weight: torch.Tensor) -> None:
    """The copy engine needs 16-byte aligned bases and row strides; K and the weight are fixed
    per layer, so refusing them gives the same answer for every M."""
    size = x.element_size()
    k = x.shape[1]
    if (k * size) % 16:
        raise fail(
            "K",
            k,
            f"a tma=True tiling needs rows of a multiple of 16 bytes ({16 // size} elements); "
            "use a tma=False tiling for this shape",
        )
    if weight.data_ptr() % 16:
        raise fail("weight", "a base address not 16-byte aligned", "pass an aligned copy (weight.clone())")


def linear_batch_invariant(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """y = x @ weight.T + bias, each row bitwise independent of the other rows and of M.

    x: [M, K] bfloat16/float16/float32 on CUDA, last dim contiguous (any row stride);
    weight: [N, K] contiguous, x's dtype; bias: [N] contiguous, x's dtype, or None.
    Returns a contiguous [M, N] tensor of x's dtype. Accumulates in float32 (IEEE float32
    products for float32 inputs, never TF32); the bias is added in float32 before the one final
    rounding. The tiling comes from `tile_config(N, K, dtype, gpu, M)`: per range of M, among
    tilings that sum every row in the same order (`check_interchangeable`).
    out_dtype=torch.float32 (16-bit x) returns float32 holding exactly the values of the 16-bit
    result, written by the kernel itself: what `.float()` of it gives, without a second pass over
    the output (the LM head's logits).
    Raises ValueError naming the argument when a precondition fails.
    """
    x, weight, bias = _check(x, weight, bias)
    if out_dtype not in (None, x.dtype, torch.float32):
        raise fail("out_dtype", out_dtype, f"need None, x's dtype ({x.dtype}) or torch.float32")
    gpu = gpu_name(x.device)
    config = tile_config(weight.shape[0], weight.shape[1], x.dtype, gpu, x.shape[0])
    return _run(x, weight, bias, config, out_dtype)


def warm_up_sizes(t: Tiling[TileConfig]) -> list[int]:
    """One batch size per distinct tiling of `t` (the top of each range, then one past the last)."""
    sizes: list[int] = []
    seen: list[TileConfig] = []
    for max_m, config in t.by_m:
        if config not in seen:
            seen.append(config)
            sizes.append(int(max_m))  # a matmul's bounds are whole row counts
    if t.rest not in seen:
        sizes.append(int(t.by_m[-1][0]) + 1 if t.by_m else 1)
    return sizes


def warm_up(weights: list[torch.Tensor], logits_weights: tuple[torch.Tensor, ...] = ()) -> int:
    """Run every tiling the given CUDA weights' problems may use once, on zero activations, so
    Triton compiles them now and not inside the first long prefill; returns the calls made.
    `logits_weights` (LM heads, also among `weights`) are run with float32 output, as
    `Linear.logits` runs them: another compiled variant of each tiling.

    Decode CUDA graphs compile the tilings of small batches when they are captured; the tiling
    for the largest M only ever runs in prefill steps.
    """
    cuda = [w for w in weights if w.device.type == "cuda"]
    runs = warm_up_runs(cuda, tuple(w for w in logits_weights if w.device.type == "cuda"))
    for w, m, out_dtype in runs:
        zeros = torch.zeros(m, w.shape[1], dtype=w.dtype, device=w.device)
        linear_batch_invariant(zeros, w, None, out_dtype)
    return len(runs)


def warm_up_runs(
    weights: list[torch.Tensor], logits_weights: tuple[torch.Tensor, ...] = ()
) -> list[tuple[torch.Tensor, int, torch.dtype | None]]:
    """The (weight, M, output dtype) calls `warm_up` makes: one per distinct tiling of each distinct
    (N, K, dtype, device) problem and output dtype; weights the matmul does not take are skipped."""
    runs: list[tuple[torch.Tensor, int, torch.dtype | None]] = []
    done: set[tuple[int, int, torch.dtype, torch.device, torch.dtype | None]] = set()
    wanted = [(w, None) for w in weights] + [(w, torch.float32) for w in logits_weights]
    for w, out_dtype in wanted:
        if w.dim() != 2 or w.dtype not in FLOAT_DTYPES or not w.is_contiguous():
            continue
        if out_dtype == w.dtype:
            out_dtype = None  # a float32 head's logits are its plain output
        key = (w.shape[0], w.shape[1], w.dtype, w.device, out_dtype)
        if key in done:
            continue
        done.add(key)
        gpu = gpu_name(w.device)
        for m in warm_up_sizes(tiling(w.shape[0], w.shape[1], w.dtype, gpu)):
            runs.append((w, m, out_dtype))
    return runs


def linear_with_config(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    config: TileConfig,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`linear_batch_invariant` with an explicit tiling, for tuning and tests.

    Invariance holds only while one caller uses one config for every M of a problem.
    """
    x, weight, bias = _check(x, weight, bias)
    return _run(x, weight, bias, config, out_dtype)
