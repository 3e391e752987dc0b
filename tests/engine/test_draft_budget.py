"""The confidence schedule picks the draft depth with the most expected tokens per unit of step time."""

from __future__ import annotations

import pytest

from shardinfer.engine.draft_budget import MIN_GAIN, PRIOR, PRIOR_WEIGHT, DraftBudget


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


def test_a_fresh_budget_expects_the_prior_for_every_confidence() -> None:
    budget = DraftBudget(2, None, None, drafter="ngram")
    # Nothing verified: S_1 = 0.7, S_2 = 0.49, so p_1 = p_2 = 0.7, whatever the match length.
    for confidence in ([3.0, 3.0], [1.0, 0.0], [None, None]):
        extra = budget.expected_extra(confidence)
        assert extra == pytest.approx([0.7, 0.7 + 0.7 * 0.7])


def _trained_ngram_budget(table=None, buckets=None) -> DraftBudget:
    """Ten requests with match length 3 kept both drafts; ten with match length 1 lost the first."""
    budget = DraftBudget(2, table, buckets, drafter="ngram")
    for _ in range(10):
        budget.record(2, 2, [3.0, 3.0])
        budget.record(2, 0, [1.0, 1.0])
    return budget


def test_confidence_bins_are_calibrated_against_the_measured_rates() -> None:
    budget = _trained_ngram_budget()
    # Per position: 20 drafted, 10 accepted. S_1 = (10 + 0.7 * 8) / 28, S_2 = (10 + 0.49 * 8) / 28.
    s1, s2 = 15.6 / 28, 13.92 / 28
    rate1, rate2 = s1, s2 / s1
    assert budget.conditional_rates() == pytest.approx([rate1, rate2])
    # Match length 3: reached 10 times at each position, accepted all 10 times.
    p1_long = (10 + 8 * rate1) / (10 + 8)
    p2_long = (10 + 8 * rate2) / (10 + 8)
    assert budget.expected_extra([3.0, 3.0]) == pytest.approx([p1_long, p1_long + p1_long * p2_long])
    # Match length 1: reached 10 times at the first position and never accepted; the second
    # position was never reached, so it says what the measured rate says.
    p1_short = (0 + 8 * rate1) / (10 + 8)
    assert budget.expected_extra([1.0, 1.0]) == pytest.approx([p1_short, p1_short + p1_short * rate2])
    # No confidence: the measured survival itself.
    assert budget.expected_extra([None, None]) == pytest.approx([s1, s1 + s2])
    # A filler (match length 0) has no data of its own either.
    assert budget.expected_extra([3.0, 0.0]) == pytest.approx([p1_long, p1_long + p1_long * rate2])


def test_the_step_depth_weighs_every_requests_confidence() -> None:
    # Bucket 8: each verified row adds 40% to a step.
    table = _table({8: {1: 10.0, 2: 14.0, 3: 18.0}})
    budget = _trained_ngram_budget(table, [8])
    s1, s2 = 15.6 / 28, 13.92 / 28
    rate1, rate2 = s1, s2 / s1
    p1_long, p2_long = (10 + 8 * rate1) / 18, (10 + 8 * rate2) / 18
    p1_short = 8 * rate1 / 18
    long_extra = [p1_long, p1_long + p1_long * p2_long]
    short_extra = [p1_short, p1_short + p1_short * rate2]

    def best(extras: list[list[float]], batch: int) -> int:
        rates = [(batch + sum(e[k - 1] for e in extras if k)) / ms for k, ms in enumerate((10.0, 14.0, 18.0))]
        return rates.index(max(rates))

    confident = [[3.0, 3.0]] * 6
    doubtful = [[1.0, 1.0]] * 6
    assert best([long_extra] * 6, 8) == 2  # (8 + 6 * 1.55...) / 18 beats 8 / 10
    assert budget.depth(8, confident) == 2
    assert best([short_extra] * 6, 8) == 0
    assert budget.depth(8, doubtful) == 0
    mixed = confident[:3] + doubtful[:3]
    assert budget.depth(8, mixed) == best([long_extra] * 3 + [short_extra] * 3, 8)
    # Requests that cannot draft count one token at every depth.
    assert budget.depth(8, confident[:1]) == best([long_extra], 8) == 0


def test_learned_step_times_that_make_verification_expensive_switch_speculation_off() -> None:
    """The capture-time seeds (tiny contexts) say a draft row is nearly free at batch 256; the
    running steps say each draft row doubles the step, so one draft at acceptance 0.8 loses
    (1.8 tokens for 2.2 times the time). Each width is tried once, then speculation stays off."""
    seed = _table({256: {1: 20.0, 2: 21.0, 3: 22.0, 4: 23.0}})
    real = {1: 30.0, 2: 66.6, 3: 103.2, 4: 139.8}
    budget = DraftBudget(3, seed, [256])
    # Acceptance 0.8 per token: of 1000 requests 200 keep no draft, 160 one, 128 two, 512 all three.
    for accepted, n in ((0, 200), (1, 160), (2, 128), (3, 512)):
        for _ in range(n):
            budget.record(3, accepted)
    s = budget.survival()
    assert s == pytest.approx([805.6 / 1008, 643.92 / 1008, 514.744 / 1008])
    chosen = []
    for _ in range(8):
        k = budget.depth(256)
        chosen.append(k)
        budget.observe(1 + k, 256, real[1 + k])
    # Step 1, seeds only: (1 + s1 + s2 + s3) / 23 beats every shallower depth. Then each measured
    # width drops out: 1 + s1 + s2 over 22, 1 + s1 over 21, and finally 1 / 20 (plain, still a
    # seed) beats (1 + s1) / 66.6; measured at 30 it still does.
    assert (1 + s[0] + s[1] + s[2]) / 23 > max((1 + s[0] + s[1]) / 22, (1 + s[0]) / 21, 1 / 20)
    assert (1 + s[0]) / 66.6 < 1 / 30
    assert chosen == [3, 2, 1, 0, 0, 0, 0, 0]


