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
of that schema is an error row carrying the reason (row_errors.py): the job records it and goes
on, and no field is ever dropped or changed silently. A line that is not a JSON object (not JSON,
nested too deeply) is a row of nulls; an object keeps every cell that fits, its id among them, and
names the keys that do not: a key the sample did not have, at the top or inside an object, or a
value of another type, or one Arrow would store as another value (a fraction in an integer column,
a bool in a number column, a string in a list column; a whole float in an integer column is its
integer). Only the columns the job reads count: a cell of another column that does not fit is read
as null and its row goes on, as nothing reads it (with `input.query` every column counts).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain
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
# What Arrow raises for a value it cannot convert (OverflowError: an int too large for any of its types).
_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, RecursionError)


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
        return ConfigError(
            f"{url} is a Parquet file, read as JSON Lines because input.format is 'jsonl': set "
            "input.format = 'parquet', or leave it 'auto' to go by the file names"
        )
    if head.startswith(b"\x1f\x8b"):
        return InputSchemaError(
            f"{url} is gzip-compressed but its name does not end in .gz: rename it "
            "*.jsonl.gz so it is decompressed"
        )
    if head.lstrip().startswith(b"["):
        return InputSchemaError(
            f"{url} holds a JSON array, not JSON Lines (one object per line): write one "
            "object per line, e.g. `jq -c '.[]' FILE > FILE.jsonl`"
        )
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
    except _CONVERSION_ERRORS:
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
        except _CONVERSION_ERRORS:
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


def _may_change(kind: pa.DataType) -> bool:
    """Whether Arrow stores some JSON value in a column of `kind` as another value instead of
    refusing it (see _changes); values of other types it takes as they are or refuses."""
    return (
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or _is_list(kind) or pa.types.is_struct(kind)
    )


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _changes(value: Any, kind: pa.DataType) -> bool:
    """Whether Arrow would store `value` in a column of `kind` as another value: a float with a
    fraction truncated into an integer, a bool made a number, a string split into a list of its
    characters (or made an empty list, or an object of nulls), a list made an object.

    A whole float in an integer column is that integer, as a safe Arrow cast takes it: JSON has one
    number type, and the value is the same. An int in a float column is exact where a double holds
    it, and Arrow refuses the others. The walk keeps its own stack: a value may nest as deeply as
    the JSON parser allows, deeper than recursion here could follow."""
    stack = [(value, kind)]
    while stack:
        value, kind = stack.pop()
        if value is None:
            continue
        if pa.types.is_integer(kind):
            if type(value) is float and not value.is_integer():
                return True
        elif pa.types.is_floating(kind):
            if type(value) is bool:
                return True
        elif _is_list(kind):
            if type(value) is not list:
                return True
            if _may_change(kind.value_type):
                stack.extend((item, kind.value_type) for item in value)
        elif pa.types.is_struct(kind):
            if type(value) is not dict:
                return True
            stack.extend((value.get(f.name), f.type) for f in kind if _may_change(f.type))
    return False


def _any_changes(values: list[Any], kind: pa.DataType) -> bool:
    """Whether `_changes` holds for any of `values` (one column's cells): the check every batch
    pays, so it goes by the set of the values' types, built at C speed, level by level of the
    column's type (the items of its lists, the fields of its objects), and looks at single values
    only where that set holds a suspect type."""
    work = [(values, kind)] if _may_change(kind) else []
    while work:
        values, kind = work.pop()
        kinds = set(map(type, values))
        if pa.types.is_integer(kind):
            if float in kinds and any(type(v) is float and not v.is_integer() for v in values):
                return True
        elif pa.types.is_floating(kind):
            if bool in kinds:
                return True
        elif _is_list(kind):
            if not kinds <= {list, type(None)}:
                return True
            if _may_change(kind.value_type):
                work.append((list(chain.from_iterable(filter(None, values))), kind.value_type))
        else:
            if not kinds <= {dict, type(None)}:
                return True
            suspect = [f for f in kind if _may_change(f.type)]
            present = [v for v in values if v is not None] if suspect else []
            work.extend(([v.get(f.name) for v in present], f.type) for f in suspect)
    return False


@dataclass(frozen=True)
class _Columns:
    """What turning objects into rows needs to know of a file's schema, worked out once per file."""

    schema: pa.Schema
    known: frozenset[str]
    nested: tuple[tuple[str, pa.DataType], ...]  # columns holding objects, whose keys the schema may lack
    json_text: tuple[str, ...]  # columns whose values are written as JSON text (_column_field)
    exact: tuple[tuple[str, pa.DataType], ...]  # columns some values of which Arrow would store as others
    # Columns whose cells make their row an error when they cannot be read; None: every column.
    judged: frozenset[str] | None

    @classmethod
    def of(cls, schema: pa.Schema, judged: frozenset[str] | None) -> _Columns:
        return cls(
            schema,
            frozenset(schema.names),
            tuple((f.name, f.type) for f in schema if _has_struct(f.type)),
            tuple(f.name for f in schema if is_json_text(f)),
            tuple((f.name, f.type) for f in schema if _may_change(f.type)),
            judged,
        )

    def judges(self, name: str) -> bool:
        return self.judged is None or name in self.judged


