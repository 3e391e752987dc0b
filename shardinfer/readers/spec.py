"""What the reader stage reads: `InputSpec`. Its unit of work, `Split`, lives in shardinfer.splits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FORMATS = ("auto", "parquet", "jsonl")


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
    # The other columns the job reads (override, passthrough, score columns); None: unknown, as for
    # a reader used outside a job. See judged_columns.
    used_columns: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"input.format={self.format!r}: must be one of {', '.join(FORMATS)}")
        if not self.path:
            raise ValueError("input.path is empty: give a file, a directory or a glob (local, s3://, ...)")

    def required_columns(self) -> list[str]:
        """Columns the pipeline will look up, checked against each file's schema at planning time."""
        return [c for c in (self.id_column, self.prompt_column, self.messages_column) if c]

    def judged_columns(self) -> frozenset[str] | None:
        """The columns whose cells make their row an error when the reader cannot decode them: those
        the job reads. A cell of any other column is read as null instead, as nothing reads it.
        None (every column) where the job's columns are not known, or with a query, which may
        read any column."""
        if self.used_columns is None or self.query:
            return None
        return frozenset(self.required_columns()) | frozenset(self.used_columns)
