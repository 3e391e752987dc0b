"""Score and generate whole in-memory batches on one engine (the eval integration's driver).

Jobs stream rows through `score_worker.py`; an eval harness hands over every request of a task at
once and wants the answers back in order. Both schedule alike: of the spans sharing a context,
the first enters the engine alone and the others when it has finished, so they find the
context's KV in the prefix cache; everything else enters at once and the engine's scheduler
batches it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from shardinfer.engine.outputs import RequestOutput
from shardinfer.engine.sampling_params import SamplingParams
from shardinfer.pipeline.scoring import Span, SpanScore, add_span, span_score

_batches = itertools.count()


def score_spans(
    engine: Any, spans: Sequence[Span], on_done: Callable[[int], None] = lambda n: None
) -> list[SpanScore]:
    """Scores of `spans`, in order; `on_done(k)` reports k more finished (for a progress bar)."""
    prefix = f"score{next(_batches)}"
    leaders: dict[tuple[int, ...], int] = {}
    followers: dict[int, list[int]] = {}
    for i, span in enumerate(spans):
        leader = leaders.setdefault(tuple(span.context_ids), i)
        if leader == i:
            followers[i] = []
        else:
            followers[leader].append(i)
    for i in followers:
        add_span(engine, f"{prefix}-{i}", spans[i])
    results: list[SpanScore | None] = [None] * len(spans)
    for out in _drain(engine, len(spans)):
        i = int(out.request_id.rsplit("-", 1)[1])
        for j in followers.pop(i, []):
            add_span(engine, f"{prefix}-{j}", spans[j])
        _check(out)
        results[i] = span_score(out, spans[i])
        on_done(1)
    return [r for r in results if r is not None]


def generate_ids(
    engine: Any,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
    on_done: Callable[[int], None] = lambda n: None,
) -> list[RequestOutput]:
    """Finished outputs of one request per (prompt ids, params), in order."""
    prefix = f"gen{next(_batches)}"
    for i, (ids, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"{prefix}-{i}", ids, p)
    results: list[RequestOutput | None] = [None] * len(prompts)
    for out in _drain(engine, len(prompts)):
        _check(out)
        results[int(out.request_id.rsplit("-", 1)[1])] = out
        on_done(1)
    return [r for r in results if r is not None]


def _drain(engine: Any, expected: int) -> Any:
    seen = 0
    while engine.has_unfinished():
        for out in engine.step():
            seen += 1
            yield out
    if seen != expected:
        raise RuntimeError(f"the engine finished {seen} of {expected} requests; the others were lost")


def _check(out: RequestOutput) -> None:
    comp = out.outputs[0]
    if comp.finish_reason == "error":
        raise RuntimeError(f"the engine failed request {out.request_id}: {comp.error}")
