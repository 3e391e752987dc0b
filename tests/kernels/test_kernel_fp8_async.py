"""The FP8 GEMM with asynchronous products (kernels/fp8_matmul_async.py, `fp8_matmul.ASYNC_MMA`)
against the TMA kernel at the same tiles, bit for bit, and against float64 on the same quantised
operands. Gluon kernels compile for the GPU only (no interpreter), so these are `gpu` tests; the
CPU suite compiles the kernel for Hopper (test_kernel_fp8_hopper_compile.py)."""

from __future__ import annotations

import pytest
import torch
from fp8_problems import linear_float64, linear_problem
from kernel_checks import TOL, rel_err

from shardinfer.kernels import fp8_matmul

pytestmark = pytest.mark.gpu

TILINGS = [
    fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=4, persistent=False, tma=True),
    fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=3, persistent=False, tma=True),
    fp8_matmul.Fp8TileConfig(64, 64, num_warps=4, num_stages=6, persistent=False, tma=True),
]


def _run(dev: list[torch.Tensor], cfg: fp8_matmul.Fp8TileConfig, asynchronous: bool, unroll: int = 2,
         bias: torch.Tensor | None = None) -> torch.Tensor:
    saved = fp8_matmul.ASYNC_MMA, fp8_matmul.ASYNC_UNROLL, fp8_matmul.ASYNC_MAX_M
    fp8_matmul.ASYNC_MMA, fp8_matmul.ASYNC_UNROLL, fp8_matmul.ASYNC_MAX_M = asynchronous, unroll, 1 << 30
    try:
        return fp8_matmul.linear_fp8(*dev, bias, config=cfg)
    finally:
        fp8_matmul.ASYNC_MMA, fp8_matmul.ASYNC_UNROLL, fp8_matmul.ASYNC_MAX_M = saved


# K of 9, 8, 32 and 11 steps (a tail inside the last 128 channels: 1040 = 8 x 128 + 16); M past a tile edge.
@pytest.mark.parametrize("m,n,k", [(300, 512, 1152), (64, 6144, 1024), (257, 4096, 4096), (33, 384, 1040)])
@pytest.mark.parametrize("unroll", [1, 2, 3])
def test_async_products_give_the_tma_kernels_bits(m: int, n: int, k: int, unroll: int) -> None:
    x, wq, ws, b = linear_problem(m, n, k, torch.bfloat16, seed=m + n + k)
    dev = [t.cuda() for t in (x, wq, ws)]
    for cfg in TILINGS:
        for bias in (None, b.cuda()):
            want = _run(dev, cfg, False, bias=bias)
            got = _run(dev, cfg, True, unroll, bias=bias)
            assert torch.equal(got, want), (cfg, unroll, bias is not None)
    assert rel_err(got, linear_float64(x, wq, ws, b)) < TOL[torch.bfloat16]


def test_async_products_keep_rows_independent_of_the_batch() -> None:
    x, wq, ws, _ = linear_problem(300, 4096, 4096, torch.bfloat16, seed=7)
    dev = [t.cuda() for t in (x, wq, ws)]
    cfg = TILINGS[0]
    full = _run(dev, cfg, True)
    for start, rows in [(0, 1), (137, 1), (5, 64), (44, 256)]:
        assert torch.equal(_run([dev[0][start:start + rows], *dev[1:]], cfg, True), full[start:start + rows])
