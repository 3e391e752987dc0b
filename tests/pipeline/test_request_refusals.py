"""A request the engine refuses becomes an error record whose code comes from the error's class,
never from its message."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa

from shardinfer.engine.sampling_params import SamplingParams
from shardinfer.errors import GrammarError, PromptTooLong
from shardinfer.pipeline.assembly import OutputOptions, SplitAssembly
from shardinfer.pipeline.part_table import build_part_table
from shardinfer.pipeline.rows import PreparedRow
from shardinfer.pipeline.runner import SplitWorker, WorkerSettings
from shardinfer.writers.schema import output_schema


class RefusingEngine:
    """An engine whose add_request raises a given error."""

    def __init__(self, error: ValueError) -> None:
        self.error = error

    def add_request(self, request_id: str, prompt: Any, params: SamplingParams) -> None:
        raise self.error


def _record_for(error: ValueError) -> dict[str, Any]:
    worker = SplitWorker(
        engine=RefusingEngine(error),
        preparer=None,  # type: ignore[arg-type]
        store=None,
        input_spec=None,
        schema=pa.schema([]),
        metadata={},
        options=OutputOptions(),
        settings=WorkerSettings(),
        stop=threading.Event(),
    )
    row = PreparedRow(0, 0, "r0", 1, [7], {}, prompt_ids=[1, 2], params=[SamplingParams(seed=7)])
    assembly = SplitAssembly(split=None)
    inflight: dict[str, Any] = {}
    worker._admit(row, assembly, inflight)
    assert not inflight and assembly.missing == 0
    table, _ = build_part_table(assembly.ordered(), output_schema(), OutputOptions())
    return dict(table.to_pylist()[0])


def test_the_code_comes_from_the_class() -> None:
    record = _record_for(PromptTooLong("the engine says no"))
    assert (record["status"], record["error_code"]) == ("error", "prompt_too_long")
    assert record["error_message"] == "the engine says no"
    assert _record_for(GrammarError("bad grammar"))["error_code"] == "invalid_schema"


def test_a_plain_value_error_is_an_invalid_request_whatever_it_says() -> None:
    record = _record_for(ValueError("prompt too long for max_model_len"))
    assert record["error_code"] == "invalid_request"
