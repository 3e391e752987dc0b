"""The online calibration of draft confidences: informative confidences move the schedule,
noise falls back to the measured per-position rates."""

from __future__ import annotations

import random

import pytest

from shardinfer.engine.draft_budget import DraftBudget
from shardinfer.engine.draft_calibration import ConfidenceCalibration, match_length_bin, probability_bin

# Bucket 16: each verified row adds 30% to the step.
TABLE = {(1, 16): 10.0, (2, 16): 13.0, (3, 16): 16.0, (4, 16): 19.0}


def test_bins() -> None:
    assert [probability_bin(p) for p in (0.0, 0.05, 0.1, 0.55, 0.99, 1.0)] == [0, 0, 1, 5, 9, 9]
    assert [match_length_bin(n) for n in (0.0, 1.0, 2.0, 3.0, 4.0, 9.0)] == [0, 1, 2, 3, 4, 4]
    with pytest.raises(ValueError, match="'eagle'"):
        ConfidenceCalibration("eagle", 2)


def test_a_rejected_draft_ends_what_its_successors_count() -> None:
    cal = ConfidenceCalibration("mtp", 3)
    cal.record([0.95, 0.45, 0.25], 1)  # the first kept, the second rejected, the third never in play
    cal.record([0.95, None, 0.25], 3)  # a draft without confidence is skipped, its successors count
    assert cal.reached == [[0] * 9 + [2], [0] * 4 + [1] + [0] * 5, [0, 0, 1] + [0] * 7]
    assert cal.accepted == [[0] * 9 + [2], [0] * 10, [0, 0, 1] + [0] * 7]
    # Position 0's top decile: 2 of 2 accepted, shrunk toward a rate of 0.5 by 8 pseudo-drafts.
    assert cal.probability(0, 0.97, 0.5) == pytest.approx((2 + 8 * 0.5) / (2 + 8))


def _train(budget: DraftBudget, informative: bool, rng: random.Random, requests: int = 3000) -> None:
    """Verifications of 3 drafts each with uniformly random MTP probabilities. Informative: a draft
    is accepted with its own probability. Noise: with 0.5 whatever it says."""
    for _ in range(requests):
        confidence = [rng.random() for _ in range(3)]
        accepted = 0
        for c in confidence:
            if rng.random() >= (c if informative else 0.5):
                break
            accepted += 1
        budget.record(3, accepted, confidence)


def _expected_tokens(p: list[float], k: int) -> float:
    """1 + p_1 + p_1 p_2 + ... (k terms)."""
    total, keep = 1.0, 1.0
    for x in p[:k]:
        keep *= x
        total += keep
    return total


def _best_depth(p: list[float]) -> int:
    rates = [_expected_tokens(p, k) / TABLE[1 + k, 16] for k in range(4)]
    return rates.index(max(rates))


def test_informative_confidence_drafts_deep_for_confident_steps_and_not_for_doubtful_ones() -> None:
    budget = DraftBudget(3, TABLE, [16], drafter="mtp")
    _train(budget, True, random.Random(0))
    sure, unsure = [0.95, 0.95, 0.95], [0.15, 0.15, 0.15]
    # The calibrated estimates land near the true chances (0.95 and 0.15 lie mid-decile).
    extra = budget.expected_extra(sure)
    estimates = [extra[0], (extra[1] - extra[0]) / extra[0]]
    assert estimates == pytest.approx([0.95, 0.95], abs=0.05)
    assert budget.expected_extra(unsure)[0] == pytest.approx(0.15, abs=0.05)
    # With the true chances, a confident step verifies 3 drafts, a doubtful one none; so does the
    # schedule, while the measured rates alone (about 1/2 at each position) choose one depth for both.
    assert _best_depth([0.95] * 3) == 3 and _best_depth([0.15] * 3) == 0
    assert budget.depth(16, [sure] * 16) == 3
    assert budget.depth(16, [unsure] * 16) == 0
    blind = budget.depth(16)
    assert blind == _best_depth(budget.conditional_rates())
    assert blind not in (0, 3)


def test_noise_confidence_falls_back_to_the_measured_rates() -> None:
    budget = DraftBudget(3, TABLE, [16], drafter="mtp")
    _train(budget, False, random.Random(1))
    rates = budget.conditional_rates()
    assert rates == pytest.approx([0.5, 0.5, 0.5], abs=0.05)
    blind = budget.depth(16)
    assert blind == _best_depth(rates)
    for c in (0.05, 0.35, 0.65, 0.95):
        extra = budget.expected_extra([c] * 3)
        assert extra[0] == pytest.approx(rates[0], abs=0.06)
        assert budget.depth(16, [[c] * 3] * 16) == blind
