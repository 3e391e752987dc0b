"""Per-split reassembly: results arrive in engine completion order, parts are written in input order.

A split is complete when its reader has delivered every row (so the row count is known) and
every (row, sample) slot holds a record. Only then is it handed to the writer; an incomplete
split is never written, which is what lets an interrupted worker simply drop it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardinfer.engine.outputs import CompletionOutput, RequestOutput
from shardinfer.errors import ENGINE_ERROR
from shardinfer.pipeline.rows import PreparedRow
from shardinfer.splits import Split


@dataclass
class OutputOptions:
    """Which optional columns the output has (fixed for the whole job)."""

    top_logprobs: bool = False
    prompt_logprobs: bool = False


def base_record(row: PreparedRow, sample_index: int) -> dict[str, Any]:
    return {
        "row_id": row.row_id,
        "sample_index": sample_index,
        "seed": row.seeds[sample_index] if sample_index < len(row.seeds) else None,
        **row.passthrough,
    }


def error_record(row: PreparedRow, sample_index: int, code: str, message: str) -> dict[str, Any]:
    rec = base_record(row, sample_index)
    rec.update(
        status="error",
        error_code=code,
        error_message=message,
        prompt_tokens=len(row.prompt_ids) if row.prompt_ids is not None else None,
        completion_tokens=0,
    )
    return rec


def ok_record(
    row: PreparedRow, sample_index: int, out: RequestOutput, comp: CompletionOutput, options: OutputOptions
) -> dict[str, Any]:
    if comp.finish_reason == "error":
        return error_record(row, sample_index, ENGINE_ERROR, comp.error or "the engine failed this request")
    rec = base_record(row, sample_index)
    rec.update(
        status="ok",
        error_code=None,
        error_message=None,
        text=comp.text,
        token_ids=list(comp.token_ids),
        token_logprobs=[float(x) for x in comp.logprobs],
        finish_reason=comp.finish_reason,
        prompt_tokens=len(out.prompt_token_ids),
        completion_tokens=len(comp.token_ids),
    )
    if options.top_logprobs:
        tops = comp.top_logprobs or []
        rec["top_token_ids"] = [[t for t, _ in step] for step in tops]
        rec["top_logprobs"] = [[float(lp) for _, lp in step] for step in tops]
    if options.prompt_logprobs:
        rec["prompt_logprobs"] = list(out.prompt_logprobs) if out.prompt_logprobs is not None else None
    return rec


@dataclass
class SplitAssembly:
    """The records of one split in flight, slot per (row position, sample index)."""

    split: Split
    rows: list[PreparedRow] = field(default_factory=list)
    records: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    expected_rows: int | None = None  # set when the reader reaches the split's end
    missing: int = 0  # slots still waiting for the engine

    def add_row(self, row: PreparedRow) -> None:
        self.rows.append(row)
        self.missing += row.n

    def put(self, pos: int, sample_index: int, record: dict[str, Any]) -> None:
        key = (pos, sample_index)
        if key not in self.records:
            self.missing -= 1
        self.records[key] = record

    @property
    def split_index(self) -> int:
        return self.split.index

    @property
    def complete(self) -> bool:
        return self.expected_rows is not None and len(self.rows) == self.expected_rows and self.missing == 0

    def ordered_records(self) -> list[dict[str, Any]]:
        return [self.records[(row.pos, j)] for row in self.rows for j in range(row.n)]


def split_stats(records: list[dict[str, Any]]) -> dict[str, int]:
    """Counts stored with each commit, summed by `status` and the final summary."""
    ok = sum(1 for r in records if r["status"] == "ok")
    return {
        "records": len(records),
        "rows_ok": ok,
        "rows_error": len(records) - ok,
        "prompt_tokens": sum(r.get("prompt_tokens") or 0 for r in records if r["status"] == "ok"),
        "completion_tokens": sum(r.get("completion_tokens") or 0 for r in records),
        # Samples that ran out of room (max_tokens, or max_model_len) instead of finishing.
        "rows_cut_by_max_tokens": sum(1 for r in records if r.get("finish_reason") == "length"),
    }
