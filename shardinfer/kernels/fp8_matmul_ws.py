"""fp8_matmul's block-scaled FP8 GEMM, warp-specialised for prefill-sized batches (Hopper, Gluon).

fp8_matmul's TMA kernel waits for each 128-channel step's product before promoting it (Triton
leaves a warpgroup MMA asynchronous only when its result feeds the next product's accumulator, and
block scaling promotes every step's product on its own), and the same warps issue the copies, so
copies, products and promotions take turns. Nsight Compute put the product wait and the copy
waits first among that kernel's stalls (bench/kernels/NOTES.md, "Nsight Compute on the FP8
attention and GEMM kernels"). Here, written in Gluon (Triton's explicit-layout dialect), the work
is split between partitions of one program (`gl.warp_specialize`):

- a producer warp issues each K step's two TMA copies as soon as the consumers have released the
  step's shared-memory stage (`empty` barriers), STAGES steps deep;
- the consumer partition (two warpgroups, a 128 x 128 output tile) waits for a stage (`ready`),
  issues its product asynchronously, and promotes the previous step's product while the tensor
  cores run this one, then releases the previous stage.

The arithmetic is fp8_matmul's: each step's product is four m64n128k32 warpgroup MMAs from zero over
the step's 128 channels in order, promoted as acc += part * (row scale * block scale) in step
order, so a row gets the TMA kernel's bits whatever the tile (checked on the GPU by
tests/kernels/test_kernel_fp8_ws.py, across fp8_matmul's switch between the two kernels). Unsplit K
and 128x128 block scales only; fp8_matmul runs everything else on its own kernels.

Steps are issued in pairs: the product of a pair's second step is issued before the first one's is
retired, and no product is in flight across the loop's back edge (a loop-carried accumulator would
be copied there while its product runs, and ptxas serialises the products to make that copy safe;
its warning C7514). Three or more in flight spill registers.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from shardinfer.kernels._common import sm_count
from shardinfer.kernels.reference_fp8 import GROUP

# Triton 3.6 names the TMA load async_copy_global_to_shared; later versions async_load.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

# The tiling: two consumer warpgroups over 128 x 128 outputs, six stages of 32 KB (one program per
# SM), pairs of steps in flight. Settings of speed only: every tile gives the same bits.
BLOCK_M = 128
BLOCK_N = 128
NUM_WARPS = 8
STAGES = 6
GROUP_M = 8
# One program per SM walking its share of the tiles, so a tile's first copies overlap the previous
# tile's last promotions and its store: what short K (few steps a tile) leaves exposed. The same
# bits either way. On the H200 it was faster alone at every K up to 2048, and end to end on the
# small model; at K 4096 it was faster alone on some shapes and slower on the widest, yet end to end
# on dense-8b (K 4096 and 12288) it was faster in prefill and in decode (bench/kernels/NOTES.md, "A
# persistent schedule for the warp-specialised FP8 GEMM" and "The persistent schedule at every K"),
# so every K takes it. PERSISTENT_MAX_K (None: no limit) sends longer K to one program a tile;
# PERSISTENT True or False forces one schedule.
PERSISTENT: bool | None = None
PERSISTENT_MAX_K: int | None = None
PERSISTENT_STAGES = 6
_PRODUCER_WARPS = 1
_PRODUCER_REGISTERS = 40


@gluon.jit
def _issue(a_smem, b_smem, ready, step, zero, STAGES: gl.constexpr):
    """Wait for K step `step`'s operands and start its product from zero (asynchronously)."""
    stage = step % STAGES
    mbarrier.wait(ready.index(stage), (step // STAGES) & 1)
    return warpgroup_mma(
        a_smem.index(stage), b_smem.index(stage).permute((1, 0)), zero, use_acc=False, is_async=True
    )


@gluon.jit
def _scales(as_ptrs, ws_row, step):
    """Step `step`'s row scales and block scale, loaded when its product is issued so that they
    have the product's time to arrive before the promotion needs them."""
    return gl.load(as_ptrs + step), gl.load(ws_row + step)


@gluon.jit
def _retire(acc, part, scales, OUTSTANDING: gl.constexpr):
    """acc + a step's product times its scales, once at most OUTSTANDING products are in flight."""
    sa, sb = scales
    done = warpgroup_mma_wait(num_outstanding=OUTSTANDING, deps=(part,))
    acc += done * (sa[:, None] * sb)
    return acc


@gluon.jit
def _load_step(
    a_desc,
    w_desc,
    a_smem,
    b_smem,
    ready,
    empty,
    step,
    off_m,
    off_n,
    kt,
    STAGES: gl.constexpr,
    BLOCK_K: gl.constexpr,
):
    """K step `kt` of the tile at (off_m, off_n), the program's `step`-th: its two copies, once its
    stage is free (a fresh barrier counts as released: the first pass over the stages waits on
    parity 1, which passes at once)."""
    stage = step % STAGES
    mbarrier.wait(empty.index(stage), ((step // STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(stage), a_desc.block_type.nbytes + w_desc.block_type.nbytes)
    _tma_load(a_desc, [off_m, kt * BLOCK_K], ready.index(stage), a_smem.index(stage))
    _tma_load(w_desc, [off_n, kt * BLOCK_K], ready.index(stage), b_smem.index(stage))


@gluon.jit
def _produce(
    a_desc,
    w_desc,
    a_smem,
    b_smem,
    ready,
    empty,
    off_m,
    off_n,
    k_tiles,
    STAGES: gl.constexpr,
    BLOCK_K: gl.constexpr,
):
    """The producer partition: the tile's K steps in order."""
    for kt in range(k_tiles):
        _load_step(a_desc, w_desc, a_smem, b_smem, ready, empty, kt, off_m, off_n, kt, STAGES, BLOCK_K)


@gluon.jit
def _steps(a_smem, b_smem, ready, empty, as_ptrs, ws_row, k_tiles, base, zero, acc, STAGES: gl.constexpr):
    """One tile's products and promotions in K order, two steps in flight within a pair; a stage is
    released once its product has been retired (Gluon syncs the partition's warps before the
    arrive, so both warpgroups are done with it). `base`: the steps the program issued before this
    tile (they pick the stage and its parity)."""
    n_pairs = k_tiles // 2
    for p in range(n_pairs):
        k0 = 2 * p
        first = _issue(a_smem, b_smem, ready, base + k0, zero, STAGES)
        first_scales = _scales(as_ptrs, ws_row, k0)
        second = _issue(a_smem, b_smem, ready, base + k0 + 1, zero, STAGES)
        second_scales = _scales(as_ptrs, ws_row, k0 + 1)
        acc = _retire(acc, first, first_scales, 1)
        mbarrier.arrive(empty.index((base + k0) % STAGES), count=1)
        acc = _retire(acc, second, second_scales, 0)
        mbarrier.arrive(empty.index((base + k0 + 1) % STAGES), count=1)
    if k_tiles % 2:
        last = k_tiles - 1
        acc = _retire(
            acc, _issue(a_smem, b_smem, ready, base + last, zero, STAGES), _scales(as_ptrs, ws_row, last), 0
        )
        mbarrier.arrive(empty.index((base + last) % STAGES), count=1)
    return acc


@gluon.jit
def _consume(a_smem, b_smem, ready, empty, as_ptrs, ws_row, k_tiles, zero, acc, STAGES: gl.constexpr):
    """The consumer partition: the tile's steps (_steps)."""
    return (_steps(a_smem, b_smem, ready, empty, as_ptrs, ws_row, k_tiles, 0, zero, acc, STAGES),)  # a tuple


@gluon.jit
def _tile_offsets(
    tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr
):
    """Output tile `tile`'s first row and column, in fp8_matmul's grouped order (matmul._tile_coords)."""
    per_group = GROUP_M * num_pid_n
    first_m = (tile // per_group) * GROUP_M
    rows_in_group = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % rows_in_group
    pid_n = (tile % per_group) // rows_in_group
    return pid_m * BLOCK_M, pid_n * BLOCK_N


@gluon.jit
def _store_tile(
    acc,
    b_ptr,
    y_ptr,
    off_m,
    off_n,
    M,
    N,
    stride_ym,
    HAS_BIAS: gl.constexpr,
    mma: gl.constexpr,
    num_warps: gl.constexpr,
):
    """The tile plus the bias, rounded in the MMA layout, then moved (exactly) to one where each
    thread stores 16 bytes of a row."""
    BLOCK_M: gl.constexpr = acc.shape[0]
    BLOCK_N: gl.constexpr = acc.shape[1]
    if HAS_BIAS:
        bias_cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
        bias = gl.load(b_ptr + bias_cols, mask=bias_cols < N, other=0.0)
        acc += bias.to(gl.float32)[None, :]
    vec: gl.constexpr = 128 // y_ptr.dtype.element_ty.primitive_bitwidth
    out_layout: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, vec],
        threads_per_warp=[32 // (BLOCK_N // vec), BLOCK_N // vec],
        warps_per_cta=[num_warps, 1],
        order=[1, 0],
    )
    out = gl.convert_layout(acc.to(y_ptr.dtype.element_ty), out_layout)
    out_rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out_layout))
    y_ptrs = y_ptr + out_rows.to(gl.int64)[:, None] * stride_ym + cols[None, :]
    gl.store(y_ptrs, out, mask=(out_rows[:, None] < M) & (cols[None, :] < N))


@gluon.jit
def _make_ring(
    a_desc, w_desc, STAGES: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr
):
    """The stages' operand buffers and their `ready` / `empty` barriers, initialised."""
    a_smem = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    return a_smem, b_smem, ready, empty


@gluon.jit
def _drop_ring(ready, empty, STAGES: gl.constexpr):
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))


@gluon.jit
def _fp8_linear_ws_kernel(
    a_desc,
    w_desc,
    as_ptr,
    ws_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_ym,
    a_groups,
    w_groups,
    HAS_BIAS: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    PRODUCER_WARPS: gl.constexpr,
    PRODUCER_REGISTERS: gl.constexpr,
    num_warps: gl.constexpr,
):
    off_m, off_n = _tile_offsets(
        gl.program_id(0), gl.cdiv(M, BLOCK_M), gl.cdiv(N, BLOCK_N), GROUP_M, BLOCK_M, BLOCK_N
    )
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 32]
    )
    a_smem, b_smem, ready, empty = _make_ring(a_desc, w_desc, STAGES, BLOCK_M, BLOCK_N, BLOCK_K)
    k_tiles = gl.cdiv(K, BLOCK_K)
    # Rows past M read row 0's scales (their results are dropped at the store), as fp8_matmul does.
    rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
    as_ptrs = as_ptr + gl.where(rows < M, rows, 0).to(gl.int64) * a_groups
    # A column tile lies inside one 128-row weight-scale block, so its block scale per step is a scalar.
    ws_row = ws_ptr + (off_n // BLOCK_K) * w_groups
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
    (acc,) = gl.warp_specialize(
        [
            (_consume, (a_smem, b_smem, ready, empty, as_ptrs, ws_row, k_tiles, zero, acc, STAGES)),
            (
                _produce,
                (a_desc, w_desc, a_smem, b_smem, ready, empty, off_m, off_n, k_tiles, STAGES, BLOCK_K),
            ),
        ],
        [PRODUCER_WARPS],
        [PRODUCER_REGISTERS],
    )
    _drop_ring(ready, empty, STAGES)
    _store_tile(acc, b_ptr, y_ptr, off_m, off_n, M, N, stride_ym, HAS_BIAS, mma, num_warps)


@gluon.jit
def _produce_tiles(
    a_desc, w_desc, a_smem, b_smem, ready, empty, M, N, k_tiles, STAGES: gl.constexpr, GROUP_M: gl.constexpr
):
    """The persistent kernel's producer: the copies of this program's tiles one after another,
    through one ring of stages, so a tile's first steps load while the previous tile is promoted
    and stored. `step` counts every K step the program issues (it picks the stage and its parity)."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    step = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, num_pid_m, num_pid_n, GROUP_M, BLOCK_M, BLOCK_N)
        for kt in range(k_tiles):
            _load_step(a_desc, w_desc, a_smem, b_smem, ready, empty, step, off_m, off_n, kt, STAGES, BLOCK_K)
            step += 1


@gluon.jit
def _consume_tiles(
    a_smem,
    b_smem,
    ready,
    empty,
    as_ptr,
    ws_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    stride_ym,
    a_groups,
    w_groups,
    k_tiles,
    HAS_BIAS: gl.constexpr,
    STAGES: gl.constexpr,
    GROUP_M: gl.constexpr,
    num_warps: gl.constexpr,
):
    """The persistent kernel's consumers: per tile of this program, the plain kernel's steps (the
    same order, so the same bits), then the bias and the store while the producer loads the next
    tile's steps."""
    BLOCK_M: gl.constexpr = a_smem.shape[1]
    BLOCK_N: gl.constexpr = b_smem.shape[1]
    BLOCK_K: gl.constexpr = a_smem.shape[2]
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 32]
    )
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
    base = 0  # the program's K steps before this tile's
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, num_pid_m, num_pid_n, GROUP_M, BLOCK_M, BLOCK_N)
        rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
        as_ptrs = as_ptr + gl.where(rows < M, rows, 0).to(gl.int64) * a_groups
        ws_row = ws_ptr + (off_n // BLOCK_K) * w_groups
        acc = _steps(
            a_smem,
            b_smem,
            ready,
            empty,
            as_ptrs,
            ws_row,
            k_tiles,
            base,
            zero,
            gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma),
            STAGES,
        )
        base += k_tiles
        _store_tile(acc, b_ptr, y_ptr, off_m, off_n, M, N, stride_ym, HAS_BIAS, mma, num_warps)
    return ()


