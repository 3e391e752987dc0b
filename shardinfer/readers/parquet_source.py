"""Planning and streaming Parquet splits.

Planning reads only footers. Within one file, whole row groups are packed greedily into splits of
at most `split_rows` rows; a row group larger than `split_rows` is cut into pieces of `split_rows`
rows from its start (the last piece holds the rest). Splits never span files.

Streaming uses `ParquetFile.iter_batches` over just the row groups that overlap the split, so the
reader holds one row group's column chunks and one batch at a time, never the whole file. Peak
memory therefore follows the input's row-group size; write inputs with modest row groups.
Parquet does not check that string cells are UTF-8: a cell that is not becomes null and its row an
error row (row_errors.py), instead of failing the whole batch when it is converted.
Dictionary-encoded columns (a pandas categorical, a file that stored its Arrow schema with
dictionaries) and string or binary views (a file written from Arrow view types) are read as their
plain values: a prompt is text whichever way it was stored, and files written either way share
one schema.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem

from shardinfer.errors import InputSchemaError
from shardinfer.readers.row_errors import null_invalid_utf8
from shardinfer.splits import ROW_INDEX_COLUMN
from shardinfer.storage import RetryPolicy, filesystem, with_retries

_RETRY = RetryPolicy()


def _open_parquet(fs: AbstractFileSystem, path: str, url: str) -> pq.ParquetFile:
    handle = with_retries(_RETRY, f"open {url}", lambda: fs.open(path, "rb"))
    try:
        return pq.ParquetFile(handle, pre_buffer=False)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        handle.close()
        raise InputSchemaError(
            f"{url} is not a readable Parquet file ({exc}); replace or remove it, "
            "or narrow input.path to the good files"
        ) from exc


def _plain_type(kind: pa.DataType) -> pa.DataType:
    """`kind` with every dictionary type, at any depth of lists and structs, replaced by its values'
    type, and every string or binary view by the plain string or binary type."""
    if pa.types.is_dictionary(kind):
        return _plain_type(kind.value_type)
    if pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_binary_view(kind):
        return pa.binary()
    if pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(_plain_type(kind.value_type)))
    if pa.types.is_large_list(kind):
        return pa.large_list(kind.value_field.with_type(_plain_type(kind.value_type)))
    if pa.types.is_struct(kind):
        return pa.struct([field.with_type(_plain_type(field.type)) for field in kind])
    return kind


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """The schema rows are read with: `schema` without dictionaries or views (see the module docstring)."""
    return pa.schema([f.with_type(_plain_type(f.type)) for f in schema], metadata=schema.metadata)


def parquet_layout(url: str, storage_options: dict) -> tuple[pa.Schema, list[int]]:
    """The file's Arrow schema (as read: see plain_schema) and the row count of each row group,
    from the footer alone."""
    fs, path = filesystem(url, storage_options)
    pf = _open_parquet(fs, path, url)
    try:
        meta = pf.metadata
        return plain_schema(pf.schema_arrow), [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    finally:
        pf.close()


def plan_file_ranges(row_group_rows: list[int], split_rows: int) -> list[tuple[int, int]]:
    """Row ranges [start, end) of the splits of one file, aligned to row groups where possible."""
    ranges: list[tuple[int, int]] = []
    start = 0  # first row of the split being built
    end = 0  # end of the rows packed into it so far
    for rows in row_group_rows:
        if rows == 0:
            continue
        if end > start and end - start + rows > split_rows:
            ranges.append((start, end))
            start = end
        if rows > split_rows:
            # An oversized row group: cut it into pieces of split_rows rows, from its own start.
            piece, group_end = end, end + rows
            while group_end - piece > split_rows:
                ranges.append((piece, piece + split_rows))
                piece += split_rows
            ranges.append((piece, group_end))
            start = end = group_end
        else:
            end += rows
    if end > start:
        ranges.append((start, end))
    return ranges


def iter_parquet_rows(
    url: str,
    storage_options: dict,
    row_start: int,
    row_end: int,
    batch_rows: int,
    judged: frozenset[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Rows [row_start, row_end) of one file, in order, in batches of at most `batch_rows`,
    each with the `__row_index` column (row index within the file) appended. `judged`: the columns
    whose undecodable cells make their row an error (null_invalid_utf8); None: every column."""
    fs, path = filesystem(url, storage_options)
    pf = _open_parquet(fs, path, url)
    try:
        meta = pf.metadata
        groups: list[int] = []
        first_row = None  # file row index of the first row iter_batches will yield
        offset = 0
        for i in range(meta.num_row_groups):
            rows = meta.row_group(i).num_rows
            if offset < row_end and offset + rows > row_start:
                groups.append(i)
                if first_row is None:
                    first_row = offset
            offset += rows
        if row_end > offset:
            raise InputSchemaError(
                f"{url} has {offset} rows but the split plan expects rows up to {row_end}; the input "
                "changed after the job was planned; restore it or start the job over"
            )
        if not groups or first_row is None:
            return
        position = first_row
        stored = pf.schema_arrow
        wanted = plain_schema(stored)
        try:
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=groups, use_threads=False):
                lo = max(row_start - position, 0)
                hi = min(row_end - position, batch.num_rows)
                if hi > lo:
                    part = batch.slice(lo, hi - lo)
                    if not wanted.equals(stored):
                        part = part.cast(wanted)
                    index = pa.array(range(position + lo, position + hi), type=pa.int64())
                    yield null_invalid_utf8(
                        part.append_column(ROW_INDEX_COLUMN, index), url, position + lo, judged
                    )
                position += batch.num_rows
                if position >= row_end:
                    break
        except (pa.ArrowInvalid, pa.ArrowIOError) as exc:
            raise InputSchemaError(
                f"{url}: cannot decode rows {row_start}..{row_end} ({exc}); the file is corrupt; "
                "replace it and start the job over"
            ) from exc
    finally:
        pf.close()
