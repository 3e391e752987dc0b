"""Measured FP8 tilings (kernels/fp8_matmul_configs/<gpu>.json): read per GPU model, chosen by
batch size, refused with the file and the fix named when unreadable or when its tilings of one
problem would sum a row differently (on a GPU, the file's bits: test_kernel_matmul_measured.py)."""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fp8_problems import linear_problem

from shardinfer.kernels import fp8_matmul
from shardinfer.kernels._common import interpreting

if interpreting():
    fp8_matmul = importlib.reload(fp8_matmul)  # decorate the kernels for the interpreter (test_kernel_fp8.py)

N, K = 640, 512


# Warpgroup-MMA tiles (block_m >= 64, 4 warps), as tilings by batch size must be; candidates of
# bench_fp8_matmul.py, which gave the default's bits on an H100.
def _small() -> fp8_matmul.Fp8TileConfig:
    return fp8_matmul.Fp8TileConfig(64, 64, num_warps=4, num_stages=5, persistent=False)


def _mid() -> fp8_matmul.Fp8TileConfig:
    return fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=6, persistent=False, tma=True)


def _rest() -> fp8_matmul.Fp8TileConfig:
    return fp8_matmul.Fp8TileConfig(64, 128, num_warps=4, num_stages=4, persistent=False, tma=True)


def _entry(rest: fp8_matmul.Fp8TileConfig, *by_m: tuple[int, fp8_matmul.Fp8TileConfig]) -> dict[str, Any]:
    return {
        "n": N,
        "k": K,
        "config": dataclasses.asdict(rest),
        "by_m": [{"max_m": m, "config": dataclasses.asdict(c)} for m, c in by_m],
    }


@pytest.fixture
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(fp8_matmul, "CONFIG_DIR", tmp_path)
    fp8_matmul.measured_configs.cache_clear()
    yield tmp_path
    fp8_matmul.measured_configs.cache_clear()


def test_measured_fp8_tilings_are_read_per_gpu_model_and_chosen_by_m(config_dir: Path) -> None:
    path = fp8_matmul.config_path("Some GPU 80GB")
    assert path == config_dir / "Some_GPU_80GB.json"
    path.write_text(json.dumps({"entries": [_entry(_rest(), (16, _small()), (128, _mid()))]}))
    got = {m: fp8_matmul.tile_config(N, K, m, "Some GPU 80GB") for m in (1, 16, 17, 128, 129, 8192)}
    assert got == {1: _small(), 16: _small(), 17: _mid(), 128: _mid(), 129: _rest(), 8192: _rest()}
    assert fp8_matmul.tile_config(N, K, None, "Some GPU 80GB") == _rest()
    # Another GPU model, another shape, or no GPU: the defaults.
    default = fp8_matmul.tiling(N, K)
    assert default.for_m(1) != _small()
    assert fp8_matmul.tiling(N, K, "Another GPU") == default
    assert fp8_matmul.tiling(K, N, "Some GPU 80GB") == fp8_matmul.tiling(K, N)


def test_linear_fp8_runs_the_tiling_measured_for_its_device(
    config_dir: Path, monkeypatch: pytest.MonkeyPatch, device: torch.device
) -> None:
    """The GEMM asks for its device's GPU model; the rows are the default tiling's bits."""
    fp8_matmul.config_path("Some GPU").write_text(json.dumps({"entries": [_entry(_rest(), (16, _small()))]}))
    monkeypatch.setattr(fp8_matmul, "gpu_name", lambda d: "Some GPU")
    ran: list[fp8_matmul.Fp8TileConfig] = []
    quantized = fp8_matmul.linear_fp8_quantized

    def recording(*args: Any) -> torch.Tensor:
        ran.append(args[-1])
        return quantized(*args)

    monkeypatch.setattr(fp8_matmul, "linear_fp8_quantized", recording)
    x, wq, ws, _ = (t.to(device) for t in linear_problem(4, N, K, torch.bfloat16, seed=3))
    got = fp8_matmul.linear_fp8(x, wq, ws)
    assert ran == [_small()]
    assert torch.equal(got, fp8_matmul.linear_fp8(x, wq, ws, config=fp8_matmul.tile_config(N, K, 4)))


