"""`job.incremental`: grow a job's plan by the input that is new since the job was planned.

    file added      -> all its rows, as new splits after the old ones (file numbers continue)
    file rewritten  -> the rows whose ids the output does not hold yet (ids from input.id_column),
                       as new splits over the file's new version
    file removed    -> refused (exit 78): its committed rows would stay in an output that no
                       longer matches the input

The old splits and their commits are never touched, so the job keeps its generation and its
workers, and `_SUCCESS` (written again at finalize) lists the whole output. A row of a rewritten
file whose id is already committed keeps its committed output, even if its prompt changed: rows
are identified by id. Without `input.id_column` row ids are `"{file_index}:{row_index}"`,
positions that a rewrite shifts, so new rows cannot be told from old ones and a rewritten file is
refused, naming the file and the ways out.

The committed splits of a rewritten file can no longer be computed again (their rows are gone
from the input): `_job.json` lists them as `superseded_splits`, and a damaged part of one is
reported instead of being recomputed from the wrong rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardinfer.errors import ConfigError, InputChanged
from shardinfer.pipeline.input_listing import ListingDiff, with_content_digests
from shardinfer.pipeline.output_ids import committed_row_ids
from shardinfer.pipeline.rows import row_id_of
from shardinfer.redaction import location_identity, with_credentials_of
from shardinfer.splits import ROW_INDEX_COLUMN, Split, plan_to_records

if TYPE_CHECKING:
    from shardinfer.pipeline.job import OpenedJob
    from shardinfer.readers.spec import InputSpec


@dataclass
class Growth:
    """What an incremental run added to the plan."""

    added_files: list[str] = field(default_factory=list)
    rewritten_rows: dict[str, int] = field(default_factory=dict)  # rewritten file -> new rows planned
    new_splits: int = 0

    def describe(self) -> str:
        parts = []
        if self.added_files:
            parts.append(f"{len(self.added_files)} added file(s): {', '.join(self.added_files[:5])}")
        for url, rows in list(self.rewritten_rows.items())[:5]:
            parts.append(f"{rows} row(s) with new ids in rewritten {url}")
        return "; ".join(parts) + f" ({self.new_splits} new split(s))"


def extend_plan(
    job: OpenedJob, existing: dict[str, Any], diff: ListingDiff, listing: list[dict[str, Any]]
) -> Growth:
    """Plan the new input after the old splits; `listing` is the input as listed now. The extended
    `_job.json` is left in `job.extended_record` for `write_plan`."""
    out = job.config.output.path
    if diff.removed:
        raise InputChanged(
            f"job.incremental adds new input only, but files were removed since the job at {out} was "
            f"planned ({ListingDiff([], diff.removed, []).describe()}); their committed rows would stay in "
            "an output that no longer matches the input. Restore them, or pass --conf job.start_over=true "
            "to redo the job"
        )
    if diff.changed:
        _check_rewrites(job, diff.changed)
    # Listings and diffs name files in their identity form (no credentials); the plan in memory
    # holds usable URLs, the configured input.path's credentials put back.
    rewritten = set(diff.changed)
    _pin_planned_schema(job, rewritten)
    growth = Growth(added_files=list(diff.added))
    numbers = {location_identity(s.path): s.file_index for s in job.splits}
    next_file = max(s.file_index for s in job.splits) + 1
    known = set(committed_row_ids(job.store, job.store.committed())) if diff.changed else set()
    new: list[Split] = []
    for name in [*diff.changed, *diff.added]:
        file_index = numbers.get(name)
        if file_index is None:
            file_index, next_file = next_file, next_file + 1
        url = with_credentials_of(name, job.config.input.path)
        spec = dataclasses.replace(job.input_spec, path=url)
        _check_schema(job, spec, name)
        first = len(job.splits) + len(new)
        if name in rewritten:
            picked = _new_id_rows(job, spec, file_index, known)
            planned = _pack(picked, job.config.job.split_rows, first, file_index)
            growth.rewritten_rows[name] = sum(s.num_rows for s in planned)
        else:
            planned = _renumber(_file_ranges(job, spec), first, file_index)
        new += planned
    growth.new_splits = len(new)
    superseded = set(existing.get("superseded_splits", [])) | {
        s.index for s in job.splits if location_identity(s.path) in rewritten
    }
    job.splits = job.splits + new
    job.superseded = superseded
    from shardinfer.pipeline.job import stored_plan

    job.extended_record = {
        **existing,
        "splits": plan_to_records(stored_plan(job.splits)),
        "total_input_rows": sum(s.num_rows for s in job.splits),
        "input_listing": with_content_digests(listing, existing.get("input_listing")),
        "superseded_splits": sorted(superseded),
    }
    return growth


def _check_rewrites(job: OpenedJob, changed: list[str]) -> None:
    out = job.config.output.path
    names = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    if not job.config.input.id_column:
        raise InputChanged(
            f"job.incremental: {names} changed since the job at {out} was planned, and this job has no "
            "input.id_column: its row ids are file:row positions, which a rewrite shifts, so the rows "
            "that are new cannot be told from the committed ones. Restore the file(s) and put new rows "
            "into new files (those are added), or pass --conf job.start_over=true to redo the job"
        )
    rewritten = set(changed)
    pending = [
        s.index for s in job.splits if location_identity(s.path) in rewritten and s.index not in job.committed
    ]
    if pending:
        raise InputChanged(
            f"job.incremental: {names} changed while split(s) {pending[:10]} of it were not committed yet "
            "(they would read the new version as if it were the old one). Restore the file(s) and let the "
            "job finish, then rerun with job.incremental, or pass --conf job.start_over=true to redo the job"
        )


def _pin_planned_schema(job: OpenedJob, rewritten: set[str]) -> None:
    """The schema new files are checked against is read from a file that was not rewritten (the
    job reads it from its first split's file, which may be the new version)."""
    from shardinfer.readers.splits import read_schema

    unchanged = next((s.path for s in job.splits if location_identity(s.path) not in rewritten), None)
    if unchanged is not None:
        job.input_schema_ = read_schema(job.input_spec, unchanged)


def _check_schema(job: OpenedJob, spec: InputSpec, name: str) -> None:
    """The file `spec.path` (called `name`, without credentials) has the planned input's schema."""
    from shardinfer.readers.splits import read_schema

    if not read_schema(spec, spec.path).remove_metadata().equals(job.input_schema.remove_metadata()):
        raise ConfigError(
            f"job.incremental: input file {name} has another schema than the planned input; "
            "rewrite it to the same columns and types, or start the job over"
        )


def _file_ranges(job: OpenedJob, spec: InputSpec) -> list[Split]:
    """The file's own ranges, as a new job would plan them (row groups, JSONL line offsets)."""
    from shardinfer.readers.splits import plan_splits

    return plan_splits(spec, job.config.job.split_rows)


def _renumber(ranges: Iterable[Split], first: int, file_index: int) -> list[Split]:
    return [dataclasses.replace(r, index=first + k, file_index=file_index) for k, r in enumerate(ranges)]


def _new_id_rows(
    job: OpenedJob, spec: InputSpec, file_index: int, known: set[str]
) -> list[tuple[Split, list[int]]]:
    """Per range of the file, the indexes of its rows whose id the output does not hold."""
    from shardinfer.readers.splits import read_split

    id_column = job.config.input.id_column
    picked = []
    for r in _file_ranges(job, spec):
        rows = []
        for batch in read_split(r, spec, job.config.job.batch_rows):
            ids = batch.column(id_column).to_pylist()
            indexes = batch.column(ROW_INDEX_COLUMN).to_pylist()
            for value, index in zip(ids, indexes, strict=True):
                if row_id_of(value, file_index, index) not in known:
                    rows.append(index)
        if rows:
            picked.append((r, rows))
    return picked


def _pack(picked: list[tuple[Split, list[int]]], split_rows: int, first: int, file_index: int) -> list[Split]:
    """New splits of at most `split_rows` selected rows, each over whole consecutive ranges of the
    file (so Parquet reads start at a row group and JSONL reads at a known line offset)."""
    splits: list[Split] = []
    group: list[tuple[Split, list[int]]] = []

    def close() -> None:
        if not group:
            return
        start, end = group[0][0], group[-1][0]
        rows = tuple(i for _, chosen in group for i in chosen)
        whole = len(rows) == end.row_end - start.row_start
        splits.append(
            Split(
                first + len(splits),
                file_index,
                start.path,
                start.row_start,
                end.row_end,
                start.byte_offset,
                None if whole else rows,
            )
        )
        group.clear()

    for r, rows in picked:
        if group and sum(len(c) for _, c in group) + len(rows) > split_rows:
            close()
        group.append((r, rows))
    close()
    return splits
