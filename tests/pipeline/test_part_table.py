"""The part table built from arrays holds exactly what Arrow makes of one plain dict per record."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa

from shardinfer.engine.outputs import CompletionOutput, RequestOutput
from shardinfer.pipeline.assembly import Failed, OutputOptions, engine_result
from shardinfer.pipeline.part_table import build_part_table
from shardinfer.pipeline.rows import PreparedRow
from shardinfer.writers.schema import output_schema


def _output(rng: random.Random, k: int, finish: str = "length") -> RequestOutput:
    n = rng.randint(0, 7)
    ids = [rng.randrange(150000) for _ in range(n)]
    lps = [-rng.random() * 9 for _ in range(n)]  # doubles: the column rounds them to float32
    tops = [[(rng.randrange(150000), -rng.random()) for _ in range(k)] for _ in range(n)] if k else None
    prompt = [rng.randrange(100) for _ in range(rng.randint(1, 5))]
    comp = CompletionOutput(
        0, f"text {n}", ids, lps, tops, finish, error="boom" if finish == "error" else None
    )
    return RequestOutput("r", None, prompt, [None] + [-rng.random() for _ in prompt[1:]], [comp])


def _reference_record(
    row: PreparedRow, j: int, out: RequestOutput | None, failure: Failed | None
) -> dict[str, Any]:
    """The record as a plain dict, the way the output columns are documented (docs/jobs.md)."""
    rec: dict[str, Any] = {"row_id": row.row_id, "sample_index": j, "seed": row.seeds[j], **row.passthrough}
    if out is None or out.outputs[0].finish_reason == "error":
        code, message = ("engine_error", "boom") if failure is None else (failure.code, failure.message)
        rec.update(
            status="error",
            error_code=code,
            error_message=message,
            completion_tokens=0,
            prompt_tokens=len(row.prompt_ids) if row.prompt_ids is not None else None,
        )
        return rec
    comp = out.outputs[0]
    rec.update(
        status="ok",
        text=comp.text,
        token_ids=comp.token_ids,
        token_logprobs=comp.logprobs,
        finish_reason=comp.finish_reason,
        prompt_tokens=len(out.prompt_token_ids),
        completion_tokens=len(comp.token_ids),
        prompt_logprobs=out.prompt_logprobs if j == 0 else None,  # once per row, on its first sample
    )
    if comp.top_logprobs is not None:
        rec["top_token_ids"] = [[t for t, _ in step] for step in comp.top_logprobs]
        rec["top_logprobs"] = [[lp for _, lp in step] for step in comp.top_logprobs]
    return rec


def test_columns_equal_arrow_of_plain_records() -> None:
    rng = random.Random(3)
    passthrough = pa.schema(
        [pa.field("topic", pa.string()), pa.field("meta", pa.struct([("a", pa.int64())]))]
    )
    for k in (0, 2):
        options = OutputOptions(top_logprobs=k > 0, prompt_logprobs=True)
        schema = output_schema(passthrough, options.top_logprobs, options.prompt_logprobs)
        entries: list[Any] = []
        expected = []
        for pos in range(40):
            row = PreparedRow(
                0,
                pos,
                f"id{pos}",
                2,
                [rng.randrange(2**63), 7],
                {"topic": f"t{pos}", "meta": {"a": pos}},
                prompt_ids=[1, 2, 3] if pos % 5 else None,
            )
            for j in range(2):
                kind = rng.choice(["ok", "ok", "ok", "engine_error", "row_error"])
                if kind == "row_error":
                    failure = Failed("prompt_too_long", f"row {pos} is too long")
                    entries.append((row, j, failure))
                    expected.append(_reference_record(row, j, None, failure))
                    continue
                out = _output(rng, k, "error" if kind == "engine_error" else rng.choice(["stop", "length"]))
                entries.append((row, j, engine_result(out)))
                expected.append(_reference_record(row, j, out, None))
        table, stats = build_part_table(entries, schema, options)
        reference = pa.Table.from_pylist(expected, schema=schema)
        assert table.schema.equals(schema, check_metadata=True)
        assert table.equals(reference), k
        ok = [r for r in expected if r["status"] == "ok"]
        assert stats == {
            "records": len(expected),
            "rows_ok": len(ok),
            "rows_error": len(expected) - len(ok),
            "prompt_tokens": sum(r["prompt_tokens"] for r in ok),
            "completion_tokens": sum(r["completion_tokens"] for r in expected),
            "rows_cut_by_max_tokens": sum(1 for r in ok if r["finish_reason"] == "length"),
            "rows_empty_text": sum(1 for r in ok if r["text"] == ""),
        }


def test_empty_split_and_all_errors() -> None:
    schema = output_schema(None, True, False)
    table, stats = build_part_table([], schema, OutputOptions(top_logprobs=True))
    assert table.num_rows == 0 and table.schema.equals(schema) and stats["records"] == 0
    row = PreparedRow(0, 0, "x", 1, [None], {}, prompt_ids=None)
    table, stats = build_part_table([(row, 0, Failed("empty_prompt", "null"))], schema, OutputOptions(True))
    assert table.to_pylist() == [
        {
            "row_id": "x",
            "sample_index": 0,
            "status": "error",
            "error_code": "empty_prompt",
            "error_message": "null",
            "text": None,
            "token_ids": None,
            "token_logprobs": None,
            "finish_reason": None,
            "prompt_tokens": None,
            "completion_tokens": 0,
            "seed": None,
            "top_token_ids": None,
            "top_logprobs": None,
        }
    ]
    assert stats == {
        "records": 1,
        "rows_ok": 0,
        "rows_error": 1,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "rows_cut_by_max_tokens": 0,
        "rows_empty_text": 0,
    }
