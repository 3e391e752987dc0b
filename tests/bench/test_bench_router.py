"""bench_router's candidate tilings keep the shipped split of K (no GPU): the bench reports each
one's bits against the shipped tiling's, which only a tiling summing K over the same ranges can
match, so a candidate with other ranges would be a wasted measurement."""

from __future__ import annotations

import pytest
import torch

from bench.kernels.bench_router import ROUTERS, candidates
from shardinfer.kernels import matmul as mm


def _range_starts(k: int, cfg: mm.TileConfig) -> list[int]:
    """Where each of the split's K ranges starts (matmul._split_range: whole BLOCK_K steps, split
    evenly by step count)."""
    steps = -(-k // cfg.block_k)
    per_split = -(-steps // cfg.split_k)
    return [min(s * per_split, steps) * cfg.block_k for s in range(cfg.split_k)]


@pytest.mark.parametrize("name, n, k", ROUTERS, ids=[r[0] for r in ROUTERS])
def test_every_candidate_sums_k_over_the_shipped_ranges(name: str, n: int, k: int) -> None:
    shipped = mm.tile_config(n, k, torch.float32, None, 1)
    assert shipped.split_k > 1  # a router's long K is split (kernels/matmul.py)
    cands = candidates(shipped)
    assert cands["shipped"] == shipped and len(cands) > 1
    for label, cfg in cands.items():
        assert _range_starts(k, cfg) == _range_starts(k, shipped), label
