"""The warp-specialised FP8 GEMM (kernels/fp8_matmul_ws.py), which fp8_matmul runs at prefill sizes:
bit for bit the TMA kernel's rows (at the same and at other tiles), rows independent of the batch
across the switch between the two kernels, and float64 on the same quantised operands. Gluon
kernels compile for the GPU only (no interpreter), so those are `gpu` tests (the persistent variant,
PERSISTENT, included); the CPU suite
compiles the kernel for Hopper (test_kernel_fp8_hopper_compile.py) and checks where it runs."""

from __future__ import annotations

import pytest
import torch
from fp8_problems import linear_float64, linear_problem
from kernel_checks import TOL, rel_err

from shardinfer.kernels import fp8_matmul


@pytest.fixture
def hopper(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Hopper GPU as far as fp8_matmul.warp_specialized can tell."""
    monkeypatch.setattr(fp8_matmul, "capability", lambda index: (9, 0))
    monkeypatch.setattr(fp8_matmul, "interpreting", lambda: False)


@pytest.mark.usefixtures("hopper")
def test_runs_above_decode_batches_over_long_k_on_hopper_only(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda", 0)
    m, k = fp8_matmul.WS_MIN_M, fp8_matmul.WS_MIN_K
    assert fp8_matmul.warp_specialized(m, k, cuda)
    assert fp8_matmul.warp_specialized(8192, 14336, cuda)
    assert not fp8_matmul.warp_specialized(m - 1, k, cuda)
    assert not fp8_matmul.warp_specialized(m, k - 128, cuda)
    assert not fp8_matmul.warp_specialized(m, k, torch.device("cpu"))
    monkeypatch.setattr(fp8_matmul, "capability", lambda index: (10, 0))
    assert not fp8_matmul.warp_specialized(m, k, cuda)
    monkeypatch.setattr(fp8_matmul, "capability", lambda index: (9, 0))
    monkeypatch.setattr(fp8_matmul, "WARP_SPECIALIZED", False)
    assert not fp8_matmul.warp_specialized(m, k, cuda)


def test_every_k_takes_the_persistent_schedule_unless_limited_or_forced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shardinfer.kernels import fp8_matmul_ws

    assert fp8_matmul_ws.PERSISTENT is None and fp8_matmul_ws.PERSISTENT_MAX_K is None
    # dense-8b's projections: K 4096 (qkv, gate_up, o) and 12288 (down).
    for k in (fp8_matmul.WS_MIN_K, 4096, 12288):
        assert fp8_matmul_ws.persistent_schedule(k), k
    monkeypatch.setattr(fp8_matmul_ws, "PERSISTENT_MAX_K", 2048)
    assert fp8_matmul_ws.persistent_schedule(2048)
    assert not fp8_matmul_ws.persistent_schedule(2048 + 128)
    monkeypatch.setattr(fp8_matmul_ws, "PERSISTENT", False)
    assert not fp8_matmul_ws.persistent_schedule(fp8_matmul.WS_MIN_K)
    monkeypatch.setattr(fp8_matmul_ws, "PERSISTENT", True)
    assert fp8_matmul_ws.persistent_schedule(4096)


def _run(
    dev: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    cfg: fp8_matmul.Fp8TileConfig | None,
    warp_specialized: bool,
    bias: torch.Tensor | None = None,
    persistent: bool = False,
) -> torch.Tensor:
    from shardinfer.kernels import fp8_matmul_ws

    saved = fp8_matmul.WARP_SPECIALIZED, fp8_matmul.WS_MIN_K, fp8_matmul_ws.PERSISTENT
    fp8_matmul.WARP_SPECIALIZED, fp8_matmul.WS_MIN_K = warp_specialized, 0  # any K
    fp8_matmul_ws.PERSISTENT = persistent
    try:
        x, wq, ws = dev
        return fp8_matmul.linear_fp8(x, wq, ws, bias, config=cfg)
    finally:
        fp8_matmul.WARP_SPECIALIZED, fp8_matmul.WS_MIN_K, fp8_matmul_ws.PERSISTENT = saved


TMA_TILINGS = [
    fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=4, persistent=False, tma=True),
    fp8_matmul.Fp8TileConfig(64, 64, num_warps=4, num_stages=6, persistent=False, tma=True),
]


# K of 9, 8, 32 and 11 steps (1040 = 8 x 128 + 16: a tail inside the last 128 channels; odd counts
# end on a single step), M past a tile edge, N past a 128-column tile.
@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(300, 512, 1152), (1024, 6144, 1024), (257, 4096, 4096), (333, 384, 1040)])
def test_gives_the_tma_kernels_bits(m: int, n: int, k: int) -> None:
    x, wq, ws, b = linear_problem(m, n, k, torch.bfloat16, seed=m + n + k + 5)
    dev = (x.cuda(), wq.cuda(), ws.cuda())
    for bias in (None, b.cuda()):
        got = _run(dev, None, True, bias=bias)
        for cfg in TMA_TILINGS:
            assert torch.equal(got, _run(dev, cfg, False, bias=bias)), (cfg, bias is not None)
        # The persistent variant walks several tiles a program through one ring of stages.
        assert torch.equal(got, _run(dev, None, True, bias=bias, persistent=True)), bias is not None
    assert rel_err(got, linear_float64(x, wq, ws, b)) < TOL[torch.bfloat16]


@pytest.mark.gpu
def test_the_persistent_kernel_gives_the_same_bits_when_programs_take_many_tiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Few programs for many tiles: the ring's stage and parity carry across tiles of odd step counts.
    from shardinfer.kernels import fp8_matmul_ws

    x, wq, ws, b = linear_problem(1000, 2048, 1152, torch.bfloat16, seed=11)
    dev = (x.cuda(), wq.cuda(), ws.cuda())
    want = _run(dev, None, True, bias=b.cuda())
    for programs in (1, 3, 7):
        monkeypatch.setattr(fp8_matmul_ws, "sm_count", lambda index, n=programs: n)
        assert torch.equal(_run(dev, None, True, bias=b.cuda(), persistent=True), want), programs


# The default thresholds: 300 rows run warp-specialised, up to 256 rows do not. K = 12288 over
# N = 4096 is dense-8b's down projection, which keeps K whole (no split) on both sides of the switch.
@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(1024, 4096), (4096, 12288)])
def test_rows_are_independent_of_the_batch_across_the_switch(n: int, k: int) -> None:
    x, wq, ws, _ = linear_problem(300, n, k, torch.bfloat16, seed=7)
    xd, wqd, wsd = x.cuda(), wq.cuda(), ws.cuda()
    m = x.shape[0]
    assert fp8_matmul.warp_specialized(m, k, xd.device)
    full = fp8_matmul.linear_fp8(xd, wqd, wsd)
    for start, rows in [(0, 1), (137, 1), (5, 64), (44, 256), (3, 297)]:
        assert torch.equal(
            fp8_matmul.linear_fp8(xd[start : start + rows], wqd, wsd), full[start : start + rows]
        )
