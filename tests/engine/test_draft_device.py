"""The device-side acceptance count (draft_device.count_accepted) against the rule spelled out
in Python: request i's draft j is accepted while every sampled token before it equals its draft."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import torch

from shardinfer.engine.draft_device import count_accepted
from shardinfer.engine.model_runner import StepLogits
from shardinfer.engine.sampler import DeviceSample
from shardinfer.engine.scheduler import ScheduledBatch


def _step(
    new_tokens: list[int], counts: list[int], input_ids: list[int]
) -> tuple[StepLogits, ScheduledBatch]:
    """A step whose requests compute new_tokens[i] rows each; the first len(counts) of them sample."""
    reqs: list[Any] = [SimpleNamespace(name=f"r{i}") for i in range(len(new_tokens))]
    batch = ScheduledBatch(reqs, list(new_tokens))
    step = StepLogits(
        reqs[: len(counts)],
        torch.zeros(sum(counts), 4),
        list(counts),
        {},
        torch.tensor(input_ids, dtype=torch.int64),
    )
    return step, batch


def _reference(
    new_tokens: list[int], counts: list[int], input_ids: list[int], sampled: list[int]
) -> list[int]:
    accepted, row, end = [], 0, 0
    ends = []
    for n in new_tokens:
        end += n
        ends.append(end)
    for i, c in enumerate(counts):
        start = ends[i] - c  # the input row the request's first sampling row scores
        a = 0
        while a < c - 1 and sampled[row + a] == input_ids[start + 1 + a]:
            a += 1
        accepted.append(a)
        row += c
    return accepted


def _check(new_tokens: list[int], counts: list[int], input_ids: list[int], sampled: list[int]) -> None:
    step, batch = _step(new_tokens, counts, input_ids)
    dev = DeviceSample(
        torch.tensor(sampled, dtype=torch.int64), torch.zeros(len(sampled)), None, [0] * len(sampled)
    )
    count_accepted(step, batch, dev)
    want = _reference(new_tokens, counts, input_ids, sampled)
    assert dev.accepted is not None and dev.last_rows is not None and dev.shifts is not None
    assert dev.accepted.tolist() == want
    firsts = [sum(counts[:i]) for i in range(len(counts))]
    assert dev.last_rows.tolist() == [f + a for f, a in zip(firsts, want, strict=True)]
    assert dev.shifts.tolist() == [c - 1 - a for c, a in zip(counts, want, strict=True)]


def test_count_accepted_by_hand() -> None:
    # Request 0: one row (no drafts). Request 1: drafts 7, 8 at input rows 2, 3; sampled 7, 9, 5:
    # the first draft is accepted, the second is not. Request 2: draft 4 (row 5), sampled 4, 6.
    _check([1, 3, 2], [1, 3, 2], [10, 11, 7, 8, 12, 4], [3, 7, 9, 5, 4, 6])
    # Uniform widths: every draft right, then none.
    _check([2, 2], [2, 2], [1, 5, 2, 6], [5, 0, 6, 0])
    _check([2, 2], [2, 2], [1, 5, 2, 6], [4, 0, 7, 0])


def test_count_accepted_matches_the_rule_on_random_steps() -> None:
    rng = random.Random(7)
    for _ in range(300):
        b = rng.randint(1, 6)
        counts = [rng.randint(1, 4) for _ in range(b)]
        # A request computes at least its sampling rows; a prompt chunk may come before them.
        new_tokens = [c + (rng.randint(0, 3) if rng.random() < 0.2 else 0) for c in counts]
        new_tokens += [rng.randint(1, 3) for _ in range(rng.randint(0, 2))]  # requests that do not sample
        input_ids = [rng.randint(0, 3) for _ in range(sum(new_tokens))]
        sampled = [rng.randint(0, 3) for _ in range(sum(counts))]
        _check(new_tokens, counts, input_ids, sampled)


def test_count_accepted_on_steps_of_one_width() -> None:
    """Every request computing and sampling the same number of rows (a verify graph's step) takes
    the path that needs no index from the host."""
    rng = random.Random(9)
    for _ in range(200):
        b, w = rng.randint(1, 8), rng.randint(2, 4)
        counts = [w] * b
        input_ids = [rng.randint(0, 2) for _ in range(b * w)]
        sampled = [rng.randint(0, 2) for _ in range(b * w)]
        _check(counts, counts, input_ids, sampled)
