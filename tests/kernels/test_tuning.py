"""Sharing one tile-selection mechanism (kernels/tuning.py) changed no problem's tiling.

tuning_choices.json was written by tests/kernels/tuning_choices.py from the selection code as it
was before matmul, MoE and the per-head matmul shared kernels/tuning.py (each family chose its
tilings on its own then). This test runs the same grid through today's code: every matmul
(N, K, dtype, GPU model, M), MoE (hidden, intermediate, dtype, compute capability, rows per
expert) and per-head matmul (H, K, N, dtype) problem must get the very same tiling. When the
measured tilings change on purpose (a new range of M from bench/kernels/bench_matmul.py), the
fixture is written again and its diff shows exactly which problems moved.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.kernels.tuning_choices import choices


def test_every_problem_keeps_the_tiling_it_had() -> None:
    want = json.loads(Path(__file__).with_name("tuning_choices.json").read_text())
    got = json.loads(json.dumps(choices()))  # the same JSON types as the fixture (tuples -> lists)
    for family in ("matmul", "moe", "heads_matmul"):
        assert len(got[family]) == len(want[family]), family
        for mine, theirs in zip(got[family], want[family], strict=True):
            # The problem, then its tiling, spelled out (indices into each run's own config list).
            assert mine[:-1] == theirs[:-1], family
            assert got["configs"][mine[-1]] == want["configs"][theirs[-1]], (family, mine[:-1])
