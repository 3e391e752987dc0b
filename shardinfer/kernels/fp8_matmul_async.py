"""The block-scaled FP8 GEMM of fp8_matmul.py with its products asynchronous (Hopper, Gluon).

fp8_matmul's TMA kernel waits for each 128-channel step's product before promoting it: Triton
leaves a warpgroup MMA asynchronous only when its result feeds the next product's accumulator, and
block scaling promotes every step's product on its own. Nsight Compute puts that wait first among
the kernel's stalls (bench/kernels/NOTES.md, "Nsight Compute on the FP8 attention and GEMM
kernels"). Written in Gluon, Triton's explicit-layout dialect, the loop issues step k's product,
then waits for step k - 1's alone (one product left in flight), promotes it while the tensor cores
run step k, and refills the freed shared-memory stage with the copy STAGES steps ahead.

The arithmetic is fp8_matmul's: each step's product is four m64nNk32 warpgroup MMAs from zero over
the step's 128 channels in order, promoted as acc += part * (row scale * block scale), in step
order, so a row gets the bits of the TMA kernel at the same tiles (checked on the GPU by
tests/kernels/test_kernel_fp8_async.py). Unsplit K and 128x128 block scales only; fp8_matmul
runs everything else on its own kernels.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from shardinfer.kernels.reference_fp8 import GROUP


@gluon.jit
def _load_step(a_desc, w_desc, a_smem, b_smem, ready, step, k_tiles, off_m, off_n, STAGES: gl.constexpr,
               BLOCK_K: gl.constexpr):
    """Start the copies of K step `step` into its stage (step % STAGES); nothing past the last step."""
    stage = step % STAGES
    live = step < k_tiles
    mbarrier.expect(ready.index(stage), a_desc.block_type.nbytes + w_desc.block_type.nbytes, pred=live)
    tma.async_copy_global_to_shared(a_desc, [off_m, step * BLOCK_K], ready.index(stage), a_smem.index(stage),
                                    pred=live)
    tma.async_copy_global_to_shared(w_desc, [off_n, step * BLOCK_K], ready.index(stage), b_smem.index(stage),
                                    pred=live)


@gluon.jit
def _issue(a_smem, b_smem, ready, step, zero, STAGES: gl.constexpr):
    """Wait for K step `step`'s operands and start its product from zero (asynchronously)."""
    stage = step % STAGES
    mbarrier.wait(ready.index(stage), (step // STAGES) & 1)
    return warpgroup_mma(a_smem.index(stage), b_smem.index(stage).permute((1, 0)), zero, use_acc=False,
                         is_async=True)


@gluon.jit
def _scales(as_ptrs, ws_row, step):
    """Step `step`'s row scales and block scale; read when its product is issued, so the loads have
    the product's time to arrive before the promotion needs them."""
    return gl.load(as_ptrs + step), gl.load(ws_row + step)


@gluon.jit
def _retire(acc, part, scales, OUTSTANDING: gl.constexpr):
    """acc + a step's product times its scales, once at most OUTSTANDING products are in flight."""
    sa, sb = scales
    done = warpgroup_mma_wait(num_outstanding=OUTSTANDING, deps=(part,))
    acc += done * (sa[:, None] * sb)
    return acc

@gluon.jit
def _fp8_linear_async_kernel(a_desc, w_desc, as_ptr, ws_ptr, b_ptr, y_ptr, M, N, K, stride_ym, a_groups, w_groups,
                             HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                             BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                             UNROLL: gl.constexpr, num_warps: gl.constexpr):
    # The output tile, in fp8_matmul's grouped order (matmul._tile_coords).
    pid = gl.program_id(0)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    rows_in_group = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows_in_group
    pid_n = (pid % per_group) // rows_in_group
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N

    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_N, 32])
    row_layout: gl.constexpr = gl.SliceLayout(1, mma)
    col_layout: gl.constexpr = gl.SliceLayout(0, mma)

    a_smem = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    k_tiles = gl.cdiv(K, BLOCK_K)
    for i in gl.static_range(STAGES):
        _load_step(a_desc, w_desc, a_smem, b_smem, ready, i, k_tiles, off_m, off_n, STAGES, BLOCK_K)

    # Rows past M read row 0's scales (their results are dropped at the store), as fp8_matmul does.
    rows = off_m + gl.arange(0, BLOCK_M, layout=row_layout)
    as_ptrs = as_ptr + gl.where(rows < M, rows, 0).to(gl.int64) * a_groups
    # A column tile lies inside one 128-row weight-scale block, so its block scale per step is a scalar.
    ws_row = ws_ptr + (off_n // BLOCK_K) * w_groups
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)

    # Groups of UNROLL steps: each step's product is issued before the previous one's is retired, so
    # one promotion runs beside one product. No product is in flight across the loop's back edge: a
    # loop-carried accumulator would be copied there while its product runs, and ptxas serialises
    # the products to make such a copy safe. The steps past the last whole group run one at a time.
    n_grouped = (k_tiles // UNROLL) * UNROLL
    for k0 in range(0, n_grouped, UNROLL):
        prev = _issue(a_smem, b_smem, ready, k0, zero, STAGES)
        prev_scales = _scales(as_ptrs, ws_row, k0)
        for j in gl.static_range(1, UNROLL):
            cur = _issue(a_smem, b_smem, ready, k0 + j, zero, STAGES)
            cur_scales = _scales(as_ptrs, ws_row, k0 + j)
            acc = _retire(acc, prev, prev_scales, 1)
            _load_step(a_desc, w_desc, a_smem, b_smem, ready, k0 + j - 1 + STAGES, k_tiles, off_m, off_n, STAGES,
                       BLOCK_K)
            prev = cur
            prev_scales = cur_scales
        acc = _retire(acc, prev, prev_scales, 0)
        _load_step(a_desc, w_desc, a_smem, b_smem, ready, k0 + UNROLL - 1 + STAGES, k_tiles, off_m, off_n, STAGES,
                   BLOCK_K)
    for kt in range(n_grouped, k_tiles):
        last = _issue(a_smem, b_smem, ready, kt, zero, STAGES)
        acc = _retire(acc, last, _scales(as_ptrs, ws_row, kt), 0)
        _load_step(a_desc, w_desc, a_smem, b_smem, ready, kt + STAGES, k_tiles, off_m, off_n, STAGES, BLOCK_K)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    if HAS_BIAS:
        bias_cols = off_n + gl.arange(0, BLOCK_N, layout=col_layout)
        bias = gl.load(b_ptr + bias_cols, mask=bias_cols < N, other=0.0)
        acc += bias.to(gl.float32)[None, :]
    # Rounded in the MMA layout, then moved (exactly) to one where each thread stores 16 bytes of a row.
    vec: gl.constexpr = 128 // y_ptr.dtype.element_ty.primitive_bitwidth
    out_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, vec], threads_per_warp=[32 // (BLOCK_N // vec),
                                                BLOCK_N // vec], warps_per_cta=[num_warps, 1], order=[1, 0])
    out = gl.convert_layout(acc.to(y_ptr.dtype.element_ty), out_layout)
    out_rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out_layout))
    y_ptrs = y_ptr + out_rows.to(gl.int64)[:, None] * stride_ym + cols[None, :]
    gl.store(y_ptrs, out, mask=(out_rows[:, None] < M) & (cols[None, :] < N))


