"""Batch-invariant FP8 linear layer: y = x @ W.T + bias with W FP8 and float32 scales in one of two
layouts (reference_fp8's), told apart by the scale's rank:

    x                 [M, K] bf16/fp16/fp32    -> fp8_quant.quantize_groups -> xq [M, K] fp8, xs [M, K/128]
    weight            [N, K] float8_e4m3fn
    weight_scale      [ceil(N/128), ceil(K/128)] float32 (128x128 blocks)  or  [N] float32 (per channel)
    y                 [M, N] in x's dtype

The GEMM walks K in steps of exactly one scale group (BLOCK_K = 128). Each step's FP8 product
goes through the tensor cores (tl.dot on float8e4nv operands: wgmma on Hopper) into a fresh
float32 tile, which is then scaled by the row's activation scale (and, with block scales, the
column's weight scale) and added to the float32 accumulator. That is DeepSeek-V3's scheme: the
FP8 tensor-core accumulation is imprecise over long K, so partial sums are promoted to CUDA-core
float32 every 128 channels, and the activation scales change every 128 channels anyway. A
per-channel weight scale is the same for every K step, so it multiplies the accumulator once, in
the epilogue. One kernel serves both layouts (CHANNEL_SCALES is a compile-time switch). A second
kernel walks the same tiles with both operands fetched by the tensor-memory accelerator (`tma`
tilings, the default; the copy engine zero-fills past M, N and the K tail), and a tiling whose
operands it cannot address runs on the pointer kernel instead: the same tiles and order, so the
same bits.

Prefill-sized problems (WARP_SPECIALIZED, WS_MIN_M and WS_MIN_K) run on a third kernel,
fp8_matmul_ws's, written in Gluon: a producer warp issues the copies while two consumer warpgroups
multiply and promote, the products asynchronous. It keeps the K order and the promotion of every
step, so it gives the TMA kernel's bits at any tile, and the switch by M keeps a row's bits.

Fixed split-K (`split_k > 1`, matmul.py's scheme): K's 128-channel steps are cut into split_k
ranges that depend on K and the config only; each range is reduced as above from zero, its float32
partial (times a per-channel scale, if any) goes to a workspace, and matmul.py's combine kernel
adds the partials in range order, then the bias, and rounds once. A decode batch's projections
with few output tiles get more, shorter K loops; the sum changes, so every tiling of one problem
shares split_k (checked when a tiling is chosen). With block scales the ranges can instead be
reduced one after another by the tile's one program and added there in the same order
(`ranges_in_program`): the same sum and bits without the workspace, which is how large M runs a
split problem.

Batch invariance: the kernel is not specialised on M, and each output tile is reduced by one
program in K order, one 128-channel step at a time, each step's product promoted on its own, so a
row's bits depend neither on M, nor on which tile row it lands in, nor on the tile's shape among
warpgroup-MMA tiles (BLOCK_M >= 64, 4+ warps: every such tiling bench_fp8_matmul.py tried on the
H200 and the H100 gave equal rows; a 16-row tile takes another MMA instruction, whose FP8 products
gave other bits on an H100). That last part lets the tiling follow M among such tiles (_default,
_check_interchangeable), checked by the invariance tests across the switch. The activation
quantiser is per row. The semantics are reference_fp8.linear_fp8's (the same quantised operands);
only the float32 summation order differs.

Measured tilings: `bench/kernels/bench_fp8_matmul.py --write-configs` times the candidate tilings
per (N, K) at decode batch sizes on a GPU and writes, per range of M, the fastest one that gave the
default tiling's rows bit for bit there (same split_k), to `fp8_matmul_configs/<gpu name>.json`;
that file, when present for the GPU in use, overrides the defaults. It changes speed, not a row's
bits; reading it checks that its tilings of one problem share split_k and are warpgroup-MMA tiles.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from shardinfer.kernels import fp8_quant, tuning
from shardinfer.kernels._common import (
    FLOAT_DTYPES,
    capability,
    check_same_device,
    check_tensor,
    check_tiles,
    fail,
    gpu_name,
    interpreting,
    sm_count,
)
from shardinfer.kernels.matmul import (
    _combine_splits_kernel,
    _split_range,
    _store_partial,
    _store_tile,
    _tile_coords,
)
from shardinfer.kernels.reference_fp8 import FP8_DTYPE, GROUP
from shardinfer.kernels.tuning import Tiling

__all__ = [
    "CONFIG_OVERRIDES",
    "Fp8TileConfig",
    "check_weight",
    "linear_fp8",
    "linear_fp8_quantized",
    "tile_config",
    "tiling",
]


@dataclass(frozen=True)
class Fp8TileConfig:
    """One fixed tiling (BLOCK_K is always the 128-channel scale group). Any fixed config is batch
    invariant; they differ only in speed."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    persistent: bool = True
    programs_per_sm: int = 1
    # Operands through the tensor-memory accelerator (Hopper and later) instead of pointer loads:
    # the same tiles, K order and promotion, so the same bits.
    tma: bool = False
    # Fixed number of K ranges (matmul.py's split-K): each range's float32 partial goes to a
    # workspace and a second kernel adds them in range order. It changes the summation, so every
    # tiling of one (N, K) problem must share it (_check_interchangeable).
    split_k: int = 1
    # With split_k > 1: one program per output tile reduces its K ranges one after another and adds
    # their partials in range order itself, the combine kernel's arithmetic, so the same bits as the
    # workspace path without its partials' traffic or second launch (which large M cannot afford and
    # a decode batch's few tiles do not need: tilings of one problem may mix the two by M). Block
    # scales only: a per-channel scale multiplies each range's partial, and the compiler may fuse
    # that product into the addition of the ranges (one rounding where the workspace path has two;
    # seen on the H200), so per-channel weights keep the workspace at every M.
    ranges_in_program: bool = False

    def __post_init__(self) -> None:
        check_tiles(
            self, ("block_m", "block_n"), ("num_warps", "num_stages", "group_m", "programs_per_sm", "split_k")
        )
        if self.block_n > GROUP:
            raise ValueError(
                f"Fp8TileConfig.block_n: got {self.block_n}, need <= {GROUP} "
                "(a column tile must sit inside one weight-scale block)"
            )


