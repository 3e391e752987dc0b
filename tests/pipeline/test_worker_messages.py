"""A worker process's result crosses to its parent as one JSON line and comes back equal."""

from __future__ import annotations

import json

from shardinfer.pipeline.runner import WORKER_DONE, WorkerResult


def test_worker_result_round_trips_through_a_json_line() -> None:
    result = WorkerResult(committed=[0, 3], lost=[2], skipped=[1], engine_stats={"prompt_tokens": 12.0})
    line = json.dumps(result.to_event())
    event = json.loads(line)
    assert event["event"] == WORKER_DONE == "worker_done"
    assert WorkerResult.from_event(event) == result