@gluon.jit
def _fp8_linear_ws_persistent_kernel(
    a_desc,
    w_desc,
    as_ptr,
    ws_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_ym,
    a_groups,
    w_groups,
    HAS_BIAS: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    PRODUCER_WARPS: gl.constexpr,
    PRODUCER_REGISTERS: gl.constexpr,
    num_warps: gl.constexpr,
):
    a_smem, b_smem, ready, empty = _make_ring(a_desc, w_desc, STAGES, BLOCK_M, BLOCK_N, BLOCK_K)
    k_tiles = gl.cdiv(K, BLOCK_K)
    gl.warp_specialize(
        [
            (
                _consume_tiles,
                (
                    a_smem,
                    b_smem,
                    ready,
                    empty,
                    as_ptr,
                    ws_ptr,
                    b_ptr,
                    y_ptr,
                    M,
                    N,
                    stride_ym,
                    a_groups,
                    w_groups,
                    k_tiles,
                    HAS_BIAS,
                    STAGES,
                    GROUP_M,
                    num_warps,
                ),
            ),
            (_produce_tiles, (a_desc, w_desc, a_smem, b_smem, ready, empty, M, N, k_tiles, STAGES, GROUP_M)),
        ],
        [PRODUCER_WARPS],
        [PRODUCER_REGISTERS],
    )
    _drop_ring(ready, empty, STAGES)


