"""Per-split reassembly: results arrive in engine completion order, parts are written in input order.

A split is complete when its reader has delivered every row (so the row count is known) and
every (row, sample) slot holds a result. Only then is it handed to the writer; an incomplete
split is never written, which is what lets an interrupted worker simply drop it.

The engine thread only files results here: a slot holds the engine's completion as it came
(`Finished`) or the reason the row failed (`Failed`). Turning them into columns, which touches
every token, happens on the writer thread (pipeline/part_table.py), so the engine thread spends
no time per token on output.
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


@dataclass(slots=True)
class Finished:
    """One sample the engine finished: its completion, the prompt's length and prompt logprobs."""

    completion: CompletionOutput
    prompt_tokens: int
    prompt_logprobs: list[float | None] | None

    @classmethod
    def of(cls, out: RequestOutput) -> Finished:
        # Only the prompt's length is kept, not its ids: a split's slots wait for its slowest row.
        return cls(out.outputs[0], len(out.prompt_token_ids), out.prompt_logprobs)


@dataclass(slots=True)
class Failed:
    """One sample that produced no completion: the row's error code and message."""

    code: str
    message: str


Result = Finished | Failed
# What a slot holds: a result, or a ready-made output record (score jobs file those: score_worker.py).
Slot = Result | dict[str, Any]


def engine_result(out: RequestOutput) -> Result:
    """The slot value of a finished request: an engine failure of the request becomes an error record."""
    comp = out.outputs[0]
    if comp.finish_reason == "error":
        return Failed(ENGINE_ERROR, comp.error or "the engine failed this request")
    return Finished.of(out)


@dataclass
class SplitAssembly:
    """The results of one split in flight, slot per (row position, sample index)."""

    split: Split
    rows: list[PreparedRow] = field(default_factory=list)
    results: dict[tuple[int, int], Slot] = field(default_factory=dict)
    expected_rows: int | None = None  # set when the reader reaches the split's end
    missing: int = 0  # slots still waiting for the engine

    def add_row(self, row: PreparedRow) -> None:
        self.rows.append(row)
        self.missing += row.n

    def put(self, pos: int, sample_index: int, result: Slot) -> None:
        key = (pos, sample_index)
        if key not in self.results:
            self.missing -= 1
        self.results[key] = result

    @property
    def split_index(self) -> int:
        return self.split.index

    @property
    def complete(self) -> bool:
        return self.expected_rows is not None and len(self.rows) == self.expected_rows and self.missing == 0

    def ordered(self) -> list[tuple[PreparedRow, int, Slot]]:
        """(row, sample index, result) of every output record, in input order."""
        return [(row, j, self.results[(row.pos, j)]) for row in self.rows for j in range(row.n)]
