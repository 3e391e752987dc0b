"""The messages between the split worker's threads, one class each (see runner.py's diagram).

preparation thread -> engine loop: `SplitOpened`, then one `RowsPrepared` per read batch, then
`SplitRead` once the reader reached the split's end (now its row count is known); after the last
split, `PreparationDone`. engine loop -> writer thread: `SplitToWrite`, then `WriterStop`.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardinfer.pipeline.part_table import Entry
from shardinfer.pipeline.rows import PreparedRow
from shardinfer.splits import Split


@dataclass(frozen=True)
class SplitOpened:
    split: Split


@dataclass(frozen=True)
class RowsPrepared:
    rows: list[PreparedRow]  # one read batch, in input order


@dataclass(frozen=True)
class SplitRead:
    split_index: int
    rows: int  # rows the reader delivered for this split


@dataclass(frozen=True)
class PreparationDone:
    """No more splits: every split of the worker's order was sent or skipped (or preparation failed)."""


PrepMessage = SplitOpened | RowsPrepared | SplitRead | PreparationDone


@dataclass(frozen=True)
class SplitToWrite:
    split: Split
    entries: list[Entry]  # (row, sample index, result) of every record, in input order


@dataclass(frozen=True)
class WriterStop:
    """The engine loop has ended: write nothing more."""


WriteMessage = SplitToWrite | WriterStop