# Prefill-sized problems run on the warp-specialised kernel (fp8_matmul_ws: a producer warp feeds
# two consumer warpgroups): the same bits as the TMA kernel at any tile, so the switch by M keeps a
# row's bits. Where it was faster on the H200 (bench_fp8_matmul.py --ws; the numbers:
# bench/kernels/NOTES.md, "The warp-specialised FP8 GEMM" and "A persistent schedule"): above
# decode batches, over K of at least WS_MIN_K channels, through its persistent schedule (with one
# program a tile it lost to the TMA kernel on short K; fp8_matmul_ws.PERSISTENT's comment). Hopper,
# unsplit tilings through TMA, block scales; anything else keeps its tiling's kernel.
WARP_SPECIALIZED = True
WS_MIN_M = 257
WS_MIN_K = 1024

# The widest output the default tiling splits K for (_default's comment says why).
SPLIT_MAX_N = 2048

# Measured winners per (N, K) go here (tests and tuning runs); anything absent uses the default.
CONFIG_OVERRIDES: dict[tuple[int, int], Fp8TileConfig | Tiling[Fp8TileConfig]] = {}


def _default(key: tuple[int, int], device: torch.device | None) -> Tiling[Fp8TileConfig]:
    # One program per 64x128 output tile, four warps, four stages, operands through TMA: on the H200
    # the fastest of the tilings bench/kernels/bench_fp8_matmul.py tried at every dense-8b
    # projection shape at M = 256 and M = 8192 (the pointer-load variant of the same tiles came
    # second; the persistent loop that suits the bf16 GEMM ran the FP8 one several times slower).
    # Up to 64 rows, 64x64 tiles with six stages beat it for N up to 8192 (twice the programs to
    # cover the SMs); not for the 24576-wide gate_up. Every tiling tried gave bitwise equal rows (one
    # K order, each 128-channel step promoted on its own), so switching by M keeps a row's bits (the
    # invariance tests cross the switch), and an operand the copy engine cannot address runs the
    # same tiles through pointer loads. The measurements: docs/performance.md.
    #
    # A long K over narrow outputs (K >= 3N with N <= SPLIT_MAX_N: a small model's down projection)
    # splits K in two: at a decode batch its 64x128 tiles are too few for the SMs (at most 64 up to
    # 256 rows), one program each walking all of K, and two ranges through the workspace give every
    # SM two programs; from 257 rows on, one program reduces both ranges itself (the same bits, no
    # workspace). Other problems keep K whole: a split gained nothing there at decode batches
    # (docs/performance.md, "Fixed split-K for the FP8 GEMM"), and at N = 4096 (dense-8b's down
    # projection) keeping K whole lets prompt-sized and large decode batches run the warp-specialised
    # kernel, which took a whole job's prefill and decode steps shorter than the split did
    # (docs/performance.md, "Dense-8b's down projection unsplit").
    n, k = key
    split = 2 if k >= 3 * n and n <= SPLIT_MAX_N else 1
    rest = Fp8TileConfig(
        64,
        128,
        num_warps=4,
        num_stages=4,
        persistent=False,
        tma=True,
        split_k=split,
        ranges_in_program=split > 1,
    )
    by_m: list[tuple[int, Fp8TileConfig]] = []
    if n <= 8192:
        by_m.append(
            (64, Fp8TileConfig(64, 64, num_warps=4, num_stages=6, persistent=False, tma=True, split_k=split))
        )
    if split > 1:
        by_m.append((256, dataclasses.replace(rest, ranges_in_program=False)))
    return Tiling(rest, tuple(by_m))


