"""moe_lb per step and layer (ranks.StepBalance), against sums worked by hand."""

from __future__ import annotations

import pytest

from shardinfer.engine.parallel.ranks import StepBalance


def test_imbalance_within_a_step_counts_even_when_the_run_evens_out() -> None:
    balance = StepBalance(window=1)
    # Step 1: rank 0 busy in layer 0, rank 1 in layer 1. Each rank computed 4 rows, but at each
    # layer's exchange one rank waited for 3 rows of the other: peaks 3 + 3 over means 2 + 2.
    balance.add([[3, 1], [1, 3]])
    assert balance.run() == pytest.approx(6 / 4) and balance.window() == pytest.approx(6 / 4)
    balance.add([[2, 2], [2, 2]])  # step 2: balanced, peaks 4 over means 4
    assert balance.run() == pytest.approx(10 / 8)
    assert balance.window() == pytest.approx(1.0)  # the window holds step 2 only


def test_no_rows_is_balanced_and_ranks_without_moe_rows_are_skipped() -> None:
    balance = StepBalance()
    assert balance.run() == 1.0 and balance.window() == 1.0
    balance.add([[], []])  # a step whose forward ran no MoE layer
    balance.add([[0, 0], [0, 0]])
    assert balance.run() == 1.0