def supported(block_m: int, block_n: int, num_warps: int) -> bool:
    """Whether a tiling maps onto one warpgroup MMA layout (M rows over num_warps / 4 warpgroups)."""
    return num_warps % 4 == 0 and block_m == 16 * num_warps and block_n in (64, 128)


def linear_fp8_async(xq: torch.Tensor, xs: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                     bias: torch.Tensor | None, y: torch.Tensor, block_m: int, block_n: int, num_warps: int,
                     num_stages: int, group_m: int, unroll: int = 4) -> None:
    """y = dequant(xq) @ dequant(weight).T + bias into y [M, N], for fp8_matmul.linear_fp8_quantized
    (operands validated there; K a multiple of 16, 16-byte aligned, block scales)."""
    m, k = xq.shape
    n = weight.shape[0]
    a_layout = gl.NVMMASharedLayout.get_default_for([block_m, GROUP], gl.float8e4nv)
    w_layout = gl.NVMMASharedLayout.get_default_for([block_n, GROUP], gl.float8e4nv)
    a_desc = TensorDescriptor(xq, [m, k], [k, 1], [block_m, GROUP], a_layout)
    w_desc = TensorDescriptor(weight, [n, k], [k, 1], [block_n, GROUP], w_layout)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _fp8_linear_async_kernel[grid](a_desc, w_desc, xs, scale, bias if bias is not None else y, y, m, n, k, y.stride(0),
                                   xs.shape[1], scale.shape[-1], HAS_BIAS=bias is not None, BLOCK_M=block_m,
                                   BLOCK_N=block_n, BLOCK_K=GROUP, GROUP_M=group_m, STAGES=num_stages,
                                   UNROLL=unroll, num_warps=num_warps)