def persistent_schedule(k: int) -> bool:
    """Whether a problem over k channels runs on the persistent kernel (PERSISTENT's comment)."""
    if PERSISTENT is not None:
        return PERSISTENT
    return PERSISTENT_MAX_K is None or k <= PERSISTENT_MAX_K


def linear_fp8_ws(
    xq: torch.Tensor,
    xs: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    y: torch.Tensor,
) -> None:
    """y = dequant(xq) @ dequant(weight).T + bias into y [M, N], for fp8_matmul.linear_fp8_quantized
    (operands validated there; K a multiple of 16, 16-byte aligned bases, 128x128 block scales)."""
    m, k = xq.shape
    n = weight.shape[0]
    a_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_M, GROUP], gl.float8e4nv)
    w_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_N, GROUP], gl.float8e4nv)
    a_desc = TensorDescriptor(xq, [m, k], [k, 1], [BLOCK_M, GROUP], a_layout)
    w_desc = TensorDescriptor(weight, [n, k], [k, 1], [BLOCK_N, GROUP], w_layout)
    tiles = triton.cdiv(m, BLOCK_M) * triton.cdiv(n, BLOCK_N)
    if persistent_schedule(k):
        persistent = _fp8_linear_ws_persistent_kernel[(min(tiles, sm_count(xq.device.index or 0)),)]
        persistent(
            a_desc,
            w_desc,
            xs,
            scale,
            bias if bias is not None else y,
            y,
            m,
            n,
            k,
            y.stride(0),
            xs.shape[1],
            scale.shape[-1],
            HAS_BIAS=bias is not None,
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            BLOCK_K=GROUP,
            GROUP_M=GROUP_M,
            STAGES=PERSISTENT_STAGES,
            PRODUCER_WARPS=_PRODUCER_WARPS,
            PRODUCER_REGISTERS=_PRODUCER_REGISTERS,
            num_warps=NUM_WARPS,
        )
        return
    grid = (tiles,)
    _fp8_linear_ws_kernel[grid](
        a_desc,
        w_desc,
        xs,
        scale,
        bias if bias is not None else y,
        y,
        m,
        n,
        k,
        y.stride(0),
        xs.shape[1],
        scale.shape[-1],
        HAS_BIAS=bias is not None,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=GROUP,
        GROUP_M=GROUP_M,
        STAGES=STAGES,
        PRODUCER_WARPS=_PRODUCER_WARPS,
        PRODUCER_REGISTERS=_PRODUCER_REGISTERS,
        num_warps=NUM_WARPS,
    )