CONFIG_DIR = Path(__file__).parent / "fp8_matmul_configs"


def config_path(gpu_name: str) -> Path:
    """Where the measured FP8 tilings for a GPU model live (`NVIDIA H200` -> `NVIDIA_H200.json`)."""
    return tuning.measured_path(CONFIG_DIR, gpu_name)


@functools.cache
def measured_configs(gpu_name: str) -> dict[tuple[int, int], Tiling[Fp8TileConfig]]:
    """The FP8 tilings measured for this GPU model, keyed by (N, K); empty when none were."""
    return tuning.read_measured(
        config_path(gpu_name), _measured_entry, "FP8 matmul", "bench/kernels/bench_fp8_matmul.py"
    )


def _measured_entry(entry: dict[str, Any]) -> tuple[tuple[int, int], Tiling[Fp8TileConfig]]:
    key = (int(entry["n"]), int(entry["k"]))
    return key, _check_interchangeable(key, tuning.tiling_from_entry(entry, lambda f: Fp8TileConfig(**f)))


# Overrides first, then the GPU model's measured tilings (read at each choice, so a test may point
# CONFIG_DIR elsewhere), then the defaults.
_CHOOSER = tuning.TileChooser(CONFIG_OVERRIDES, _default, lambda gpu: measured_configs(gpu))


def _check_interchangeable(key: tuple[int, int], chosen: Tiling[Fp8TileConfig]) -> Tiling[Fp8TileConfig]:
    """A problem's tilings may differ in everything but split_k, which moves the K ranges' sums, and
    only among warpgroup-MMA tiles (module docstring: another MMA instruction rounds its products
    differently)."""
    distinct = set(chosen.configs)
    splits = {c.split_k for c in distinct}
    if len(splits) > 1:
        raise ValueError(
            f"FP8 tilings of (N, K) = {key} mix split_k {sorted(splits)}: one problem's tilings must "
            "share split_k, or a row would be summed differently at other batch sizes"
        )
    narrow = sorted((c for c in distinct if c.block_m < 64 or c.num_warps < 4), key=repr)
    if len(distinct) > 1 and narrow:
        raise ValueError(
            f"FP8 tilings of (N, K) = {key} switch by batch size to or from {narrow}: tilings by batch "
            "size need block_m >= 64 and >= 4 warps each (one warpgroup MMA), or a row's bits would "
            "change with its batch; give such a problem one tiling"
        )
    return chosen


