"""Planning and streaming JSONL splits: one JSON object per line, split by line ranges.

A row's index is its 0-based line number, so row ids stay stable however the file is split.
Blank lines are skipped but keep their number. Planning reads each file once, counting lines and
noting the byte offset where each split starts, so a split of an uncompressed file is read by
seeking there; compressed files are scanned from the start.

Arrow needs one schema per file: it is inferred from the first `SCHEMA_SAMPLE_LINES` objects
(a column that is null throughout the sample is read as string). A later line with a key the
sample did not have is an error rather than a silently dropped field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any

import pyarrow as pa

from shardinfer.errors import InputSchemaError
from shardinfer.readers.listing import is_compressed
from shardinfer.splits import ROW_INDEX_COLUMN
from shardinfer.storage import RetryPolicy, filesystem, with_retries

SCHEMA_SAMPLE_LINES = 1000
_CHUNK = 1 << 20
_RETRY = RetryPolicy()


def _open_text(url: str, storage_options: dict) -> IO[bytes]:
    fs, path = filesystem(url, storage_options)
    compression = "infer" if is_compressed(url) else None
    return with_retries(_RETRY, f"open {url}", lambda: fs.open(path, "rb", compression=compression))


def _parse_line(line: bytes, url: str, line_index: int) -> dict[str, Any] | None:
    """The object on one line, None for a blank line; InputSchemaError for anything else."""
    if not line.strip():
        return None
    try:
        value = json.loads(line)
    except ValueError as exc:
        raise InputSchemaError(
            f"{url} line {line_index + 1}: not valid JSON ({exc}): {line[:120]!r}; fix or remove the line"
        ) from exc
    if not isinstance(value, dict):
        raise InputSchemaError(
            f"{url} line {line_index + 1}: expected a JSON object per line, got {type(value).__name__}"
        )
    return value


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
    """Arrow schema from the first SCHEMA_SAMPLE_LINES objects of the file."""
    rows: list[dict[str, Any]] = []
    with _open_text(url, storage_options) as f:
        for line_index, line in enumerate(f):
            row = _parse_line(line, url, line_index)
            if row is not None:
                rows.append(row)
            if len(rows) >= SCHEMA_SAMPLE_LINES:
                break
    if not rows:
        return pa.schema([])
    try:
        inferred = pa.Table.from_pylist(rows).schema
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InputSchemaError(
            f"{url}: the first {len(rows)} objects do not share column types ({exc}); "
            "make each key hold one type, or convert the input to Parquet"
        ) from exc
    fields = [pa.field(f.name, pa.string()) if pa.types.is_null(f.type) else f for f in inferred]
    return pa.schema(fields)


def _to_batch(rows: list[dict[str, Any]], indexes: list[int], schema: pa.Schema, url: str) -> pa.RecordBatch:
    known = set(schema.names)
    for row, line_index in zip(rows, indexes, strict=True):
        extra = set(row) - known
        if extra:
            raise InputSchemaError(
                f"{url} line {line_index + 1}: key(s) {sorted(extra)} are not among the columns inferred "
                f"from the first {SCHEMA_SAMPLE_LINES} lines ({schema.names}); put every key in the first "
                "lines (null is fine) or convert the input to Parquet"
            )
    try:
        table = pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InputSchemaError(
            f"{url} lines {indexes[0] + 1}..{indexes[-1] + 1}: a value does not fit the column types "
            f"inferred from the first lines ({schema}) ({exc}); make each key hold one type"
        ) from exc
    batch = (
        table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema)
    )
    return batch.append_column(ROW_INDEX_COLUMN, pa.array(indexes, type=pa.int64()))


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
        rows: list[dict[str, Any]] = []
        indexes: list[int] = []
        for line in f:
            if line_index >= row_end:
                break
            if line_index >= row_start:
                row = _parse_line(line, url, line_index)
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
