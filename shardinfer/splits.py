"""The unit of work and of commit: a `Split`, and the split plan a job stores once.

The readers cut the input into splits and stream their rows; the writers name part files and
commit markers after them and store the plan in `_job.json`; the pipeline moves them from one to
the other. All three import this ground-floor module, so none of them has to import another.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

# The column the readers append to every batch: the row's index within its input file. It gives a
# row without an id column a stable id ("{file_index}:{row_index}") and is never written out.
ROW_INDEX_COLUMN = "__row_index"
# Set on rows the reader could not decode (readers/row_errors.py): the reason, null on the others.
# Only in batches that hold such a row.
ROW_ERROR_COLUMN = "__row_error"
RESERVED_COLUMNS = (ROW_INDEX_COLUMN, ROW_ERROR_COLUMN)


@dataclass(frozen=True)
class Split:
    """A row range of one input file (or chosen rows of it), the unit of work and of commit.

    Splits are planned once and stored in the output's `_job.json`, so a resumed job works on the
    same ranges even if the input listing has changed since. `byte_offset` (JSONL only) is where
    line `row_start` begins, so a reader can seek there instead of scanning the file from the start.
    `only_rows`, when set, are the row indexes of the range the split holds, in order (the rows
    with new ids of a rewritten file, planned by `job.incremental`); None means every row.
    """

    index: int
    file_index: int
    path: str
    row_start: int
    row_end: int
    byte_offset: int | None = None
    only_rows: tuple[int, ...] | None = None

    @property
    def name(self) -> str:
        """Zero-padded index used in part and commit file names, so names sort in split order."""
        return f"{self.index:05d}"

    @property
    def num_rows(self) -> int:
        return len(self.only_rows) if self.only_rows is not None else self.row_end - self.row_start

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        if self.only_rows is None:
            del record["only_rows"]  # plans without it keep their records as they were
        else:
            record["only_rows"] = list(self.only_rows)
        return record

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Split:
        try:
            return cls(
                index=int(d["index"]),
                file_index=int(d["file_index"]),
                path=str(d["path"]),
                row_start=int(d["row_start"]),
                row_end=int(d["row_end"]),
                byte_offset=None if d.get("byte_offset") is None else int(d["byte_offset"]),
                only_rows=None if d.get("only_rows") is None else tuple(int(i) for i in d["only_rows"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a split record: {d!r} ({exc})") from exc


def plan_to_records(splits: Iterable[Split]) -> list[dict[str, Any]]:
    """The split plan as JSON-ready records, in plan order (how `_job.json` stores it)."""
    return [s.to_dict() for s in splits]


def plan_from_records(records: Iterable[dict[str, Any]]) -> list[Split]:
    """The split plan from its stored records, checked to be numbered 0..n-1 in order.

    Commit markers name splits by index, so a plan whose indexes do not match their positions
    would commit one range under another's name.
    """
    splits = [Split.from_dict(d) for d in records]
    for expected, split in enumerate(splits):
        if split.index != expected:
            raise ValueError(
                f"_job.json split plan is damaged: position {expected} holds split {split.index}; "
                "restore the file or start the job over"
            )
    return splits