@dataclass
class _Rows:
    """Objects on their way into one batch: the cells each will have, and why it is an error row
    (no reason: it is not one). A cell that cannot be read is null; the row keeps the others, its
    id among them, so its error record can be found by id."""

    columns: _Columns
    cells: list[dict[str, Any]] = field(default_factory=list)
    problems: dict[int, list[str]] = field(default_factory=dict)  # by row position; most rows have none

    def reject(self, i: int, name: str, reason: str) -> None:
        """Row i's cell of column `name` cannot be read: it is null, and the row an error if the job
        reads that column; nothing reads the others, so their row goes on."""
        self.cells[i][name] = None
        if self.columns.judges(name):
            self.problems.setdefault(i, []).append(reason)

    def add(self, row: dict[str, Any]) -> None:
        """One parsed object (taken over, not copied), with the checks that need no other rows."""
        i = len(self.cells)
        self.cells.append(row)
        columns = self.columns
        if not columns.known.issuperset(row):
            self._drop_extra_keys(i, row)
        for name, kind in columns.nested:
            unknown = _unknown_key(row.get(name), kind, name)
            if unknown is not None:
                self.reject(
                    i,
                    name,
                    f"key {unknown!r} is not among the fields of column {name!r} ({kind}) inferred from "
                    f"the first {SCHEMA_SAMPLE_LINES} lines; give one of the first lines that key too "
                    "(null is fine) or convert the input to Parquet",
                )
        for name in columns.json_text:
            if row.get(name) is not None:
                try:
                    row[name] = json.dumps(row[name], ensure_ascii=False)
                except (RecursionError, ValueError):
                    self.reject(i, name, "a value is nested too deeply to write as JSON text; flatten it")

    def _drop_extra_keys(self, i: int, row: dict[str, Any]) -> None:
        """Drop the keys of row i that the schema lacks: Arrow would drop them without a word, so
        the row is an error if the job reads one of them."""
        extra = row.keys() - self.columns.known
        for key in extra:
            del row[key]
        judged = sorted(key for key in extra if self.columns.judges(key))
        if judged:
            self.problems.setdefault(i, []).append(
                f"key(s) {judged} are not among the columns inferred from the first "
                f"{SCHEMA_SAMPLE_LINES} lines ({self.columns.schema.names}); put every key in the first "
                "lines (null is fine) or convert the input to Parquet"
            )

    def reject_changed(self) -> None:
        """Reject the cells Arrow would store as another value: it does so without an error."""
        for name, kind in self.columns.exact:
            values = [row.get(name) for row in self.cells]
            if _any_changes(values, kind):
                for i, value in enumerate(values):
                    if _changes(value, kind):
                        self.reject(i, name, _misfit(name, value, kind))

    def table(self) -> pa.Table:
        schema = self.columns.schema
        try:
            return pa.Table.from_pylist(self.cells, schema=schema)
        except _CONVERSION_ERRORS:
            pass
        # Some cell does not fit: find it (only on this slow path) and keep the others.
        for i, row in enumerate(self.cells):
            try:
                pa.Table.from_pylist([row], schema=schema)
                continue
            except _CONVERSION_ERRORS as exc:
                whole_row = exc
            misfits = 0
            for name, value in list(row.items()):
                kind = schema.field(name).type
                try:
                    pa.array([value], type=kind)
                except _CONVERSION_ERRORS:
                    self.reject(i, name, _misfit(name, value, kind))
                    misfits += 1
            if not misfits:  # each cell fits alone, the row does not: which cell to blame is unknown
                row.clear()
                self.problems.setdefault(i, []).append(
                    f"a value does not fit the column types inferred from the first lines ({whole_row}); "
                    "make each key hold one type"
                )
        return pa.Table.from_pylist(self.cells, schema=schema)


def _misfit(name: str, value: Any, kind: pa.DataType) -> str:
    """Why a value cannot be a cell of its column, named with the value."""
    try:
        shown = repr(value)
    except RecursionError:
        shown = "a value nested too deeply to show"
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    example = (
        "e.g. 3.0 rather than 3 in the first lines, so that the column holds fractions"
        if pa.types.is_integer(kind) and type(value) is float
        else "e.g. quote numbers meant as text"
    )
    return (
        f"key {name!r} holds {shown} ({type(value).__name__}), but the first lines made it a column of "
        f"{kind}; make each key hold one type ({example})"
    )


def _to_batch(
    lines: list[dict[str, Any] | BadLine], indexes: list[int], columns: _Columns, url: str
) -> pa.RecordBatch:
    """Parsed lines as one batch: a bad line is an error row of nulls, an object with cells that do
    not fit an error row that keeps the others (see _Rows)."""
    rows = _Rows(columns)
    errors: dict[int, str] = {}
    for i, line in enumerate(lines):
        if isinstance(line, BadLine):
            errors[i] = str(line)
            rows.add({})
        else:
            rows.add(line)
    rows.reject_changed()
    table = rows.table()
    for i, problems in rows.problems.items():
        errors[i] = f"{url} line {indexes[i] + 1}: {'; '.join(problems)}"
    batch = (
        table.combine_chunks().to_batches()[0]
        if table.num_rows
        else pa.RecordBatch.from_pylist([], columns.schema)
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
    judged: frozenset[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Lines [row_start, row_end) of one file as batches of at most `batch_rows` parsed objects.

    `judged`: the columns whose unreadable cells make their row an error (the columns the job
    reads); a cell of another column is read as null. None: every column."""
    columns = _Columns.of(infer_jsonl_schema(url, storage_options), judged)
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
                        yield _to_batch(rows, indexes, columns, url)
                        rows, indexes = [], []
            line_index += 1
        if line_index < row_end:
            raise InputSchemaError(
                f"{url} ends at line {line_index} but the split plan expects lines up to {row_end}; the "
                "input changed after the job was planned; restore it or start the job over"
            )
        if rows:
            yield _to_batch(rows, indexes, columns, url)
