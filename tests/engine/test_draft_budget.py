"""The confidence schedule picks the draft depth with the most expected tokens per unit of step time."""

from __future__ import annotations

import pytest

from shardinfer.engine.draft_budget import PRIOR, PRIOR_WEIGHT, DraftBudget


def _table(per_width: dict[int, dict[int, float]]) -> dict[tuple[int, int], float]:
    return {(w, b): ms for b, row in per_width.items() for w, ms in row.items()}


def test_without_step_times_the_depth_stays_at_its_maximum() -> None:
    assert DraftBudget(3, None, None).depth(1) == 3
    assert DraftBudget(3, None, None).depth(500) == 3


def test_memory_bound_steps_draft_deep_and_compute_bound_steps_not_at_all() -> None:
    # Batch 1: a verify row is nearly free. Batch 64: each extra row costs its full share.
    table = _table({1: {1: 10.0, 2: 10.2, 3: 10.4, 4: 10.6}, 64: {1: 10.0, 2: 20.0, 3: 30.0, 4: 40.0}})
    budget = DraftBudget(3, table, [1, 64])
    # Prior survival: 0.7, 0.49, 0.343 -> tokens 1, 1.7, 2.19, 2.533.
    assert budget.depth(1) == 3  # 2.533 / 10.6 beats 1 / 10
    assert budget.depth(40) == 0  # bucket 64: 1/10 > 1.7/20 > 2.19/30 > 2.533/40


def test_measured_acceptance_moves_the_choice() -> None:
    # Width costs: 10, 14, 18, 22 ms; with the prior, depth 2 wins: 2.19/18 = 0.1217 > 1.7/14 = 0.1214.
    table = _table({8: {1: 10.0, 2: 14.0, 3: 18.0, 4: 22.0}})
    budget = DraftBudget(3, table, [8])
    assert budget.depth(8) == 2
    for _ in range(200):  # every first draft accepted, never a second one
        budget.record(3, 1)
    s = budget.survival()
    assert s[0] == pytest.approx((200 + PRIOR * PRIOR_WEIGHT) / (200 + PRIOR_WEIGHT))
    assert s[1] == pytest.approx(PRIOR**2 * PRIOR_WEIGHT / (200 + PRIOR_WEIGHT))
    assert budget.depth(8) == 1  # (1 + s1) / 14 > 1 / 10, and a second draft adds almost nothing
    assert budget.acceptance_by_position() == [1.0, 0.0, 0.0]


def test_a_batch_beyond_the_largest_bucket_keeps_the_maximum_depth() -> None:
    budget = DraftBudget(2, _table({8: {1: 1.0, 2: 5.0, 3: 9.0}}), [8])
    assert budget.depth(9) == 2
    assert budget.depth(8) == 0
