"""Batch-invariant linear: accuracy against float64, bitwise row invariance across M, launcher checks.

The unmarked tests run anywhere (Triton's CPU interpreter without a GPU) on tiny shapes, with
small tilings so a few rows already span several tiles, ragged edges and a K tail. The `gpu`
tests run the engine's real Qwen3 projection shapes compiled on the device.
"""

from __future__ import annotations

import dataclasses
import importlib
import json

import pytest
import torch
from kernel_checks import TOL, rel_err

from shardinfer.kernels import _common
from shardinfer.kernels import matmul as mm

if not torch.cuda.is_available():
    # The interpreter flag is read when a kernel is decorated; re-import in case another test
    # folder imported this module before the interpreter was switched on.
    mm = importlib.reload(mm)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SMALL = {  # tiny tilings that are still fixed for every M, as the real ones are
    "persistent": mm.TileConfig(16, 16, 16, num_warps=4, num_stages=2, group_m=2),
    "one_tile_per_program": mm.TileConfig(16, 32, 16, num_warps=4, num_stages=2, persistent=False),
    "tma": mm.TileConfig(16, 16, 16, num_warps=4, num_stages=2, group_m=2, tma=True),
    "split_k": mm.TileConfig(16, 16, 16, num_warps=4, num_stages=2, group_m=2, split_k=3),
    "split_k_tma": mm.TileConfig(16, 16, 16, num_warps=4, num_stages=2, group_m=2, tma=True, split_k=3),
}


