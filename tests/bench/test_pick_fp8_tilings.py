"""bench_fp8_matmul --write-configs' bookkeeping (no GPU): the choice per decode range, and the file
it writes, merged with an earlier one and read back by the kernel's loader."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.kernels.bench_fp8_matmul import DECODE_RANGES, pick_decode_tiling, write_configs
from shardinfer.kernels import fp8_matmul
from shardinfer.kernels.tuning import Tiling


def _cfg(block_n: int, stages: int, split_k: int = 1) -> fp8_matmul.Fp8TileConfig:
    return fp8_matmul.Fp8TileConfig(64, block_n, num_warps=4, num_stages=stages, tma=True, split_k=split_k)


def test_each_decode_range_takes_the_fastest_tiling_with_the_default_bits() -> None:
    default = Tiling(_cfg(64, 4), ((64, _cfg(64, 6)),))
    a, b, c = _cfg(16, 3), _cfg(32, 3), _cfg(128, 3)  # 64-row tiles 16, 32, 128 wide
    timed = {
        1: [(default.for_m(1), 10.0, True), (a, 6.0, True), (b, 4.0, False)],  # b is fastest but not equal
        64: [(default.for_m(64), 10.0, True), (a, 12.0, True), (b, 9.0, True)],
        256: [(default.for_m(256), 10.0, True), (c, 11.0, True)],  # the default stays
    }
    chosen = pick_decode_tiling(default, timed)
    assert [m for m, _ in chosen.by_m] == [max_m for max_m, _ in DECODE_RANGES]
    assert [chosen.for_m(m) for _, m in DECODE_RANGES] == [a, b, default.for_m(256)]
    assert chosen.rest == default.rest  # prefill sizes keep the default's tiling
    # Nothing timed, or nothing equal: the default's tiling at that size.
    assert pick_decode_tiling(default, {1: [(a, 1.0, False)]}).by_m == tuple(
        (max_m, default.for_m(m)) for max_m, m in DECODE_RANGES
    )


def test_written_file_merges_earlier_shapes_and_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fp8_matmul, "CONFIG_DIR", tmp_path)
    fp8_matmul.measured_configs.cache_clear()
    try:
        meta = {"gpu": "Some GPU", "date": "2026-01-01T00:00:00+00:00", "commit": "abc"}
        first = Tiling(_cfg(64, 4), ((16, _cfg(16, 3)),))
        write_configs({(640, 512): first, (1024, 512): first}, meta)
        second = Tiling(_cfg(64, 4, split_k=2), ((16, _cfg(32, 3, split_k=2)),))
        path = write_configs({(1024, 512): second}, meta)
        record = json.loads(path.read_text())
        assert record["gpu"] == "Some GPU" and record["commit"] == "abc"
        assert [(e["n"], e["k"]) for e in record["entries"]] == [(640, 512), (1024, 512)]
        assert fp8_matmul.measured_configs("Some GPU") == {(640, 512): first, (1024, 512): second}
        assert fp8_matmul.tile_config(1024, 512, 8, "Some GPU") == dataclasses.replace(_cfg(32, 3), split_k=2)
    finally:
        fp8_matmul.measured_configs.cache_clear()


def test_sweep_sizes_are_positive_row_counts() -> None:
    import argparse

    from bench.kernels.bench_fp8_matmul import _row_counts

    assert _row_counts("512,1024") == {512, 1024}
    for bad in ("5x", "0", "", "512,"):
        with pytest.raises(argparse.ArgumentTypeError, match="positive row counts"):
            _row_counts(bad)
