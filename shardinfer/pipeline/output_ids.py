"""The row ids an output holds, read back from its committed parts.

Two readers need them: finalize counts ids that repeat (`duplicate_row_ids` in the summary, an
error with `job.unique_ids = true`), and `job.incremental` plans only the rows of a rewritten
input file whose ids the output does not hold yet.

Ids from `input.id_column` are whatever the input says, and nothing makes them unique: a join
upstream or a file exported twice repeats them. Two rows with one id also share their seeds
(derived from the id), so their samples are the same draw and a reader keyed by id cannot tell
them apart. Ids `"{file_index}:{row_index}"` (no id column) are unique by construction.

One input row gives several records (`n` samples, or a score job's continuations); its record
numbered 0 stands for the row. Only the id and numbering columns of each part are read, and each
distinct id is held once in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from shardinfer.errors import DuplicateRowIds

if TYPE_CHECKING:
    from shardinfer.writers.output_store import OutputStore

# The column numbering an input row's records: generation samples, or a score job's continuations.
_RECORD_INDEX_COLUMNS = ("sample_index", "continuation_index")


def part_row_ids(store: OutputStore, part: str) -> list[str]:
    """The row id of each input row of one committed part, in the part's order."""
    table = store.read_part_columns(part, ["row_id", *_RECORD_INDEX_COLUMNS])
    numbering = next((c for c in _RECORD_INDEX_COLUMNS if c in table.column_names), None)
    if numbering is not None:
        table = table.filter(pc.equal(table[numbering], 0))
    return [str(v) for v in table["row_id"].to_pylist()]


def committed_row_ids(store: OutputStore, committed: dict[int, dict[str, Any]]) -> Iterator[str]:
    """Every input row's id over the committed parts, in split order (repeats included). Parts are
    read a batch at a time, the batch's reads at once (writers.parts.map_parts): the ids of one
    batch are held at a time, beside what the caller keeps."""
    from shardinfer.writers.parts import PART_READ_CONCURRENCY, map_parts

    parts = [committed[index]["part"] for index in sorted(committed)]
    for start in range(0, len(parts), PART_READ_CONCURRENCY):
        batch = parts[start : start + PART_READ_CONCURRENCY]
        for ids in map_parts(lambda part: part_row_ids(store, part), batch):
            yield from ids


@dataclass(frozen=True)
class RepeatedIds:
    repeats: int  # input rows whose id an earlier row already had
    first: str | None  # the first id seen a second time, in split order


def count_repeated_ids(ids: Iterator[str]) -> RepeatedIds:
    seen: set[str] = set()
    repeats = 0
    first: str | None = None
    for row_id in ids:
        if row_id in seen:
            repeats += 1
            first = row_id if first is None else first
        else:
            seen.add(row_id)
    return RepeatedIds(repeats, first)


def check_unique_ids(found: RepeatedIds, required: bool) -> None:
    """`job.unique_ids = true`: any repeated id is a data error (exit 65) naming the first one."""
    if required and found.repeats:
        raise DuplicateRowIds(
            f"{found.repeats} input row(s) repeat the row id of an earlier row (first: {found.first!r}) and "
            "job.unique_ids = true; deduplicate the input, pick another input.id_column, or set "
            "job.unique_ids = false to accept repeats (rows with one id share their seeds)"
        )
