"""Planning and streaming JSONL splits: one JSON object per line, split by line ranges.

A row's index is its 0-based line number, so row ids stay stable however the file is split.
Blank lines are skipped but keep their number. Planning reads each file once, counting lines and
noting the byte offset where each split starts, so a split of an uncompressed file is read by
seeking there; compressed files are scanned from the start.

Arrow needs one schema per file: it is inferred from the first `SCHEMA_SAMPLE_LINES` objects,
one column per key any of them has (a line without a key holds null there), each column typed
from all its sampled values: a column that is null throughout the sample is read as string;
objects give a struct of every key they have; where the values disagree, lists and objects alike
(chat messages whose content is text in some lines and a list of parts in others) are read as
their JSON text, and other values as the type most of them have. A line that cannot become a row
of that schema (not JSON, not an object, nested too deeply, a key the sample did not have, at the
top or inside an object, a value of another type) is an error row carrying the reason
(row_errors.py): the job records it and goes on, and no field is ever dropped silently.
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
JSON_TEXT_KEY = b"shardinfer.json_text"  # field metadata of a column read as JSON text
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
    values: dict[str, list[Any]] = {}  # every key of the sample, in the order lines first name it
    for row in rows:
        for name, value in row.items():
            values.setdefault(name, []).append(value)
    return pa.schema([_column_field(name, column) for name, column in values.items()])


def _column_field(name: str, values: list[Any]) -> pa.Field:
    """One column's field from its sampled values (a line without the key holds null there).

    The type that holds them all (struct fields are the union of the sampled objects' keys); where
    none does, and every value is a list or an object (chat messages whose content is text in some
    lines and a list of parts in others), JSON text, which a messages column reads as it reads
    any JSON string; otherwise the type most values have, so the odd lines, not the file, are the
    errors."""
    try:
        kind = pa.array(values).type
    except (pa.ArrowInvalid, pa.ArrowTypeError, RecursionError):
        present = [v for v in values if v is not None]
        if all(isinstance(v, list | dict) for v in present):
            return pa.field(name, pa.string(), metadata={JSON_TEXT_KEY: b"1"})
        kind = _majority_type(present)
    return pa.field(name, _without_null(kind))


def _majority_type(values: list[Any]) -> pa.DataType:
    """The type most values have on their own (the first seen wins a tie)."""
    votes: dict[str, tuple[int, pa.DataType]] = {}
    for value in values:
        try:
            kind = pa.array([value]).type
        except (pa.ArrowInvalid, pa.ArrowTypeError, RecursionError):
            continue  # a value mixing types inside itself: its line will be an error row
        count, _ = votes.get(str(kind), (0, kind))
        votes[str(kind)] = (count + 1, kind)
    return max(votes.values(), key=lambda v: v[0], default=(0, pa.null()))[1]


def _without_null(kind: pa.DataType) -> pa.DataType:
    """`kind` with the null type (a key null throughout the sample) read as string, at any depth."""
    if pa.types.is_null(kind):
        return pa.string()
    if pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(_without_null(kind.value_type)))
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_without_null(f.type)) for f in kind])
    return kind


def is_json_text(field: pa.Field) -> bool:
    """Whether the reader writes this column's values as JSON text (see _column_field)."""
    return bool(field.metadata) and field.metadata.get(JSON_TEXT_KEY) == b"1"


def _as_json_text(row: dict[str, Any], json_columns: list[str]) -> dict[str, Any]:
    """The row with the values of JSON-text columns written as JSON text."""
    if not json_columns:
        return row
    out = dict(row)
    for name in json_columns:
        if out.get(name) is not None:
            out[name] = json.dumps(out[name], ensure_ascii=False)
    return out


def _unknown_key(value: Any, kind: pa.DataType, path: str) -> str | None:
    """The path of the first object key in `value` that `kind` has no field for (Arrow would drop
    it without a word), or None."""
    if isinstance(value, dict) and pa.types.is_struct(kind):
        for key, item in value.items():
            index = kind.get_field_index(key)
            if index < 0:
                return f"{path}.{key}"
            found = _unknown_key(item, kind.field(index).type, f"{path}.{key}")
            if found is not None:
                return found
    elif isinstance(value, list) and (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        for i, item in enumerate(value):
            found = _unknown_key(item, kind.value_type, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _has_struct(kind: pa.DataType) -> bool:
    if pa.types.is_struct(kind):
        return True
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _has_struct(kind.value_type)
    return False


def _shape_problem(row: dict[str, Any], known: set[str], schema: pa.Schema, nested: list[str]) -> str | None:
    """A key of `row`, at the top or inside an object of a `nested` column, that `schema` lacks:
    Arrow would drop such a key silently, so the row is an error instead."""
    extra = set(row) - known
    if extra:
        return (
            f"key(s) {sorted(extra)} are not among the columns inferred from the first "
            f"{SCHEMA_SAMPLE_LINES} lines ({schema.names}); put every key in the first lines (null is "
            "fine) or convert the input to Parquet"
        )
    for name in nested:
        field = schema.field(name)
        unknown = _unknown_key(row.get(name), field.type, name)
        if unknown is not None:
            return (
                f"key {unknown!r} is not among the fields of column {name!r} ({field.type}) inferred from "
                f"the first {SCHEMA_SAMPLE_LINES} lines; give one of the first lines that key too (null "
                "is fine) or convert the input to Parquet"
            )
    return None


def _row_problem(row: dict[str, Any], known: set[str], schema: pa.Schema) -> str | None:
    """Why one object (JSON-text columns already written as text) cannot be a row of `schema`, or None."""
    shape = _shape_problem(row, known, schema, [f.name for f in schema if _has_struct(f.type)])
    if shape is not None:
        return shape
    try:
        pa.Table.from_pylist([row], schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, RecursionError) as exc:
        misfit = _misfit_key(row, schema)
        if misfit is not None:
            return misfit
        return (
            f"a value does not fit the column types inferred from the first lines ({exc}); make each "
            "key hold one type"
        )
    return None


def _misfit_key(row: dict[str, Any], schema: pa.Schema) -> str | None:
    """The first key whose value does not fit its inferred column, named with the value."""
    for name, value in row.items():
        kind = schema.field(name).type
        try:
            pa.array([value], type=kind)
        except (pa.ArrowInvalid, pa.ArrowTypeError, RecursionError):
            shown = repr(value)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            return (
                f"key {name!r} holds {shown} ({type(value).__name__}), but the first lines made it a "
                f"column of {kind}; make each key hold one type (e.g. quote numbers meant as text)"
            )
    return None


def _to_batch(
    rows: list[dict[str, Any] | BadLine], indexes: list[int], schema: pa.Schema, url: str
) -> pa.RecordBatch:
    """Parsed lines as one batch; bad lines and objects that do not fit become error rows."""
    known = set(schema.names)
    nested = [f.name for f in schema if _has_struct(f.type)]
    json_columns = [f.name for f in schema if is_json_text(f)]
    errors: dict[int, str] = {}
    good: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        if isinstance(row, BadLine):
            errors[i] = str(row)
            good.append({})
            continue
        problem = _shape_problem(row, known, schema, nested)
        if problem is None:
            try:
                good.append(_as_json_text(row, json_columns))
                continue
            except (RecursionError, ValueError):
                problem = "a value is nested too deeply to write as JSON text; flatten it"
        errors[i] = f"{url} line {indexes[i] + 1}: {problem}"
        good.append({})
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