def tiling(n: int, k: int, gpu: str | None = None) -> Tiling[Fp8TileConfig]:
    """The tilings an (N, K) FP8 problem runs on a GPU model (None: the defaults), by batch size."""
    return _check_interchangeable((n, k), _CHOOSER.tiling((n, k), gpu))


def tile_config(n: int, k: int, m: int | None = None, gpu: str | None = None) -> Fp8TileConfig:
    """The tiling an (N, K) FP8 problem runs at batch size m (None: the one for large M) on a GPU
    model (None: the defaults)."""
    chosen = tiling(n, k, gpu)
    return chosen.rest if m is None else chosen.for_m(m)


@triton.jit
def _mma_fp8(a, b, INTERPRET: tl.constexpr):
    """a @ b for one 128-channel step into a fresh float32 tile. Under the interpreter a broadcast
    product summed in order (position independent, as _mma.mma explains); on the GPU tl.dot on the
    FP8 operands (wgmma on Hopper)."""
    if INTERPRET:
        out = tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    else:
        out = tl.dot(a, b)
    return out


@triton.jit
def _promote(acc, part, sa, ws_row, kt, CHANNEL_SCALES: tl.constexpr):
    """acc + one 128-channel step's product times its scales: the row's activation scale and, with
    block scales, the step's weight-block scale (a per-channel scale waits for the epilogue). Both
    GEMM kernels promote through here, so they round alike."""
    if CHANNEL_SCALES:
        acc += part * sa[:, None]
    else:
        sb = tl.load(ws_row + kt)
        acc += part * (sa[:, None] * sb)
    return acc


