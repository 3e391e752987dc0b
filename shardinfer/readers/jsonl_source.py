"""Planning and streaming JSONL splits: one JSON object per line, split by line ranges.

A row's index is its 0-based line number, so row ids stay stable however the file is split.
Blank lines are skipped but keep their number. Planning reads each file once, counting lines and
noting the byte offset where each split starts, so a split of an uncompressed file is read by
seeking there; compressed files are scanned from the start.

Arrow needs one schema per file: it is inferred from the first `SCHEMA_SAMPLE_LINES` objects
(a column that is null throughout the sample is read as string; where sampled objects disagree on
a key's type, the type most of them have). A line that cannot become a row of that schema (not
JSON, not an object, nested too deeply, a key the sample did not have, a value of another type)
is an error row carrying the reason (row_errors.py): the job records it and goes on, and no field
is ever dropped silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any

import pyarrow as pa
from fsspec.utils import infer_compression

from shardinfer.errors import ConfigError, InputSchemaError
from shardinfer.readers.listing import is_compressed, without_query
from shardinfer.readers.row_errors import attach_row_errors
from shardinfer.splits import ROW_INDEX_COLUMN
from shardinfer.storage import RetryPolicy, filesystem, with_retries

SCHEMA_SAMPLE_LINES = 1000
_CHUNK = 1 << 20
_RETRY = RetryPolicy()


def _open_text(url: str, storage_options: dict) -> IO[bytes]:
    fs, path = filesystem(url, storage_options)
    # Named from the file name without a signed URL's query, which would hide its extension.
    compression = infer_compression(without_query(url)) if is_compressed(url) else None
    return with_retries(_RETRY, f"open {url}", lambda: fs.open(path, "rb", compression=compression))


class BadLine(ValueError):
    """A line that is not one JSON object; its message names the file and line."""


def _parse_line(line: bytes, url: str, line_index: int) -> dict[str, Any] | None:
    """The object on one line, None for a blank line; BadLine for anything else."""
    if not line.strip():
        return None
    try:
        value = json.loads(line)
    except RecursionError:
        raise BadLine(
            f"{url} line {line_index + 1}: a value is nested too deeply to parse; flatten it"
        ) from None
    except ValueError as exc:  # also invalid UTF-8 (UnicodeDecodeError)
        raise BadLine(
            f"{url} line {line_index + 1}: not valid JSON ({exc}): {line[:120]!r}; fix or remove the line"
        ) from None
    if not isinstance(value, dict):
        raise BadLine(
            f"{url} line {line_index + 1}: expected a JSON object per line, got {type(value).__name__}"
        )
    return value


def _not_jsonl(url: str, storage_options: dict, first_bad: BadLine) -> Exception:
    """The error for a file read as JSON Lines whose first lines hold no object: what the file is
    instead, when its first bytes tell (a Parquet file, one JSON array, gzip without its suffix)."""
    fs, path = filesystem(url, storage_options)
    with with_retries(_RETRY, f"open {url}", lambda: fs.open(path, "rb")) as f:
        head = f.read(64)
    if head.startswith(b"PAR1"):
        return ConfigError(f"{url} is a Parquet file, read as JSON Lines because input.format is 'jsonl': set "
                           "input.format = 'parquet', or leave it 'auto' to go by the file names")
    if head.startswith(b"\x1f\x8b"):
        return InputSchemaError(f"{url} is gzip-compressed but its name does not end in .gz: rename it "
                                "*.jsonl.gz so it is decompressed")
    if head.lstrip().startswith(b"["):
        return InputSchemaError(f"{url} holds a JSON array, not JSON Lines (one object per line): write one "
                                "object per line, e.g. `jq -c '.[]' FILE > FILE.jsonl`")
    return InputSchemaError(f"no JSON object in the first lines: {first_bad}")


def scan_jsonl(url: str, storage_options: dict, split_rows: int) -> tuple[int, list[int | None]]:
    """(number of lines, byte offset where line k*split_rows starts, for each split k) in one pass.

    Line L starts right after the file's L-th newline. Offsets are None for compressed files,
    where they could not be seeked to anyway.
    """
    compressed = is_compressed(url)
    starts: list[int | None] = [None if compressed else 0]
    target = split_rows  # the next boundary line; it starts after newline number `target`
    newlines = 0  # newlines before the current chunk
    position = 0  # byte offset of the current chunk
    last = b""
    with _open_text(url, storage_options) as f:
        while chunk := f.read(_CHUNK):
            in_chunk = chunk.count(b"\n")
            cursor, found = -1, newlines
            while target <= newlines + in_chunk:
                while found < target:
                    cursor = chunk.find(b"\n", cursor + 1)
                    found += 1
                starts.append(None if compressed else position + cursor + 1)
                target += split_rows
            newlines += in_chunk
            position += len(chunk)
            last = chunk[-1:]
    lines = newlines + (1 if last not in (b"", b"\n") else 0)
    # Drop boundaries at or past the end (a file ending in a newline, or an empty file).
    while starts and (len(starts) - 1) * split_rows >= lines:
        starts.pop()
    return lines, starts


def infer_jsonl_schema(url: str, storage_options: dict) -> pa.Schema:
    """Arrow schema from the first SCHEMA_SAMPLE_LINES objects of the file (bad lines skipped)."""
    rows: list[dict[str, Any]] = []
    first_bad: BadLine | None = None
    with _open_text(url, storage_options) as f:
        for line_index, line in enumerate(f):
            try:
                row = _parse_line(line, url, line_index)
            except BadLine as exc:
                first_bad = first_bad or exc
                continue
            if row is not None:
                rows.append(row)
            if len(rows) >= SCHEMA_SAMPLE_LINES:
                break
    if not rows:
        if first_bad is not None:  # not one line of the sample is an object: not a JSONL file
            raise _not_jsonl(url, storage_options, first_bad) from None
        return pa.schema([])
    try:
        inferred = pa.Table.from_pylist(rows).schema
    except (pa.ArrowInvalid, pa.ArrowTypeError, RecursionError):
        inferred = _majority_schema(rows, url)
    fields = [pa.field(f.name, pa.string()) if pa.types.is_null(f.type) else f for f in inferred]
    return pa.schema(fields)


def _majority_schema(rows: list[dict[str, Any]], url: str) -> pa.Schema:
    """Each key's type as most sampled objects have it (first seen wins a tie); for a sample whose
    objects disagree, so that the odd rows, not the whole file, are the errors."""
    votes: dict[str, dict[str, tuple[int, pa.DataType]]] = {}
    for row in rows:
        try:
            schema = pa.Table.from_pylist([row]).schema
        except (pa.ArrowInvalid, pa.ArrowTypeError, RecursionError):
            continue  # a row mixing types inside one value: it will be an error row
        for f in schema:
            if pa.types.is_null(f.type):
                votes.setdefault(f.name, {})
                continue
            count, _ = votes.setdefault(f.name, {}).get(str(f.type), (0, f.type))
            votes[f.name][str(f.type)] = (count + 1, f.type)
    if not votes:
        raise InputSchemaError(f"{url}: no object of the first lines converts to Arrow; check the file")
    fields = []
    for name, kinds in votes.items():
        best = max(kinds.values(), key=lambda v: v[0], default=(0, pa.null()))
        fields.append(pa.field(name, best[1]))
    return pa.schema(fields)


def _row_problem(row: dict[str, Any], known: set[str], schema: pa.Schema) -> str | None:
    """Why one object cannot be a row of `schema`, or None if it can."""
    extra = set(row) - known
    if extra:
        return (
            f"key(s) {sorted(extra)} are not among the columns inferred from the first "
            f"{SCHEMA_SAMPLE_LINES} lines ({schema.names}); put every key in the first lines (null is "
            "fine) or convert the input to Parquet"
        )
    try:
        pa.Table.from_pylist([row], schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, RecursionError) as exc:
        return (
            f"a value does not fit the column types inferred from the first lines ({exc}); make each "
            "key hold one type"
        )
    return None


def _to_batch(
    rows: list[dict[str, Any] | BadLine], indexes: list[int], schema: pa.Schema, url: str
) -> pa.RecordBatch:
    """Parsed lines as one batch; bad lines and objects that do not fit become error rows."""
    known = set(schema.names)
    errors: dict[int, str] = {}
    good: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        if isinstance(row, BadLine):
            errors[i] = str(row)
            good.append({})
        elif set(row) - known:
            errors[i] = f"{url} line {indexes[i] + 1}: {_row_problem(row, known, schema)}"
            good.append({})
        else:
            good.append(row)
    try:
        table = pa.Table.from_pylist(good, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, RecursionError):
        # Some object does not fit: find it (only on this slow path) and keep the others.
        for i, row in enumerate(good):
            problem = _row_problem(row, known, schema) if i not in errors else None
            if problem is not None:
                errors[i] = f"{url} line {indexes[i] + 1}: {problem}"
                good[i] = {}
        table = pa.Table.from_pylist(good, schema=schema)
    batch = (
        table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema)
    )
    batch = batch.append_column(ROW_INDEX_COLUMN, pa.array(indexes, type=pa.int64()))
    return attach_row_errors(batch, errors)


def iter_jsonl_rows(
    url: str,
    storage_options: dict,
    row_start: int,
    row_end: int,
    byte_offset: int | None,
    batch_rows: int,
) -> Iterator[pa.RecordBatch]:
    """Lines [row_start, row_end) of one file as batches of at most `batch_rows` parsed objects."""
    schema = infer_jsonl_schema(url, storage_options)
    with _open_text(url, storage_options) as f:
        line_index = 0
        if byte_offset is not None:
            f.seek(byte_offset)
            line_index = row_start
        rows: list[dict[str, Any] | BadLine] = []
        indexes: list[int] = []
        for line in f:
            if line_index >= row_end:
                break
            if line_index >= row_start:
                row: dict[str, Any] | BadLine | None
                try:
                    row = _parse_line(line, url, line_index)
                except BadLine as exc:
                    row = exc
                if row is not None:
                    rows.append(row)
                    indexes.append(line_index)
                    if len(rows) == batch_rows:
                        yield _to_batch(rows, indexes, schema, url)
                        rows, indexes = [], []
            line_index += 1
        if line_index < row_end:
            raise InputSchemaError(
                f"{url} ends at line {line_index} but the split plan expects lines up to {row_end}; the "
                "input changed after the job was planned; restore it or start the job over"
            )
        if rows:
            yield _to_batch(rows, indexes, schema, url)
