"""FP8 quantisers and the FP8 linear kernel: quantised values and scales against float64 rounding,
GEMM values against float64, rows bitwise independent of M, launcher checks.

Documented bounds (docs/quantization.md):
- quantise/dequantise round trip: |x - dq(q(x))| <= max(|x| * 2^-4, scale * 2^-10) elementwise
  (half an e4m3 unit in the last place for normal numbers, half the smallest subnormal otherwise);
- the quantisers (kernel and reference): exactly x / 2^ceil(log2(amax / 448)) rounded to the
  nearest e4m3 value, ties to even, as float64 arithmetic computes it;
- the kernel against float64 math on the same quantised operands: relative Frobenius error below
  one rounding of the output dtype (kernel_checks.TOL): FP8 products are exact in float32, so only
  the float32 summation and the final rounding differ.

The unmarked tests run anywhere (Triton's CPU interpreter without a GPU) on small shapes with small
tilings; the `gpu` tests run the engine's real projection shapes compiled on the device.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import replace

import pytest
import torch
from fp8_problems import linear_float64, linear_problem, randn
from kernel_checks import TOL, e4m3_round, pow2_scales64, rel_err

from shardinfer.kernels import fp8_matmul, fp8_quant, ops
from shardinfer.kernels import reference_fp8 as ref
from shardinfer.kernels.tuning import Tiling

if not torch.cuda.is_available():
    # The interpreter flag is read when a kernel is decorated; re-import in case another test
    # folder imported these modules before the interpreter was switched on.
    fp8_quant = importlib.reload(fp8_quant)
    fp8_matmul = importlib.reload(fp8_matmul)

SMALL = fp8_matmul.Fp8TileConfig(16, 32, num_warps=4, num_stages=2, group_m=2)
SMALL_ONE_TILE = fp8_matmul.Fp8TileConfig(32, 16, num_warps=4, num_stages=2, persistent=False)
SMALL_TMA = fp8_matmul.Fp8TileConfig(16, 32, num_warps=4, num_stages=2, group_m=2, tma=True)
SMALL_TMA_ONE_TILE = fp8_matmul.Fp8TileConfig(32, 16, num_warps=4, num_stages=2, persistent=False, tma=True)
# Fixed split-K at several tile shapes and both operand paths (K = 300 has three 128-channel steps,
# so split 4 leaves its last range empty).
SPLITS = [
    fp8_matmul.Fp8TileConfig(16, 32, num_warps=4, num_stages=2, group_m=2, split_k=2),
    fp8_matmul.Fp8TileConfig(32, 16, num_warps=4, num_stages=2, persistent=False, tma=True, split_k=2),
    fp8_matmul.Fp8TileConfig(16, 16, num_warps=4, num_stages=2, persistent=False, split_k=3),
    fp8_matmul.Fp8TileConfig(16, 32, num_warps=4, num_stages=2, tma=True, split_k=4),
]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.uint8)


def _hard_values() -> torch.Tensor:
    """Rows of values that land on rounding carries, ties, subnormals, zeros and the e4m3 maximum,
    over a wide range of magnitudes (a K tail of 44 channels included)."""
    x = randn(6, 300, seed=1) * torch.logspace(-9, 3, 300)
    x[2] = 0.0
    x[3, :10] = torch.tensor(
        [448.0, -447.0, 7.9407, 126.05, 1e-3, 2**-9 * 3.5, 2**-9 * 2.5, 2**-7 * 1.0625, 2**-7 * 1.1875, 300.0]
    )
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_quantiser_rounds_to_nearest_even_e4m3(device: torch.device, dtype: torch.dtype) -> None:
    """Kernel and reference against float64: each group's scale is 2^ceil(log2(amax / 448)) and each
    value is x / scale rounded to the nearest e4m3 value, ties to even."""
    x = _hard_values().to(dtype)
    want_s = pow2_scales64(_pad(x).double().abs().view(6, 3, 128).amax(-1))
    want_q = e4m3_round(_pad(x).double().view(6, 3, 128) / want_s[..., None]).view(6, -1)[:, :300]
    for q, s in (fp8_quant.quantize_groups(x.to(device)), ref.quantize_groups(x)):
        assert q.dtype == torch.float8_e4m3fn and s.shape == (6, 3)
        assert torch.equal(s.cpu().double(), want_s)
        assert torch.equal(q.cpu().double(), want_q)


def test_activation_quantiser_splits_long_rows_without_changing_bits(device: torch.device) -> None:
    """Rows of many groups are split over several programs (the last one partly past K): every
    group's values and scale still equal the reference's, which the test above checks against
    float64."""
    x = randn(3, 17 * 128 + 44, seed=2) * torch.logspace(-6, 2, 17 * 128 + 44)
    q, s = fp8_quant.quantize_groups(x.to(device))
    rq, rs = ref.quantize_groups(x)
    assert s.shape == (3, 18)
    assert torch.equal(s.cpu(), rs)
    assert torch.equal(_bits(q), _bits(rq))


def _pad(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(x.float(), (0, 84))


def test_pow2_scale_is_the_smallest_power_of_two_that_fits() -> None:
    amax = torch.cat(
        [
            torch.logspace(-30, 30, 997, dtype=torch.float64),
            torch.tensor([448.0, 224.0, 1.75, 1.7500001, 896.0, 3.5]),
        ]
    ).float()
    s = ref.pow2_scale(amax).double()
    a = amax.double()
    want = torch.tensor([2.0 ** math.ceil(math.log2(v / 448.0)) for v in a.tolist()], dtype=torch.float64)
    assert torch.equal(s, want)
    assert bool((a / s <= 448.0).all()) and bool((a / s > 224.0).all())


def _round_trip_bound(x: torch.Tensor, scale_of: torch.Tensor) -> torch.Tensor:
    return torch.maximum(x.double().abs() * 2**-4, scale_of.double() * 2**-10) * (1 + 1e-9)


def test_group_round_trip_within_fp8_rounding() -> None:
    x = _hard_values()
    q, s = ref.quantize_groups(x)
    back = ref.dequantize_groups(q, s)
    scale_of = s.repeat_interleave(128, dim=1)[:, :300]
    assert bool(((back.double() - x.double()).abs() <= _round_trip_bound(x, scale_of)).all())


def test_block_round_trip_within_fp8_rounding_and_scales_are_amax_over_448() -> None:
    w = randn(300, 200, seed=2) * torch.logspace(-3, 1, 200)  # partial blocks both ways
    q, s = ref.quantize_blocks(w)
    assert q.shape == (300, 200) and s.shape == (3, 2)
    for i in range(3):
        for j in range(2):
            block = w[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]
            assert s[i, j].item() == pytest.approx(block.abs().max().item() / 448.0, rel=1e-6)
    back = ref.dequantize_blocks(q, s)
    scale_of = s.repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :200]
    assert bool(((back.double() - w.double()).abs() <= _round_trip_bound(w, scale_of)).all())


@pytest.mark.parametrize("scales", ["block", "channel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", [SMALL, SMALL_ONE_TILE], ids=["persistent", "one_tile_per_program"])
def test_kernel_matches_float64_and_rows_are_bitwise_invariant(
    device: torch.device, dtype: torch.dtype, config: fp8_matmul.Fp8TileConfig, scales: str
) -> None:
    # K = 300: two full scale groups and a tail of 44; N = 150: a partial weight block.
    x, wq, ws, b = linear_problem(37, 150, 300, dtype, seed=3, scales=scales)
    dev = [t.to(device) for t in (x, wq, ws, b)]
    full = fp8_matmul.linear_fp8(*dev, config=config)
    assert full.shape == (37, 150) and full.dtype == dtype
    assert rel_err(full, linear_float64(x, wq, ws, b)) < TOL[dtype]
    for start, rows in [(5, 1), (36, 1), (3, 7), (17, 20)]:
        part = fp8_matmul.linear_fp8(dev[0][start : start + rows], *dev[1:], config=config)
        assert torch.equal(part, full[start : start + rows]), (start, rows)


@pytest.mark.parametrize("scales", ["block", "channel"])
@pytest.mark.parametrize(
    "config", [SMALL_TMA, SMALL_TMA_ONE_TILE], ids=["persistent", "one_tile_per_program"]
)
def test_tma_tiling_gives_the_pointer_tilings_bits(
    device: torch.device, config: fp8_matmul.Fp8TileConfig, scales: str
) -> None:
    # K = 320: two full scale groups and a 64-channel tail the copy engine zero-fills; N = 150: a
    # partial weight block; M = 37: a partial row tile.
    x, wq, ws, b = linear_problem(37, 150, 320, torch.bfloat16, seed=8, scales=scales)
    dev = [t.to(device) for t in (x, wq, ws, b)]
    full = fp8_matmul.linear_fp8(*dev, config=config)
    assert rel_err(full, linear_float64(x, wq, ws, b)) < TOL[torch.bfloat16]
    # The same K order and promotion as the pointer kernel: tilings can switch by M.
    assert torch.equal(full, fp8_matmul.linear_fp8(*dev, config=SMALL))
    for start, rows in [(5, 1), (36, 1), (17, 20)]:
        part = fp8_matmul.linear_fp8(dev[0][start : start + rows], *dev[1:], config=config)
        assert torch.equal(part, full[start : start + rows]), (start, rows)


@pytest.mark.parametrize("scales", ["block", "channel"])
@pytest.mark.parametrize(
    "config", SPLITS, ids=lambda c: f"split{c.split_k}_{c.block_m}x{c.block_n}_tma{int(c.tma)}"
)
def test_split_k_matches_float64_and_rows_are_bitwise_invariant(
    device: torch.device, config: fp8_matmul.Fp8TileConfig, scales: str
) -> None:
    # K = 320 on the TMA path (the copy engine's zero-filled tail), 300 on the pointer path's masked one.
    k = 320 if config.tma else 300
    x, wq, ws, b = linear_problem(37, 150, k, torch.bfloat16, seed=11, scales=scales)
    dev = [t.to(device) for t in (x, wq, ws, b)]
    full = fp8_matmul.linear_fp8(*dev, config=config)
    assert rel_err(full, linear_float64(x, wq, ws, b)) < TOL[torch.bfloat16]
    for start, rows in [(5, 1), (36, 1), (3, 7), (17, 20)]:
        part = fp8_matmul.linear_fp8(dev[0][start : start + rows], *dev[1:], config=config)
        assert torch.equal(part, full[start : start + rows]), (start, rows)
    # Another tile shape, operand path and launch mode with the same K ranges: the same bits, so
    # a problem's tilings may switch by M as long as they share split_k.
    other = fp8_matmul.Fp8TileConfig(
        32,
        64,
        num_warps=4,
        num_stages=3,
        persistent=not config.persistent,
        tma=not config.tma,
        split_k=config.split_k,
    )
    assert torch.equal(fp8_matmul.linear_fp8(*dev, config=other), full)


@pytest.mark.parametrize("scales", ["block", "channel"])
@pytest.mark.parametrize(
    "config", SPLITS, ids=lambda c: f"split{c.split_k}_{c.block_m}x{c.block_n}_tma{int(c.tma)}"
)
def test_ranges_in_one_program_give_the_workspace_bits(
    device: torch.device, config: fp8_matmul.Fp8TileConfig, scales: str
) -> None:
    # The ranges reduced one after another in one program and added there, against the ranges as
    # separate programs combined through the workspace: the same sum, so the same bits, at every M
    # (a problem's tilings may use one path at decode batches and the other at prefill sizes). With
    # a bias and, at split 4, an empty last range; float32 out, so no output rounding hides a
    # difference. (Per-channel scales take the workspace either way; the interpreter fuses no
    # multiply-add, so the GPU test is the one that tells the two paths' roundings apart.)
    k = 320 if config.tma else 300
    x, wq, ws, b = linear_problem(37, 150, k, torch.float32, seed=13, scales=scales)
    dev = [t.to(device) for t in (x, wq, ws, b)]
    in_program = replace(config, ranges_in_program=True)
    full = fp8_matmul.linear_fp8(*dev, config=config)
    assert torch.equal(fp8_matmul.linear_fp8(*dev, config=in_program), full)
    other = replace(in_program, block_m=32, block_n=64, persistent=not config.persistent, tma=not config.tma)
    for start, rows in [(5, 1), (17, 20)]:
        part = fp8_matmul.linear_fp8(dev[0][start : start + rows], *dev[1:], config=other)
        assert torch.equal(part, full[start : start + rows]), (start, rows)


def test_split_k_sums_its_ranges_in_order(device: torch.device) -> None:
    # Split 2 at K = 384 (three steps: ranges [0, 2) and [2, 3)) is, row by row, the unsplit kernel
    # on each range's channels, the two added in float32, then the bias: the bits follow from K and
    # split_k alone. Float32 in and out, so no output rounding enters the comparison.
    x, wq, ws, b = linear_problem(9, 64, 384, torch.float32, seed=12)
    x, wq, ws, b = (t.to(device) for t in (x, wq, ws, b))
    split = fp8_matmul.Fp8TileConfig(16, 32, num_warps=4, num_stages=2, split_k=2)
    unsplit = fp8_matmul.Fp8TileConfig(16, 32, num_warps=4, num_stages=2)
    head = fp8_matmul.linear_fp8(
        x[:, :256].contiguous(), wq[:, :256].contiguous(), ws[:, :2].contiguous(), config=unsplit
    )
    tail = fp8_matmul.linear_fp8(
        x[:, 256:].contiguous(), wq[:, 256:].contiguous(), ws[:, 2:].contiguous(), config=unsplit
    )
    assert torch.equal(fp8_matmul.linear_fp8(x, wq, ws, b, config=split), (head + tail) + b)


@pytest.mark.parametrize(
    "n,k,split",
    [
        (1024, 3072, 2),
        (576, 2048, 2),
        (2048, 6144, 2),
        (4096, 12288, 1),
        (4096, 4096, 1),
        (24576, 4096, 1),
        (2048, 2816, 1),
    ],
)
def test_default_splits_long_k_through_the_workspace_only_at_decode_batches(
    n: int, k: int, split: int
) -> None:
    # K >= 3N over at most SPLIT_MAX_N columns splits K in two for every M (one sum, so one set of
    # bits): through the workspace up to 256 rows, where the tiles are too few to fill the SMs, in the
    # tile's own program above. Wider outputs (dense-8b's down projection) keep K whole.
    assert fp8_matmul.SPLIT_MAX_N == 2048
    for m in (1, 64, 65, 256, 257, 8192):
        cfg = fp8_matmul.tile_config(n, k, m)
        assert cfg.split_k == split, (m, cfg)
        if split > 1:
            assert cfg.ranges_in_program == (m > 256), (m, cfg)


def test_tilings_of_one_problem_must_share_split_k() -> None:
    one = fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=4)
    fp8_matmul.CONFIG_OVERRIDES[(640, 512)] = Tiling(one, ((64, replace(one, split_k=2)),))
    try:
        with pytest.raises(ValueError, match=r"\(640, 512\) mix split_k \[1, 2\]"):
            fp8_matmul.tile_config(640, 512, 8)
    finally:
        del fp8_matmul.CONFIG_OVERRIDES[(640, 512)]
    with pytest.raises(ValueError, match="split_k"):
        fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=4, split_k=0)


def test_tma_tiling_falls_back_to_pointer_loads_where_it_cannot_address(device: torch.device) -> None:
    # 200-byte rows (not a multiple of 16): the pointer kernel runs the same tiles, same bits.
    x, wq, ws, _ = (t.to(device) for t in linear_problem(4, 40, 200, torch.bfloat16, seed=9))
    got = fp8_matmul.linear_fp8(x, wq, ws, config=SMALL_TMA)
    assert torch.equal(got, fp8_matmul.linear_fp8(x, wq, ws, config=SMALL))
    assert rel_err(got, linear_float64(*(t.cpu() for t in (x, wq, ws)), None)) < TOL[torch.bfloat16]


@pytest.mark.parametrize("scales", ["block", "channel"])
def test_default_tiling_without_bias_is_invariant(device: torch.device, scales: str) -> None:
    x, wq, ws, _ = linear_problem(70, 64, 256, torch.bfloat16, seed=4, scales=scales)  # two 64-row tiles
    xd, wqd, wsd = x.to(device), wq.to(device), ws.to(device)
    full = fp8_matmul.linear_fp8(xd, wqd, wsd)
    assert rel_err(full, linear_float64(x, wq, ws, None)) < TOL[torch.bfloat16]
    for i in (0, 65, 69):
        assert torch.equal(fp8_matmul.linear_fp8(xd[i : i + 1], wqd, wsd), full[i : i + 1])


def test_reference_linear_is_dequantise_then_matmul() -> None:
    x, wq, ws, b = linear_problem(9, 40, 200, torch.float32, seed=5)
    got = ops.linear_fp8(x.view(3, 3, 200), wq, ws, b)  # CPU tensors: the reference path
    assert got.shape == (3, 3, 40)
    assert rel_err(got.view(9, 40), linear_float64(x, wq, ws, b)) < TOL[torch.float32]
    alone = ops.linear_fp8(x[4:5], wq, ws, b)
    assert torch.equal(alone, got.view(9, 40)[4:5])


def test_launcher_checks_fire(device: torch.device) -> None:
    x, wq, ws, b = (t.to(device) for t in linear_problem(4, 40, 200, torch.bfloat16, seed=6))
    with pytest.raises(ValueError, match=r"weight\.dtype"):
        fp8_matmul.linear_fp8(x, wq.float(), ws)
    with pytest.raises(ValueError, match=r"weight_scale\.shape"):
        fp8_matmul.linear_fp8(x, wq, ws[:, :1].contiguous())
    with pytest.raises(ValueError, match=r"weight\.shape"):
        fp8_matmul.linear_fp8(x[:, :100], wq, ws)
    with pytest.raises(ValueError, match=r"bias\.shape"):
        fp8_matmul.linear_fp8(x, wq, ws, b[:3])
    with pytest.raises(ValueError, match="block_n"):
        fp8_matmul.Fp8TileConfig(64, 256, num_warps=4, num_stages=2)


# Projection shapes of the benchmark models (dense-8b: Qwen3-8B; moe-16b's attention and shared experts).
GPU_SHAPES = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (2048, 2048), (576, 2048)]


@pytest.mark.gpu
@pytest.mark.parametrize("scales", ["block", "channel"])
@pytest.mark.parametrize("n,k", GPU_SHAPES)
def test_gpu_engine_shapes_match_float64_and_are_batch_invariant(n: int, k: int, scales: str) -> None:
    x, wq, ws, _ = linear_problem(300, n, k, torch.bfloat16, seed=n + k, scales=scales)
    dev = [t.cuda() for t in (x, wq, ws)]
    full = fp8_matmul.linear_fp8(*dev)
    assert rel_err(full, linear_float64(x, wq, ws, None)) < TOL[torch.bfloat16]
    for start, rows in [(0, 1), (137, 1), (5, 64), (44, 256)]:
        assert torch.equal(
            fp8_matmul.linear_fp8(dev[0][start : start + rows], *dev[1:]), full[start : start + rows]
        )
    # The TMA tilings compiled for the device give the pointer tilings' bits (with the problem's own
    # split of K: a long-K problem's default splits it, which moves the sum).
    split = fp8_matmul.tile_config(n, k).split_k
    for cfg in (
        fp8_matmul.Fp8TileConfig(
            64, 128, num_warps=4, num_stages=4, persistent=False, tma=True, split_k=split
        ),
        fp8_matmul.Fp8TileConfig(128, 128, num_warps=8, num_stages=4, tma=True, split_k=split),
    ):
        assert torch.equal(fp8_matmul.linear_fp8(*dev, config=cfg), full), cfg


@pytest.mark.gpu
@pytest.mark.parametrize("scales", ["block", "channel"])
@pytest.mark.parametrize("n,k", [(4096, 4096), (4096, 12288), (6144, 4096)])
def test_gpu_split_k_shapes_match_float64_and_are_batch_invariant(n: int, k: int, scales: str) -> None:
    x, wq, ws, _ = linear_problem(300, n, k, torch.bfloat16, seed=n + k + 1, scales=scales)
    dev = [t.cuda() for t in (x, wq, ws)]
    for split in (2, 4):
        cfgs = [
            fp8_matmul.Fp8TileConfig(
                64, 128, num_warps=4, num_stages=4, persistent=False, tma=True, split_k=split
            ),
            fp8_matmul.Fp8TileConfig(
                128, 128, num_warps=8, num_stages=4, persistent=False, tma=True, split_k=split
            ),
            fp8_matmul.Fp8TileConfig(64, 64, num_warps=4, num_stages=6, persistent=False, split_k=split),
        ]
        # The same ranges reduced in one program (the large-M path) give the workspace path's bits.
        cfgs += [replace(c, ranges_in_program=True) for c in cfgs]
        full = fp8_matmul.linear_fp8(*dev, config=cfgs[0])
        assert rel_err(full, linear_float64(x, wq, ws, None)) < TOL[torch.bfloat16]
        for start, rows in [(0, 1), (137, 1), (5, 64), (44, 256)]:
            for cfg in cfgs:
                part = fp8_matmul.linear_fp8(dev[0][start : start + rows], *dev[1:], config=cfg)
                assert torch.equal(part, full[start : start + rows]), (split, cfg, start, rows)
        # In float32 out, where no output rounding can hide a last-place difference between the two
        # ways of adding the ranges (one fused multiply-add would show here).
        x32 = dev[0].float()
        ranges = fp8_matmul.linear_fp8(x32, *dev[1:], config=cfgs[0])
        for cfg in cfgs[len(cfgs) // 2 :]:
            assert torch.equal(fp8_matmul.linear_fp8(x32, *dev[1:], config=cfg), ranges), (split, cfg)


def test_tma_tilings_use_the_copy_engine_from_hopper_on_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before Hopper a `tma` tiling runs on the pointer kernel (the same tiles and order, so the same
    # bits); the interpreter runs the TMA kernel anywhere.
    monkeypatch.setattr(fp8_matmul, "interpreting", lambda: False)
    for cap, want in (((8, 9), False), ((8, 0), False), ((9, 0), True), ((10, 0), True)):
        monkeypatch.setattr(fp8_matmul, "capability", lambda index, cap=cap: cap)
        assert fp8_matmul._has_tma(torch.device("cuda", 0)) is want, cap
    assert fp8_matmul._has_tma(torch.device("cpu"))