@triton.jit
def _tile_schedule(
    M,
    N,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PERSISTENT: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """(tiles along M, tiles along N, work items, this program's stride over them): a work item is
    an output tile's K range (the ranges of one tile adjacent); a persistent launch strides by its
    program count, otherwise each program's loop runs once."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n * SPLIT_K
    if PERSISTENT:  # noqa: SIM108 - a compile-time branch (see matmul.py)
        step = NUM_PROGRAMS
    else:
        step = num_tiles
    return num_pid_m, num_pid_n, num_tiles, step


@triton.jit
def _channel_scaled(acc, ws_ptr, pid_n, N, CHANNEL_SCALES: tl.constexpr, BLOCK_N: tl.constexpr):
    """A tile's (or a K range's) sum times the per-channel weight scale, the same for every K step,
    so applied once (to each K range's partial when split, before the ordered sum)."""
    if CHANNEL_SCALES:
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.where(cols < N, cols, 0).to(tl.int64)
        acc = acc * tl.load(ws_ptr + cols)[None, :]
    return acc


@triton.jit
def _ptr_range(
    a_ptr,
    w_ptr,
    as_ptrs,
    ws_row,
    rows,
    cols,
    K,
    stride_wn,
    k_first,
    k_last,
    EVEN_K: tl.constexpr,
    CHANNEL_SCALES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """The sum over 128-channel steps [k_first, k_last) of one tile, operands through pointers."""
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * K + offs_k[None, :] + k_first * BLOCK_K
    w_ptrs = w_ptr + offs_k[:, None] + cols[None, :] * stride_wn + k_first * BLOCK_K  # weight.T tile
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(k_first, k_last):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(w_ptrs)
        else:  # K is fixed per layer, so this tail mask is the same for every batch size
            k_left = K - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        part = _mma_fp8(a, b, INTERPRET)
        acc = _promote(acc, part, tl.load(as_ptrs + kt), ws_row, kt, CHANNEL_SCALES)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    return acc


@triton.jit
def _tma_range(
    a_desc,
    w_desc,
    as_ptrs,
    ws_row,
    pid_m,
    pid_n,
    k_first,
    k_last,
    CHANNEL_SCALES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """_ptr_range with both operands fetched by the tensor-memory accelerator."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(k_first, k_last):
        a = a_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])
        b = w_desc.load([pid_n * BLOCK_N, kt * BLOCK_K])
        part = _mma_fp8(a, b.T, INTERPRET)
        acc = _promote(acc, part, tl.load(as_ptrs + kt), ws_row, kt, CHANNEL_SCALES)
    return acc


@triton.jit(do_not_specialize=["M"])
def _fp8_linear_kernel(
    a_ptr,
    as_ptr,
    w_ptr,
    ws_ptr,
    b_ptr,
    y_ptr,
    part_ptr,
    M,
    N,
    K,
    stride_wn,
    stride_ym,
    a_groups,
    w_groups,
    HAS_BIAS: tl.constexpr,
    CHANNEL_SCALES: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PERSISTENT: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    ITEM_SPLITS: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """A work item is an output tile, or (split K through the workspace, ITEM_SPLITS = SPLIT_K) one
    K range of it. With ITEM_SPLITS = 1 < SPLIT_K (block scales only) the item is the whole tile, whose
    SPLIT_K ranges are each reduced from zero and added in range order here: the combine kernel's
    sum, so its bits. (A range ends on a fused multiply-add, never a bare product, so nothing can
    fuse the product into the addition of the ranges; a per-channel scale's product could be.)"""
    pid = tl.program_id(0)
    num_pid_m, num_pid_n, num_tiles, step = _tile_schedule(
        M, N, BLOCK_M, BLOCK_N, PERSISTENT, NUM_PROGRAMS, ITEM_SPLITS
    )
    # The epilogue's own work-item counter (a tensor, as matmul.py's: the store indexes with it).
    out_tile = pid - step
    for tile in tl.range(pid, num_tiles, step, flatten=PERSISTENT):
        out_tile += step
        pid_m, pid_n = _tile_coords(tile // ITEM_SPLITS, num_pid_m, num_pid_n, GROUP_M)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        # Rows past M and columns past N read row/column 0; their results are dropped at the store.
        rows = tl.where(rows < M, rows, 0).to(tl.int64)
        cols = tl.where(cols < N, cols, 0).to(tl.int64)
        as_ptrs = as_ptr + rows * a_groups
        # A column tile lies inside one 128-row weight-scale block (BLOCK_N <= 128, a power of two),
        # so its block scale per K step is one scalar.
        ws_row = ws_ptr + ((pid_n * BLOCK_N) // BLOCK_K) * w_groups
        if ITEM_SPLITS < SPLIT_K:  # the ranges reduced here, not through the workspace
            k_first, k_last = _split_range(0, K, BLOCK_K, SPLIT_K)
            tl.static_assert(not CHANNEL_SCALES, "per-channel scales add their ranges through the workspace")
            acc = _ptr_range(
                a_ptr,
                w_ptr,
                as_ptrs,
                ws_row,
                rows,
                cols,
                K,
                stride_wn,
                k_first,
                k_last,
                EVEN_K,
                CHANNEL_SCALES,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                INTERPRET,
            )
            for r in tl.static_range(1, SPLIT_K):
                k_first, k_last = _split_range(r, K, BLOCK_K, SPLIT_K)
                part = _ptr_range(
                    a_ptr,
                    w_ptr,
                    as_ptrs,
                    ws_row,
                    rows,
                    cols,
                    K,
                    stride_wn,
                    k_first,
                    k_last,
                    EVEN_K,
                    CHANNEL_SCALES,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_K,
                    INTERPRET,
                )
                acc += part
            _store_tile(acc, b_ptr, y_ptr, pid_m, pid_n, M, N, stride_ym, HAS_BIAS, None, BLOCK_M, BLOCK_N)
        else:
            k_first, k_last = _split_range(tile % SPLIT_K, K, BLOCK_K, SPLIT_K)
            acc = _ptr_range(
                a_ptr,
                w_ptr,
                as_ptrs,
                ws_row,
                rows,
                cols,
                K,
                stride_wn,
                k_first,
                k_last,
                EVEN_K,
                CHANNEL_SCALES,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                INTERPRET,
            )
            acc = _channel_scaled(acc, ws_ptr, pid_n, N, CHANNEL_SCALES, BLOCK_N)
            if SPLIT_K == 1:
                _store_tile(
                    acc, b_ptr, y_ptr, pid_m, pid_n, M, N, stride_ym, HAS_BIAS, None, BLOCK_M, BLOCK_N
                )
            else:
                _store_partial(acc, part_ptr, out_tile % SPLIT_K, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)


@triton.jit(do_not_specialize=["M"])
def _fp8_linear_tma_kernel(
    a_desc,
    as_ptr,
    w_desc,
    ws_ptr,
    b_ptr,
    y_ptr,
    part_ptr,
    M,
    N,
    K,
    stride_ym,
    a_groups,
    w_groups,
    HAS_BIAS: tl.constexpr,
    CHANNEL_SCALES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PERSISTENT: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    ITEM_SPLITS: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """_fp8_linear_kernel with both operands fetched by the tensor-memory accelerator. The copy
    engine zero-fills rows past M, columns past N and the K tail (zero FP8 codes, so the tail's
    products are exact zeros, as the masked loads give), so the loop needs no masks; the scales
    are still read through pointers (one per row and step, one per step)."""
    pid = tl.program_id(0)
    num_pid_m, num_pid_n, num_tiles, step = _tile_schedule(
        M, N, BLOCK_M, BLOCK_N, PERSISTENT, NUM_PROGRAMS, ITEM_SPLITS
    )
    # The epilogue's own work-item counter (a tensor, as matmul.py's: the store indexes with it).
    out_tile = pid - step
    for tile in tl.range(pid, num_tiles, step, flatten=PERSISTENT):
        out_tile += step
        pid_m, pid_n = _tile_coords(tile // ITEM_SPLITS, num_pid_m, num_pid_n, GROUP_M)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rows = tl.where(rows < M, rows, 0).to(tl.int64)
        as_ptrs = as_ptr + rows * a_groups
        ws_row = ws_ptr + ((pid_n * BLOCK_N) // BLOCK_K) * w_groups
        if ITEM_SPLITS < SPLIT_K:  # the ranges reduced here, not through the workspace
            k_first, k_last = _split_range(0, K, BLOCK_K, SPLIT_K)
            tl.static_assert(not CHANNEL_SCALES, "per-channel scales add their ranges through the workspace")
            acc = _tma_range(
                a_desc,
                w_desc,
                as_ptrs,
                ws_row,
                pid_m,
                pid_n,
                k_first,
                k_last,
                CHANNEL_SCALES,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                INTERPRET,
            )
            for r in tl.static_range(1, SPLIT_K):
                k_first, k_last = _split_range(r, K, BLOCK_K, SPLIT_K)
                part = _tma_range(
                    a_desc,
                    w_desc,
                    as_ptrs,
                    ws_row,
                    pid_m,
                    pid_n,
                    k_first,
                    k_last,
                    CHANNEL_SCALES,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_K,
                    INTERPRET,
                )
                acc += part
            _store_tile(acc, b_ptr, y_ptr, pid_m, pid_n, M, N, stride_ym, HAS_BIAS, None, BLOCK_M, BLOCK_N)
        else:
            k_first, k_last = _split_range(tile % SPLIT_K, K, BLOCK_K, SPLIT_K)
            acc = _tma_range(
                a_desc,
                w_desc,
                as_ptrs,
                ws_row,
                pid_m,
                pid_n,
                k_first,
                k_last,
                CHANNEL_SCALES,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                INTERPRET,
            )
            acc = _channel_scaled(acc, ws_ptr, pid_n, N, CHANNEL_SCALES, BLOCK_N)
            if SPLIT_K == 1:
                _store_tile(
                    acc, b_ptr, y_ptr, pid_m, pid_n, M, N, stride_ym, HAS_BIAS, None, BLOCK_M, BLOCK_N
                )
            else:
                _store_partial(acc, part_ptr, out_tile % SPLIT_K, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)


def check_weight(
    weight: object, scale: object, bias: object, k: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The checks on an FP8 linear's operands other than its input, for an input of K channels whose
    float dtype is `dtype` (the bias's): the GEMM reads raw pointers, so a mismatch would read wrong
    bytes rather than fail. Devices are the caller's to compare."""
    weight = check_tensor("weight", weight, dtypes=(FP8_DTYPE,), ndim=2, contiguous=True)
    scale = check_tensor("weight_scale", scale, dtypes=(torch.float32,), contiguous=True)
    n = weight.shape[0]
    if weight.shape[1] != k:
        raise fail("weight.shape", tuple(weight.shape), f"need [N, {k}]: weight's K must equal x's last dim")
    blocks = (triton.cdiv(n, GROUP), triton.cdiv(k, GROUP))
    if tuple(scale.shape) not in (blocks, (n,)):
        raise fail(
            "weight_scale.shape",
            tuple(scale.shape),
            f"need {blocks} (one scale per 128x128 weight block) or ({n},) (one per output channel)",
        )
    if bias is not None:
        bias = check_tensor("bias", bias, dtypes=(dtype,), ndim=1, contiguous=True)
        if bias.shape[0] != n:
            raise fail("bias.shape", tuple(bias.shape), f"need ({n},), one value per output column")
    return weight, scale, bias


def _check(
    x: object, weight: object, scale: object, bias: object
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    x = check_tensor("x", x, dtypes=FLOAT_DTYPES, ndim=2, last_dim_contiguous=True)
    weight, scale, bias = check_weight(weight, scale, bias, x.shape[1], x.dtype)
    check_same_device(x=x, weight=weight, weight_scale=scale, bias=bias)
    return x, weight, scale, bias


def _has_tma(device: torch.device) -> bool:
    """Whether `tma` tilings can use the copy engine here: Hopper and later (compute capability
    9.0); the interpreter runs them anywhere."""
    return device.type != "cuda" or interpreting() or capability(device.index or 0)[0] >= 9


def warp_specialized(m: int, k: int, device: torch.device) -> bool:
    """Whether an unsplit, block-scaled problem of m rows over k channels whose operands the copy
    engine can address runs on fp8_matmul_ws's kernel (WARP_SPECIALIZED's comment says where)."""
    if not WARP_SPECIALIZED or m < WS_MIN_M or k < WS_MIN_K:
        return False
    return device.type == "cuda" and not interpreting() and capability(device.index or 0)[0] == 9


def linear_fp8_quantized(
    xq: torch.Tensor,
    xs: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    config: Fp8TileConfig,
) -> torch.Tensor:
    """The GEMM alone, on activations already quantised (xq [M, K] fp8 contiguous, xs [M, K/128]);
    `scale` in either layout (module docstring)."""
    m, k = xq.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.copy_(bias.expand(m, n)) if bias is not None else y.zero_()
    on_gpu = xq.device.type == "cuda"
    # The interpreter has no SMs; 4 programs still exercise the persistent loop.
    cap = (sm_count(xq.device.index or 0) if on_gpu else 4) * config.programs_per_sm
    # A work item is a tile, or one K range of a tile when the ranges go through the workspace.
    # Per-channel scales always take the workspace (Fp8TileConfig.ranges_in_program says why).
    channel = scale.dim() == 1
    workspace = config.split_k > 1 and (channel or not config.ranges_in_program)
    item_splits = config.split_k if workspace else 1
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n) * item_splits
    grid = (min(cap, tiles) if config.persistent else tiles,)
    switch = on_gpu and xq.device.index is not None and xq.device.index != torch.cuda.current_device()
    # Split-K partials [split_k, M, N] float32; without the workspace, the kernel never touches them
    # and y stands in (as for the bias), so nothing is allocated.
    parts = torch.empty((config.split_k, m, n), dtype=torch.float32, device=xq.device) if workspace else y
    bias_arg = bias if bias is not None else y
    common = dict(
        HAS_BIAS=bias is not None,
        CHANNEL_SCALES=scale.dim() == 1,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=GROUP,
        GROUP_M=config.group_m,
        PERSISTENT=config.persistent,
        NUM_PROGRAMS=cap,
        SPLIT_K=config.split_k,
        ITEM_SPLITS=item_splits,
        INTERPRET=interpreting(),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    with torch.cuda.device(xq.device) if switch else contextlib.nullcontext():
        # The copy engine needs 16-byte aligned bases and rows; elsewhere the pointer kernel runs
        # the same tiles in the same K order, so the bits do not change.
        # So does a GPU without the copy engine (before Hopper).
        tma_ok = (
            config.tma
            and _has_tma(xq.device)
            and not (k % 16 or xq.data_ptr() % 16 or weight.data_ptr() % 16)
        )
        if tma_ok and not channel and config.split_k == 1 and warp_specialized(m, k, xq.device):
            from shardinfer.kernels import fp8_matmul_ws  # Gluon: imported where it can run

            fp8_matmul_ws.linear_fp8_ws(xq, xs, weight, scale, bias, y)
        elif tma_ok:
            a_desc = TensorDescriptor(xq, [m, k], [k, 1], [config.block_m, GROUP])
            w_desc = TensorDescriptor(weight, [n, k], [k, 1], [config.block_n, GROUP])
            _fp8_linear_tma_kernel[grid](
                a_desc,
                xs,
                w_desc,
                scale,
                bias_arg,
                y,
                parts,
                m,
                n,
                k,
                y.stride(0),
                xs.shape[1],
                scale.shape[-1],
                **common,
            )
        else:
            _fp8_linear_kernel[grid](
                xq,
                xs,
                weight,
                scale,
                bias_arg,
                y,
                parts,
                m,
                n,
                k,
                weight.stride(0),
                y.stride(0),
                xs.shape[1],
                scale.shape[-1],
                EVEN_K=k % GROUP == 0,
                **common,
            )
        if workspace:
            block = 256
            _combine_splits_kernel[(m, triton.cdiv(n, block))](
                parts,
                bias_arg,
                y,
                m,
                n,
                y.stride(0),
                HAS_BIAS=bias is not None,
                ROUND_TO=None,
                SPLIT_K=config.split_k,
                BLOCK=block,
                num_warps=4,
            )
    return y


def linear_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: Fp8TileConfig | None = None,
) -> torch.Tensor:
    """y = x @ dequant(weight).T + bias, x quantised per 1x128 group first; each row bitwise
    independent of the other rows and of M.

    x: [M, K] bfloat16/float16/float32, last dim contiguous; weight: [N, K] float8_e4m3fn
    contiguous; weight_scale: float32 contiguous, [ceil(N/128), ceil(K/128)] (128x128 block
    scales, a checkpoint's `weight_scale_inv`) or [N] (per-output-channel scales); bias: [N] of
    x's dtype or None. Returns [M, N] in x's dtype (float32 accumulation, one final rounding). The
    tiling is the (N, K) problem's on x's GPU model (its measured tilings, else the defaults);
    `config` overrides it (tests, tuning). Raises ValueError naming the argument when a
    precondition fails.
    """
    x, weight, weight_scale, bias = _check(x, weight, weight_scale, bias)
    n, k = weight.shape
    xq, xs = fp8_quant.quantize_groups(x)
    cfg = config if config is not None else tile_config(n, k, x.shape[0], gpu_name(x.device))
    return linear_fp8_quantized(xq, xs, weight, weight_scale, bias, x.dtype, cfg)
