"""The two value types of the reader stage: what to read (`InputSpec`) and one unit of work (`Split`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

ROW_INDEX_COLUMN = "__row_index"
FORMATS = ("auto", "parquet", "jsonl")


@dataclass(frozen=True)
class Split:
    """A contiguous row range of one input file, the unit of work and of commit.

    Splits are planned once and stored in the output's `_job.json`, so a resumed job works on the
    same ranges even if the input listing has changed since. `byte_offset` (JSONL only) is where
    line `row_start` begins, so a reader can seek there instead of scanning the file from the start.
    """

    index: int
    file_index: int
    path: str
    row_start: int
    row_end: int
    byte_offset: int | None = None

    @property
    def name(self) -> str:
        """Zero-padded index used in part and commit file names, so names sort in split order."""
        return f"{self.index:05d}"

    @property
    def num_rows(self) -> int:
        return self.row_end - self.row_start

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

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
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a split record: {d!r} ({exc})") from exc


@dataclass(frozen=True)
class InputSpec:
    """Where the input is and how to read it (the `[input]` section of a job spec)."""

    path: str
    format: str = "auto"
    query: str | None = None
    id_column: str | None = None
    prompt_column: str | None = None
    messages_column: str | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"input.format={self.format!r}: must be one of {', '.join(FORMATS)}")
        if not self.path:
            raise ValueError("input.path is empty: give a file, a directory or a glob (local, s3://, ...)")

    def required_columns(self) -> list[str]:
        """Columns the pipeline will look up, checked against each file's schema at planning time."""
        return [c for c in (self.id_column, self.prompt_column, self.messages_column) if c]