def _randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def _problem(
    m: int, n: int, k: int, dtype: torch.dtype, device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = _randn(m, k, dtype=dtype, seed=seed)
    w = _randn(n, k, dtype=dtype, seed=seed + 1, scale=k**-0.5)
    b = _randn(n, dtype=dtype, seed=seed + 2)
    return x.to(device), w.to(device), b.to(device)


def _ref(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x.double().cpu() @ w.double().cpu().T
    return y + b.double().cpu() if b is not None else y


@pytest.mark.parametrize("dtype", DTYPES)
# 40: a K tail; 72: five K steps over three split ranges (2 + 2 + 1), the last with the tail
@pytest.mark.parametrize(
    "config,k",
    [("persistent", 40), ("one_tile_per_program", 48), ("tma", 40), ("split_k", 72), ("split_k_tma", 72)],
)
def test_matches_float64_and_rows_are_bitwise_invariant(
    device: torch.device, dtype: torch.dtype, config: str, k: int
) -> None:
    cfg = SMALL[config]
    x, w, b = _problem(37, 40, k, dtype, device, seed=k)
    full = mm.linear_with_config(x, w, b, cfg)
    assert full.shape == (37, 40) and full.dtype == dtype
    assert rel_err(full, _ref(x, w, b)) < TOL[dtype]
    # Each slice puts its rows at other positions inside other tiles than the full batch does.
    for start, rows in [(5, 1), (36, 1), (3, 7), (17, 20)]:
        part = mm.linear_with_config(x[start : start + rows], w, b, cfg)
        assert torch.equal(part, full[start : start + rows]), (start, rows)


@pytest.mark.parametrize("dtype", DTYPES)
def test_default_tiling_without_bias(device: torch.device, dtype: torch.dtype) -> None:
    x, w, _ = _problem(131, 24, 72, dtype, device, seed=3)  # 131 rows: two 128-row tiles
    full = mm.linear_batch_invariant(x, w)
    assert rel_err(full, _ref(x, w, None)) < TOL[dtype]
    for i in (0, 77, 130):
        assert torch.equal(mm.linear_batch_invariant(x[i : i + 1], w), full[i : i + 1])


def test_router_shaped_float32_default_splits_k_and_stays_invariant(device: torch.device) -> None:
    """MoE router logits: float32, 64 experts x hidden 1024. The default tiling splits K (a split
    fixed by K alone), which must still give every row the same bits whatever the batch."""
    assert mm.tile_config(64, 1024, torch.float32).split_k > 1
    x, w, _ = _problem(37, 64, 1024, torch.float32, device, seed=11)
    full = mm.linear_batch_invariant(x, w)
    assert rel_err(full, _ref(x, w, None)) < TOL[torch.float32]
    for start, rows in [(0, 1), (36, 1), (5, 20)]:
        assert torch.equal(mm.linear_batch_invariant(x[start : start + rows], w), full[start : start + rows])


def test_router_rows_on_both_row_heights_get_the_same_bits(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router's default tiling takes 64-row tiles from a grid of ROUTER_TALL_PROGRAMS programs
    on (here lowered, so a small batch crosses it): a row gets the same bits in a batch on the
    tall tiles as alone on the 32-row ones."""
    monkeypatch.setattr(mm, "ROUTER_TALL_PROGRAMS", 16)
    t = mm.tiling(64, 1024, torch.float32)
    (max_m, short), tall = t.by_m[0], t.rest
    assert short.split_k == tall.split_k == 8 and (short.block_m, tall.block_m) == (32, 64)
    assert 127 < max_m < 128  # from 128 rows, two 64-row tiles times 8 splits make 16 programs
    mm.check_interchangeable(1024, torch.float32, t.configs)
    x, w, _ = _problem(150, 64, 1024, torch.float32, device, seed=12)
    full = mm.linear_batch_invariant(x, w)  # 150 rows: the tall tiles
    assert rel_err(full, _ref(x, w, None)) < TOL[torch.float32]
    for start, rows in [(0, 1), (149, 1), (70, 40)]:  # 1 and 40 rows: the 32-row tiles
        assert torch.equal(mm.linear_batch_invariant(x[start : start + rows], w), full[start : start + rows])


def test_router_tall_tiles_start_at_about_two_programs_a_sm() -> None:
    """moe-16b's router (64 x 2048, split 16) turns tall at 1024 rows, DeepSeek-V3's (256 x 7168,
    four column tiles) at 256: the sizes from which the 64-row tiles were the faster on the GPU."""
    for (n, k), first_tall in (((64, 2048), 1024), ((256, 7168), 256)):
        t = mm.tiling(n, k, torch.float32)
        assert t.for_m(first_tall - 1).block_m == 32 and t.for_m(first_tall).block_m == 64


def test_row_strided_input(device: torch.device) -> None:
    """A column slice of a wider activation (row stride > K) is read in place."""
    wide, w, b = _problem(9, 20, 64, torch.float32, device, seed=5)
    x = wide[:, :40]
    w = w[:, :40].contiguous()
    cfg = SMALL["persistent"]
    out = mm.linear_with_config(x, w, b, cfg)
    assert rel_err(out, _ref(x, w, b)) < TOL[torch.float32]
    assert torch.equal(mm.linear_with_config(x[4:5], w, b, cfg), out[4:5])


@pytest.mark.parametrize("config", ["persistent", "tma"])
def test_unaligned_activations_are_copied(device: torch.device, config: str) -> None:
    """A slice starting 8 bytes into a row is copied to an aligned buffer; values, and result, unchanged."""
    x, w, b = _problem(6, 16, 32, torch.bfloat16, device, seed=8)
    cfg = SMALL[config]
    full = mm.linear_with_config(x, w, b, cfg)
    shifted = x.flatten()[4 : 4 + 5 * 32].view(5, 32)  # rows start 4 elements into x's rows
    ref = mm.linear_with_config(shifted.clone(), w, b, cfg)
    assert torch.equal(mm.linear_with_config(shifted, w, b, cfg), ref)
    assert torch.equal(mm.linear_with_config(x[3:4], w, b, cfg), full[3:4])
    if cfg.tma:
        with pytest.raises(ValueError, match=r"K: got 20"):
            mm.linear_with_config(x[:, :20], w[:, :20].contiguous(), b, cfg)


def test_empty_dims(device: torch.device) -> None:
    x, w, b = _problem(3, 8, 16, torch.float32, device, seed=6)
    assert mm.linear_batch_invariant(x[:0], w, b).shape == (0, 8)
    no_k = mm.linear_batch_invariant(x[:, :0], w[:, :0].contiguous(), b)
    assert torch.equal(no_k.cpu(), b.cpu().expand(3, 8))


def test_overrides_are_keyed_by_n_k_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = mm.TileConfig(64, 64, 64, num_warps=4, num_stages=3)
    monkeypatch.setitem(mm.CONFIG_OVERRIDES, (96, 80, torch.float16), cfg)
    assert mm.tile_config(96, 80, torch.float16) == cfg
    assert mm.tile_config(96, 80, torch.bfloat16) != cfg


def test_measured_configs_are_read_per_gpu_model(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU's measured-tilings file overrides the default for its shapes only, and only on that GPU."""
    monkeypatch.setattr(mm, "CONFIG_DIR", tmp_path)
    mm.measured_configs.cache_clear()
    measured = mm.TileConfig(64, 32, 64, num_warps=4, num_stages=5)
    mm.config_path("Some GPU 80GB").write_text(
        json.dumps(
            {"entries": [{"n": 1024, "k": 2048, "dtype": "bfloat16", "config": dataclasses.asdict(measured)}]}
        )
    )
    assert mm.config_path("Some GPU 80GB").name == "Some_GPU_80GB.json"
    try:
        assert mm.tile_config(1024, 2048, torch.bfloat16, "Some GPU 80GB") == measured
        default = mm.tile_config(1024, 2048, torch.bfloat16)
        assert default != measured
        assert mm.tile_config(1024, 2048, torch.bfloat16, "Another GPU") == default
        assert mm.tile_config(1024, 2048, torch.float16, "Some GPU 80GB") == mm.tile_config(
            1024, 2048, torch.float16
        )
        assert mm.tile_config(2048, 1024, torch.bfloat16, "Some GPU 80GB") == mm.tile_config(
            2048, 1024, torch.bfloat16
        )
    finally:
        mm.measured_configs.cache_clear()


def test_tilings_by_batch_size_pick_the_first_range_holding_m(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mm, "CONFIG_DIR", tmp_path)
    mm.measured_configs.cache_clear()
    small = mm.TileConfig(64, 32, 64, num_warps=4, num_stages=5)
    mid = mm.TileConfig(128, 128, 64, num_warps=8, num_stages=4, tma=True)
    rest = mm.TileConfig(128, 256, 128, num_warps=8, num_stages=3)
    mm.config_path("Some GPU").write_text(
        json.dumps(
            {
                "entries": [
                    {
                        "n": 1024,
                        "k": 2048,
                        "dtype": "bfloat16",
                        "config": dataclasses.asdict(rest),
                        "by_m": [
                            {"max_m": 16, "config": dataclasses.asdict(small)},
                            {"max_m": 1024, "config": dataclasses.asdict(mid)},
                        ],
                    }
                ]
            }
        )
    )
    try:
        got = {
            m: mm.tile_config(1024, 2048, torch.bfloat16, "Some GPU", m)
            for m in (1, 16, 17, 1024, 1025, 8192)
        }
        assert got == {1: small, 16: small, 17: mid, 1024: mid, 1025: rest, 8192: rest}
        assert mm.tile_config(1024, 2048, torch.bfloat16, "Some GPU") == rest  # no M: the large-M tiling
    finally:
        mm.measured_configs.cache_clear()


def test_warm_up_runs_each_distinct_tiling_once() -> None:
    a = mm.TileConfig(64, 32, 64, 4, 5)
    b = mm.TileConfig(128, 128, 64, 8, 4)
    c = mm.TileConfig(128, 256, 64, 8, 3)
    assert mm.warm_up_sizes(mm.Tiling(c)) == [1]
    assert mm.warm_up_sizes(mm.Tiling(c, ((16, a), (128, a), (1024, b)))) == [16, 1024, 1025]
    # A tiling already run for a range is not run again for large M.
    assert mm.warm_up_sizes(mm.Tiling(c, ((16, a), (1024, c)))) == [16, 1024]


def test_warm_up_runs_the_lm_heads_float32_output_too() -> None:
    """Linear.logits runs the head with float32 output, another compiled variant of each tiling:
    the warm-up runs it beside the plain output, once per problem, and only for the heads."""
    proj, head = torch.zeros(64, 32, dtype=torch.bfloat16), torch.zeros(100, 32, dtype=torch.bfloat16)
    sizes = {n: mm.warm_up_sizes(mm.tiling(n, 32, torch.bfloat16)) for n in (64, 100)}
    runs = mm.warm_up_runs([proj, head, proj.clone()], (head,))
    got = [(w.shape[0], m, out) for w, m, out in runs]
    want = [(64, m, None) for m in sizes[64]] + [(100, m, None) for m in sizes[100]]
    want += [(100, m, torch.float32) for m in sizes[100]]
    assert got == want
    # A float32 head's logits are its plain output: nothing more to compile.
    head32 = torch.zeros(100, 32)
    assert [out for _, _, out in mm.warm_up_runs([head32], (head32,))] == [None] * len(
        mm.warm_up_sizes(mm.tiling(100, 32, torch.float32))
    )


def test_warm_up_skips_cpu_weights() -> None:
    assert mm.warm_up([torch.zeros(8, 16)]) == 0


@pytest.mark.parametrize(
    ("configs", "k", "dtype", "match"),
    [
        (
            [mm.TileConfig(64, 64, 64, 4, 3), mm.TileConfig(64, 64, 64, 4, 3, split_k=2)],
            1024,
            torch.bfloat16,
            "mix split_k",
        ),
        (
            [mm.TileConfig(64, 64, 64, 4, 3, split_k=2), mm.TileConfig(64, 64, 128, 4, 3, split_k=2)],
            1024,
            torch.bfloat16,
            "split K differently",
        ),
        (
            [mm.TileConfig(64, 64, 64, 4, 3), mm.TileConfig(64, 64, 128, 4, 3)],
            1000,
            torch.bfloat16,
            "split K differently",
        ),
        (
            [mm.TileConfig(32, 64, 64, 4, 3), mm.TileConfig(64, 64, 64, 4, 3)],
            1024,
            torch.bfloat16,
            "tensor-core",
        ),
        ([mm.TileConfig(64, 64, 32, 4, 3), mm.TileConfig(64, 64, 16, 4, 3)], 1024, torch.float32, "block_k"),
        (
            [mm.TileConfig(32, 64, 32, 2, 3, split_k=8), mm.TileConfig(64, 64, 32, 2, 3, split_k=4)],
            1024,
            torch.float32,
            "split_k",
        ),
    ],
)
def test_tilings_that_would_sum_rows_differently_are_refused(
    configs: list[mm.TileConfig], k: int, dtype: torch.dtype, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        mm.check_interchangeable(k, dtype, configs)


def test_interchangeable_tilings_pass() -> None:
    mm.check_interchangeable(
        1024, torch.bfloat16, [mm.TileConfig(64, 32, 128, 4, 3), mm.TileConfig(128, 256, 64, 8, 3, tma=True)]
    )
    mm.check_interchangeable(
        1000, torch.float32, [mm.TileConfig(32, 64, 32, 4, 3)] * 2
    )  # one tiling: always fine
    # float32 on the FMA units: row height, warps and launch change no sums
    mm.check_interchangeable(
        2048,
        torch.float32,
        [mm.TileConfig(32, 64, 32, 2, 3, split_k=16), mm.TileConfig(64, 64, 32, 2, 3, split_k=16)],
    )


def test_shipped_tilings_load_and_are_interchangeable() -> None:
    """The measured file in the package parses, and every shape's tilings share one reduction order."""
    mm.measured_configs.cache_clear()
    shipped = mm.measured_configs("NVIDIA H200")
    assert len(shipped) >= 16
    assert any(t.by_m for t in shipped.values())
    for (_, k, dtype), t in shipped.items():
        mm.check_interchangeable(k, dtype, t.configs)


@pytest.mark.parametrize("path", sorted(mm.CONFIG_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_every_shipped_tilings_file_loads_for_its_gpu(path) -> None:
    """Each shipped measured-tilings file is found under its GPU's name, and reading it (which checks
    that the tilings chosen by M give one row the same bits) succeeds with every entry."""
    gpu = json.loads(path.read_text())["gpu"]
    assert mm.config_path(gpu) == path
    mm.measured_configs.cache_clear()
    try:
        assert len(mm.measured_configs(gpu)) == len(json.loads(path.read_text())["entries"]) > 0
    finally:
        mm.measured_configs.cache_clear()


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        '{"entries": [{"n": 8, "k": 8, "dtype": "bfloat16"}]}',
        '{"entries": [{"n": 8, "k": 8, "dtype": "Tensor", "config": {}}]}',
        '{"entries": [{"n": 8, "k": 8, "dtype": "bfloat16", "config": {"block_m": 48, "block_n": 16, '
        '"block_k": 16, "num_warps": 4, "num_stages": 2}}]}',
        '{"entries": [{"n": 8, "k": 64, "dtype": "bfloat16", "config": {"block_m": 64, "block_n": 16, "block_k": 16, '
        '"num_warps": 4, "num_stages": 2}, "by_m": [{"max_m": 8, "config": {"block_m": 64, "block_n": 16, '
        '"block_k": 16, "num_warps": 4, "num_stages": 2, "split_k": 2}}]}]}',
    ],
)
def test_unreadable_measured_configs_name_the_file_and_the_fix(
    tmp_path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setattr(mm, "CONFIG_DIR", tmp_path)
    mm.measured_configs.cache_clear()
    mm.config_path("Broken GPU").write_text(text)
    try:
        with pytest.raises(ValueError, match=r"Broken_GPU\.json.*--write-configs.*delete the file"):
            mm.tile_config(8, 8, torch.bfloat16, "Broken GPU")
    finally:
        mm.measured_configs.cache_clear()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("config", ["persistent", "tma", "split_k"])
def test_float32_output_holds_the_16_bit_results_values(
    config: str, dtype: torch.dtype, device: torch.device
) -> None:
    """The LM head's float32 logits, written by the matmul: exactly `.float()` of its 16-bit result
    (rounded to the inputs' dtype first, not the float32 accumulator), bias and split-K included."""
    x, w, b = _problem(19, 40, 72, dtype, device, seed=13)
    cfg = SMALL[config]
    want = mm.linear_with_config(x, w, b, cfg).float()
    got = mm.linear_with_config(x, w, b, cfg, out_dtype=torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert torch.equal(
        mm.linear_batch_invariant(x, w, b, torch.float32), mm.linear_batch_invariant(x, w, b).float()
    )


def test_float32_output_is_the_only_other_dtype(device: torch.device) -> None:
    x, w, _ = _problem(4, 8, 16, torch.bfloat16, device, seed=7)
    with pytest.raises(ValueError, match="out_dtype"):
        mm.linear_batch_invariant(x, w, None, torch.float16)


def test_rejects_bad_inputs(device: torch.device) -> None:
    x, w, b = _problem(4, 8, 16, torch.float32, device, seed=7)
    cases = [
        ((x.half(), w, None), r"weight\.dtype"),
        ((x, w[:, :15].contiguous(), None), r"weight\.shape"),
        ((x.unsqueeze(0), w, None), r"x\.dim\(\)"),
        ((x, w.T.contiguous().T, None), r"weight: got strides"),
        ((x.T.contiguous().T, w, None), r"x: got last-dim stride"),
        ((x, w, b[:7]), r"bias\.shape"),
        ((x, w, b.half()), r"bias\.dtype"),
        ((x.int(), w, None), r"x\.dtype"),
        (([[1.0]], w, None), r"x: got list"),
    ]
    for args, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            mm.linear_batch_invariant(*args)


def test_rejects_bad_tilings() -> None:
    with pytest.raises(ValueError, match=r"TileConfig\.block_k: got 48"):
        mm.TileConfig(64, 64, 48, num_warps=4, num_stages=3)
    with pytest.raises(ValueError, match=r"TileConfig\.num_stages: got 0"):
        mm.TileConfig(64, 64, 64, num_warps=4, num_stages=0)


def test_rejects_cpu_tensors_when_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_common, "interpreting", lambda: False)
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="need CUDA tensors"):
        mm.linear_batch_invariant(x, torch.randn(4, 8))


# ---- real shapes on the GPU -------------------------------------------------------------------

QWEN3_SHAPES = {  # (N, K) of each projection
    "0.6b_qkv": (4096, 1024),
    "0.6b_gate_up": (6144, 1024),
    "0.6b_o": (1024, 2048),
    "0.6b_down": (1024, 3072),
    "0.6b_lm_head": (151936, 1024),
    "8b_qkv": (6144, 4096),
    "8b_gate_up": (24576, 4096),
    "8b_o": (4096, 4096),
    "8b_down": (4096, 12288),
    "8b_lm_head": (151936, 4096),
}
MOE16B_SHAPES = {  # attention and shared-expert projections of the moe-16b benchmark model
    "q": (3072, 2048),
    "kv_a": (576, 2048),
    "o": (2048, 2048),
    "shared_gate_up": (5632, 2048),
    "shared_down": (2048, 2816),
    "lm_head": (163840, 2048),
}
# Each compared with the same rows inside M=4096; with the shipped tilings these sizes fall in
# every range of M that has its own tiling (<= 16, <= 128, <= 1024, larger).
BATCH_SIZES = (1, 7, 64, 300)


def _gpu_problem(
    n: int, k: int, dtype: torch.dtype, bias: bool, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(4096, k, device="cuda", generator=gen).to(dtype)
    w = (torch.randn(n, k, device="cuda", generator=gen) * k**-0.5).to(dtype)
    b = torch.randn(n, device="cuda", generator=gen).to(dtype) if bias else None
    return x, w, b


def _check_invariant_and_accurate(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    monkeypatch: pytest.MonkeyPatch,
    config: mm.TileConfig | None = None,
) -> None:
    def run(a: torch.Tensor) -> torch.Tensor:
        return (
            mm.linear_batch_invariant(a, w, b) if config is None else mm.linear_with_config(a, w, b, config)
        )

    full = run(x)
    assert torch.equal(run(x), full)  # run to run
    m = x.shape[0]
    for rows in BATCH_SIZES:
        # Offsets that place the rows at the start, in the middle and across tile boundaries.
        for start in (0, 129, m - rows):
            part = run(x[start : start + rows])
            assert torch.equal(part, full[start : start + rows]), (rows, start)
    # torch's float32 matmul (no TF32) for half types; float64 for float32, whose own
    # reduction-order noise would otherwise be half the tolerance.
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    wide = torch.float64 if x.dtype == torch.float32 else torch.float32
    ref = x.to(wide) @ w.to(wide).T
    if b is not None:
        ref += b.to(wide)
    assert rel_err(full, ref) < TOL[x.dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(QWEN3_SHAPES))
def test_qwen3_shapes_bf16(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    n, k = QWEN3_SHAPES[shape]
    x, w, b = _gpu_problem(n, k, torch.bfloat16, bias=False, seed=n + k)
    _check_invariant_and_accurate(x, w, b, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(MOE16B_SHAPES))
def test_moe16b_shapes_bf16(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    n, k = MOE16B_SHAPES[shape]
    x, w, b = _gpu_problem(n, k, torch.bfloat16, bias=False, seed=n + 3 * k)
    _check_invariant_and_accurate(x, w, b, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("shape", ["0.6b_qkv", "0.6b_o"])
def test_other_dtypes_with_bias(shape: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    n, k = QWEN3_SHAPES[shape]
    x, w, b = _gpu_problem(n, k, dtype, bias=True, seed=n - k)
    _check_invariant_and_accurate(x, w, b, monkeypatch)


@pytest.mark.gpu
def test_row_strided_input_and_bias_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w, b = _gpu_problem(4096, 1024 + 64, torch.bfloat16, bias=True, seed=11)
    _check_invariant_and_accurate(x[:, :1024], w[:, :1024].contiguous(), b, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(1000, 1000), (257, 204)])  # K tails, ragged tiles, 8-byte aligned rows
def test_ragged_shapes_bf16(n: int, k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    x, w, b = _gpu_problem(n, k, torch.bfloat16, bias=True, seed=n)
    _check_invariant_and_accurate(x, w, b, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["0.6b_qkv", "0.6b_o", "8b_down"])
def test_tma_tilings_bf16(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy-engine variant (a tuning candidate) keeps the same guarantees."""
    n, k = QWEN3_SHAPES[shape]
    x, w, b = _gpu_problem(n, k, torch.bfloat16, bias=False, seed=n * 3 + k)
    for cfg in (
        mm.TileConfig(128, 128, 64, num_warps=8, num_stages=3, tma=True),
        mm.TileConfig(128, 64, 64, num_warps=8, num_stages=4, tma=True),
    ):
        _check_invariant_and_accurate(x, w, b, monkeypatch, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["0.6b_o", "8b_down"])
def test_fixed_split_k_tilings_bf16(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixed split-K (a decode tuning candidate) keeps the same guarantees at real shapes."""
    n, k = QWEN3_SHAPES[shape]
    x, w, b = _gpu_problem(n, k, torch.bfloat16, bias=True, seed=n * 5 + k)
    for cfg in (
        mm.TileConfig(64, 128, 64, num_warps=4, num_stages=4, split_k=4),
        mm.TileConfig(64, 128, 64, num_warps=4, num_stages=4, tma=True, split_k=2),
    ):
        _check_invariant_and_accurate(x, w, b, monkeypatch, cfg)


def test_mla_heads_matmul_matches_float64_and_is_row_invariant() -> None:
    """The DeepSeek MLA per-head projection on the batch-invariant kernel (run here in the interpreter)."""
    from shardinfer.kernels.ops import heads_matmul

    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 3, 16, generator=g)
    w = torch.randn(3, 16, 32, generator=g)
    got = heads_matmul(x, w, w.transpose(1, 2).contiguous(), batch_invariant=True)
    want = torch.einsum("thk,hkn->thn", x.double(), w.double())
    assert (got.double() - want).abs().max().item() < 1e-4
    alone = heads_matmul(x[5:6], w, w.transpose(1, 2).contiguous(), batch_invariant=True)
    assert torch.equal(alone[0], got[5])