@pytest.mark.parametrize(
    "entry, why",
    [
        ("{not json", "JSONDecodeError"),
        ('{"entries": [{"n": 640, "k": 512}]}', "KeyError"),
        ('{"entries": [{"n": 640, "k": 512, "config": {"block_m": 64}}]}', "TypeError"),
        (
            '{"entries": [{"n": 640, "k": 512, "config": {"block_m": 64, "block_n": 256, "num_warps": 4, '
            '"num_stages": 4}}]}',
            "block_n",
        ),
    ],
)
def test_an_unreadable_fp8_tilings_file_names_itself_and_the_fix(
    config_dir: Path, entry: str, why: str
) -> None:
    fp8_matmul.config_path("Broken GPU").write_text(entry)
    with pytest.raises(
        ValueError, match=rf"Broken_GPU\.json.*{why}.*bench_fp8_matmul\.py --write-configs.*delete"
    ):
        fp8_matmul.tile_config(N, K, 8, "Broken GPU")


def test_a_file_whose_tilings_of_one_problem_mix_split_k_is_refused(config_dir: Path) -> None:
    split = dataclasses.replace(_small(), split_k=2)
    fp8_matmul.config_path("Mixed GPU").write_text(json.dumps({"entries": [_entry(_rest(), (16, split))]}))
    with pytest.raises(ValueError, match=r"Mixed_GPU\.json.*mix split_k \[1, 2\]"):
        fp8_matmul.tiling(N, K, "Mixed GPU")


def test_a_file_switching_to_a_narrow_tile_by_m_is_refused(config_dir: Path) -> None:
    """A 16-row tile takes another MMA instruction than the 64-row ones (other bits on an H100)."""
    narrow = fp8_matmul.Fp8TileConfig(16, 32, num_warps=4, num_stages=2, persistent=False)
    fp8_matmul.config_path("Narrow GPU").write_text(json.dumps({"entries": [_entry(_rest(), (16, narrow))]}))
    with pytest.raises(ValueError, match=r"Narrow_GPU\.json.*block_m >= 64 and >= 4 warps"):
        fp8_matmul.tiling(N, K, "Narrow GPU")
    fp8_matmul.measured_configs.cache_clear()
    fp8_matmul.config_path("Narrow GPU").write_text(json.dumps({"entries": [_entry(narrow)]}))
    assert fp8_matmul.tile_config(N, K, 1, "Narrow GPU") == narrow  # one tiling for every size is fine


def test_by_m_out_of_order_is_refused(config_dir: Path) -> None:
    fp8_matmul.config_path("Odd GPU").write_text(
        json.dumps({"entries": [_entry(_rest(), (128, _mid()), (16, _small()))]})
    )
    with pytest.raises(ValueError, match=r"Odd_GPU\.json.*increasing max_m"):
        fp8_matmul.tiling(N, K, "Odd GPU")


@pytest.mark.parametrize("path", sorted(fp8_matmul.CONFIG_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_every_shipped_fp8_tilings_file_loads_and_keeps_the_default_sums(path: Path) -> None:
    """A shipped file is found under its GPU's name, reads whole, and every problem keeps the
    default's split_k (its writer's rule: the file changes speed, never a row's sum)."""
    gpu = json.loads(path.read_text())["gpu"]
    assert fp8_matmul.config_path(gpu) == path
    fp8_matmul.measured_configs.cache_clear()
    try:
        table = fp8_matmul.measured_configs(gpu)
        assert len(table) == len(json.loads(path.read_text())["entries"]) > 0
        for (n, k), tiling in table.items():
            assert {c.split_k for c in tiling.configs} == {fp8_matmul.tile_config(n, k).split_k}, (n, k)
    finally:
        fp8_matmul.measured_configs.cache_clear()