def test_measured_step_times_can_also_turn_speculation_on() -> None:
    # Seeds: compute-bound at tiny contexts, a draft row costs a full step. Measured: the long
    # contexts' attention dominates and the extra row is nearly free.
    seed = _table({64: {1: 10.0, 2: 20.0}})
    budget = DraftBudget(1, seed, [64])
    assert budget.depth(64) == 0  # 1 / 10 > 1.7 / 20
    budget.observe(1, 64, 40.0)  # plain measured: now the unmeasured width-2 seed looks cheap
    assert budget.depth(64) == 1  # 1.7 / 20 > 1 / 40
    budget.observe(2, 64, 44.0)
    assert budget.depth(64) == 1  # 1.7 / 44 > 1 / 40
    assert budget.times.ms(2, 64) == 44.0 and budget.times.ms(1, 64) == 40.0
    # A batch in another bucket, or beyond every bucket, is not folded in.
    budget.observe(1, 65, 1.0)
    assert budget.times.ms(1, 64) == 40.0


def test_nobody_proposes_when_even_the_best_drafts_would_not_pay() -> None:
    budget = DraftBudget(2, _table({256: {1: 30.0, 2: 66.6, 3: 103.2}}), [256])
    # A fresh budget expects the prior 0.7 per draft at best. One draft each:
    # (256 + 256 * 0.7) / 66.6 = 6.53 tokens per ms against plain's 256 / 30 = 8.53; two:
    # (256 + 256 * (0.7 + 0.49)) / 103.2 = 5.43.
    assert budget.best_case() == pytest.approx([0.7, 0.7])
    assert not budget.worth_drafting(256, [2] * 256)
    # Were the verify row cheaper: (256 + 256 * 0.7) / 40 = 10.88 beats 8.53 by more than MIN_GAIN.
    budget.observe(2, 256, 40.0)
    assert budget.worth_drafting(256, [2] * 256)
    # Only ten requests can draft: (256 + 7) / 40 = 6.58 does not.
    assert not budget.worth_drafting(256, [2] * 10)
    # Without step times it always proposes.
    assert DraftBudget(2, None, None).worth_drafting(256, [])


def test_drafts_that_are_never_accepted_stop_the_proposals_where_certain_ones_would_pay() -> None:
    """Prompt lookup on text it cannot predict: every confidence bin's drafts are rejected. The
    verify row is cheap enough that certain drafts would pay, but the best bin's estimate no
    longer can, so the requests stop proposing (their lookups cost host time every step)."""
    budget = DraftBudget(2, _table({256: {1: 30.0, 2: 33.0, 3: 36.0}}), [256])
    assert budget.worth_drafting(256, [2] * 256)
    for n in range(2000):
        budget.record(2, 0, [float(1 + n % 4), 1.0])  # match lengths 1 to 4, none accepted
    best = budget.best_case()
    assert best[0] < 0.01
    # The best case: 256 * (1 + best[0]) / 33 tokens per ms, under 1.02 * 256 / 30.
    assert 256 * (1 + best[0]) / 33.0 < MIN_GAIN * 256 / 30.0
    assert not budget.worth_drafting(256, [2] * 256)
    assert budget.depth(256, [[4.0, 4.0]] * 256) == 0


def test_a_depth_must_beat_plain_decoding_by_the_minimum_gain() -> None:
    # One draft per request accepted half the time at 1.47 times the step: 1.5 / 1.47 = 1.0204
    # of plain's rate passes MIN_GAIN; at 1.48 times (1.0135) it does not.
    for ms, want in ((14.7, 1), (14.8, 0)):
        budget = DraftBudget(1, _table({8: {1: 10.0, 2: ms}}), [8])
        for _ in range(10_000):
            budget.record(1, 0)
            budget.record(1, 1)
        assert budget.survival()[0] == pytest.approx(0.5, abs=1e-3)
        assert budget.depth(8) == want


def test_a_wider_step_never_counts_as_cheaper_than_a_narrower_one() -> None:
    """Width 2 known only from a seed below width 1's measured time: drafts that are never
    accepted must not look like they pay (each verify row is work on top of the plain row)."""
    budget = DraftBudget(2, _table({64: {1: 9.0, 2: 6.0, 3: 12.0}}), [64])
    for _ in range(5000):  # drafts always rejected
        budget.record(2, 0)
    budget.times.observe(1, 64, 9.0)
    assert budget.depth(64) == 0
    assert not budget.worth_drafting(64, [2] * 64)
    # With drafts that are accepted, the cheap width still gets chosen: it costs plain's time.
    keen = DraftBudget(2, _table({64: {1: 9.0, 2: 6.0, 3: 12.0}}), [64])
    for _ in range(5000):
        keen.record(2, 1)
    assert keen.depth(64) == 1
