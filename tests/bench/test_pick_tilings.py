"""bench_matmul's choice of tilings from sweep records (pure bookkeeping, no GPU)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest
import torch

from bench.kernels.bench_matmul import pick_tilings, with_range
from shardinfer.kernels import matmul as mm

N, K = 4096, 4096
CUBLAS = {1: 10.0, 64: 10.0, 256: 20.0, 4096: 200.0}


# Built when called, not at import: the kernel tests re-import kernels/matmul.py (to switch on
# Triton's interpreter), and a TileConfig of the old class never equals one of the new.
def _small() -> mm.TileConfig:
    return mm.TileConfig(64, 32, 64, num_warps=4, num_stages=5)


def _mid() -> mm.TileConfig:
    return mm.TileConfig(128, 128, 64, num_warps=8, num_stages=4, tma=True)


def _big() -> mm.TileConfig:
    return mm.TileConfig(128, 256, 64, num_warps=8, num_stages=3, tma=True)


def _rec(name: str, cfg: mm.TileConfig, us: dict[int, float], invariant: bool = True) -> dict[str, Any]:
    return {
        "N": N,
        "K": K,
        "config": name,
        "invariant": invariant,
        "us": {str(m): v for m, v in us.items()},
        **asdict(cfg),
    }


def _records() -> list[dict[str, Any]]:
    return [
        _rec("small", _small(), {1: 12.0, 64: 11.0, 256: 40.0, 4096: 700.0}),
        _rec("mid", _mid(), {1: 20.0, 64: 18.0, 256: 22.0, 4096: 260.0}),
        _rec("big", _big(), {1: 30.0, 64: 30.0, 256: 35.0, 4096: 190.0}),
        # Fastest at M=256 on its own, but its family (split 2) has nothing fast at 4096.
        _rec(
            "split",
            mm.TileConfig(128, 128, 64, num_warps=8, num_stages=4, tma=True, split_k=2),
            {1: 11.0, 64: 11.0, 256: 21.0, 4096: 400.0},
        ),
        # Never chosen: not bitwise row invariant in the sweep.
        _rec(
            "broken",
            mm.TileConfig(64, 64, 64, num_warps=4, num_stages=4),
            {m: 1.0 for m in CUBLAS},
            invariant=False,
        ),
    ]


def test_each_range_of_m_gets_its_familys_fastest_tiling() -> None:
    score, tiling, names = pick_tilings(_records(), {(N, K): CUBLAS})[(N, K)]
    # The unsplit family wins (its per-M best beats split-2 where the time goes); within it the
    # M=1 winner serves M <= 16, the M=64 one M <= 128, the M=256 one M <= 1024, the M=4096 one the rest.
    small, mid, big = _small(), _mid(), _big()
    assert tiling == mm.Tiling(big, ((16, small), (128, small), (1024, mid)))
    assert names == ["M<=16:small", "M<=128:small", "M<=1024:mid", "rest:big"]
    assert [tiling.for_m(m) for m in (1, 100, 256, 5000)] == [small, small, mid, big]
    mm.check_interchangeable(K, torch.bfloat16, tiling.configs)
    assert score == pytest.approx(
        (12 / 10) ** 0.05 * (11 / 10) ** 0.15 * (22 / 20) ** 0.5 * (190 / 200) ** 0.3
    )


def test_one_tiling_mode_picks_a_single_config_for_every_m() -> None:
    _, tiling, _ = pick_tilings(_records(), {(N, K): CUBLAS}, buckets=False)[(N, K)]
    assert tiling.by_m == () and tiling.rest == _mid()  # the best weighted score of a single tiling


def test_ranges_that_would_repeat_the_large_m_tiling_are_dropped() -> None:
    recs = [_rec("big", _big(), {1: 5.0, 64: 5.0, 256: 5.0, 4096: 5.0}), *_records()[:2]]
    _, tiling, _ = pick_tilings(recs, {(N, K): CUBLAS})[(N, K)]
    assert tiling == mm.Tiling(_big())


def test_decode_ranges_only_keeps_the_single_tiling_for_prefill() -> None:
    _, tiling, names = pick_tilings(_records(), {(N, K): CUBLAS}, decode_ranges_only=True)[(N, K)]
    # The best single tiling (mid) serves M > 256; its family's winners serve decode batches.
    assert tiling == mm.Tiling(_mid(), ((16, _small()), (128, _small())))
    assert names == ["M<=16:small", "M<=128:small", "M<=256:mid", "rest:mid"]


def _configs() -> tuple[mm.TileConfig, mm.TileConfig, mm.TileConfig]:
    """Three distinct tilings, built when a test runs (another test may have reloaded the matmul
    module, and a dataclass equals only instances of its own class)."""
    return (
        mm.TileConfig(64, 128, 64, num_warps=4, num_stages=4, tma=True),
        mm.TileConfig(64, 64, 128, num_warps=4, num_stages=3),
        mm.TileConfig(128, 128, 64, num_warps=8, num_stages=4),
    )


def test_a_new_range_splits_the_range_that_held_its_sizes() -> None:
    a, b, c = _configs()
    new = mm.TileConfig(64, 256, 64, num_warps=4, num_stages=3)
    t = with_range(mm.Tiling(c, ((16, a), (128, b))), 32, new)
    assert [m for m, _ in t.by_m] == [16, 32, 128] and t.by_m[0][1] == a and t.by_m[2][1] == b
    assert t.for_m(17) == t.for_m(32) == new
    assert t.for_m(33) == b and t.rest == c


def test_a_new_range_with_its_neighbours_tiling_is_folded_into_it() -> None:
    a, b, c = _configs()
    # The range below uses the new range's tiling: one range up to 32.
    assert with_range(mm.Tiling(c, ((16, a), (128, b))), 32, a).by_m == ((32, a), (128, b))
    # The range above does: the new one is not kept.
    assert with_range(mm.Tiling(c, ((16, a), (128, b))), 32, b).by_m == ((16, a), (128, b))
    # The largest range uses the large-M tiling: dropped, as the sweep's picks drop it.
    assert with_range(mm.Tiling(c, ((16, a),)), 32, c).by_m == ((16, a),)
    # A range already ending at m is replaced.
    assert with_range(mm.Tiling(c, ((16, a), (32, b), (128, a))), 32, c).by_m == ((16, a), (32, c), (128, a))
