"""The reader stage's API: plan an input into splits once, then stream any split's rows.

    files  = list_input_files(spec)            # sorted URLs
    splits = plan_splits(spec, split_rows)     # stored in _job.json by the job, never re-planned on resume
    for batch in read_split(split, spec):      # record batches with __row_index, in input order
        ...

Planning also checks what can be checked before any GPU time is spent: every file is readable,
all files share one schema, the columns the job names exist, and the query is row-wise.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from shardinfer.errors import InputColumnError, InputQueryError, InputSchemaError
from shardinfer.readers.jsonl_source import infer_jsonl_schema, iter_jsonl_rows, scan_jsonl
from shardinfer.readers.listing import list_input_files, resolve_format
from shardinfer.readers.parquet_source import iter_parquet_rows, parquet_layout, plan_file_ranges
from shardinfer.readers.row_errors import merge_bad_rows, split_off_bad_rows
from shardinfer.readers.spec import InputSpec
from shardinfer.splits import RESERVED_COLUMNS, ROW_INDEX_COLUMN, Split

if TYPE_CHECKING:
    from shardinfer.readers.query import QueryRunner

__all__ = ["InputSpec", "Split", "list_input_files", "plan_splits", "read_schema", "read_split"]


def _file_schema(url: str, spec: InputSpec) -> pa.Schema:
    if resolve_format(url, spec.format) == "parquet":
        return parquet_layout(url, spec.storage_options)[0]
    return infer_jsonl_schema(url, spec.storage_options)


def _row_schema(file_schema: pa.Schema, url: str, spec: InputSpec) -> pa.Schema:
    """The schema of the batches read_split yields for this file: __row_index added, query applied."""
    for reserved in RESERVED_COLUMNS:
        if reserved in file_schema.names:
            raise InputSchemaError(
                f"{url} has a column named {reserved!r}, a name the reader reserves; rename it"
            )
    schema = file_schema.append(pa.field(ROW_INDEX_COLUMN, pa.int64()))
    if spec.query:
        # DuckDB is imported only by jobs that ask for a query: it costs start-up time otherwise.
        from shardinfer.readers.query import QueryRunner

        runner = QueryRunner(spec.query, url)
        try:
            schema = runner.output_schema(schema)
        finally:
            runner.close()
    _check_unique_names(schema, url, spec)
    missing = [c for c in spec.required_columns() if c not in schema.names]
    if missing:
        after = " after input.query" if spec.query else ""
        available = [n for n in schema.names if n != ROW_INDEX_COLUMN]
        raise InputColumnError(
            f"{url}: column(s) {missing} not found{after}; available columns: {available}; fix "
            "input.id_column / input.prompt_column / input.messages_column or the query",
            missing,
            available,
        )
    _check_id_type(schema, spec)
    return schema


def _check_unique_names(schema: pa.Schema, url: str, spec: InputSpec) -> None:
    """Each column name once: a row is read as a dict by name, where a repeated name would keep one
    of its columns and silently drop the other."""
    repeated = sorted({n for n in schema.names if schema.names.count(n) > 1})
    if not repeated:
        return
    if spec.query:
        raise InputQueryError(
            f"input.query {spec.query!r} gives the column name(s) {repeated} to more than one column; "
            "give each selected column its own name (e.g. `SELECT * EXCLUDE (prompt), upper(prompt) AS prompt`)"
        )
    raise InputSchemaError(
        f"{url} has more than one column named {repeated}; rewrite the file with one column per name"
    )


def _check_id_type(schema: pa.Schema, spec: InputSpec) -> None:
    """A row id is the id column's value as text: a scalar's text is the value itself, but bytes or
    a nested value would become its Python repr (`b'x'`, `{'a': 1}`), an id nobody can look up."""
    if not spec.id_column:
        return
    kind = schema.field(spec.id_column).type
    binary = pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind)
    if pa.types.is_nested(kind) or binary:
        raise InputColumnError(
            f"input.id_column={spec.id_column!r} is a column of {kind}; row ids must be strings or numbers: "
            "point input.id_column at such a column, or derive one in input.query (e.g. "
            f"`SELECT *, CAST({spec.id_column} AS VARCHAR) AS row_key FROM input` with id_column = 'row_key')"
        )


def _check_same_schema(first: pa.Schema, first_url: str, other: pa.Schema, url: str) -> None:
    if first.equals(other, check_metadata=False):
        return
    a = {f.name: str(f.type) for f in first}
    b = {f.name: str(f.type) for f in other}
    diff = sorted(
        f"{name}: {a.get(name, 'absent')} vs {b.get(name, 'absent')}"
        for name in set(a) | set(b)
        if a.get(name) != b.get(name)
    )
    raise InputSchemaError(
        f"{url} does not have the same columns as {first_url} ({'; '.join(diff) or 'column order differs'}); "
        "every input file must share one schema: rewrite the odd files or select columns with input.query"
    )


def plan_splits(spec: InputSpec, split_rows: int) -> list[Split]:
    """Cut the input into splits of at most `split_rows` rows, in file order, aligned to Parquet row groups.

    For JSONL a split is a range of `split_rows` lines. Splits never span two files.
    """
    if split_rows < 1:
        raise ValueError(f"job.split_rows={split_rows}: must be a positive number of rows (e.g. 10000)")
    files = list_input_files(spec)
    splits: list[Split] = []
    first: tuple[pa.Schema, str] | None = None
    for file_index, url in enumerate(files):
        fmt = resolve_format(url, spec.format)
        if fmt == "parquet":
            schema, groups = parquet_layout(url, spec.storage_options)
            ranges = plan_file_ranges(groups, split_rows)
            offsets: list[int | None] = [None] * len(ranges)
        else:
            schema = infer_jsonl_schema(url, spec.storage_options)
            lines, offsets = scan_jsonl(url, spec.storage_options, split_rows)
            ranges = [(k * split_rows, min((k + 1) * split_rows, lines)) for k in range(len(offsets))]
        # An empty JSONL file has no columns to check or compare (and no split).
        has_columns = bool(schema.names) or fmt == "parquet"
        if has_columns and first is None:
            first = (schema, url)
            _row_schema(schema, url, spec)  # columns and query checked once, on the first such file
        elif has_columns and first is not None:
            _check_same_schema(first[0], first[1], schema, url)
        for (start, end), offset in zip(ranges, offsets, strict=True):
            splits.append(Split(len(splits), file_index, url, start, end, offset))
    return splits


def read_schema(spec: InputSpec, path: str | None = None) -> pa.Schema:
    """The schema of the batches `read_split` yields (including __row_index, after the query).

    `path` is any input file (e.g. a split's path, so a resumed job need not list the input again);
    by default the first listed file that has columns (an empty JSONL file has none).
    """
    if path is not None:
        return _row_schema(_file_schema(path, spec), path, spec)
    files = list_input_files(spec)
    for url in files:
        schema = _file_schema(url, spec)
        if schema.names or resolve_format(url, spec.format) == "parquet":
            return _row_schema(schema, url, spec)
    # Only empty JSONL files: their columns are the empty schema's.
    return _row_schema(_file_schema(files[0], spec), files[0], spec)


def read_split(split: Split, spec: InputSpec, batch_rows: int = 1024) -> Iterator[pa.RecordBatch]:
    """Stream the split's rows in input order, at most `batch_rows` per batch, with `__row_index`.

    Memory is bounded by one batch (plus one Parquet row group), never the whole file. With
    `input.query`, each batch goes through the query; batches it filters to nothing are skipped.
    Rows the reader could not decode (row_errors.py) bypass the query, which could not judge them,
    and stay in the output as error rows; so do rows the query itself fails on (_query_rows). Without
    a query, a cell the reader cannot decode in a column the job does not read is null instead
    (InputSpec.judged_columns).
    """
    if batch_rows < 1:
        raise ValueError(f"batch_rows={batch_rows}: must be a positive number of rows")
    judged = spec.judged_columns()
    if resolve_format(split.path, spec.format) == "parquet":
        source = iter_parquet_rows(
            split.path, spec.storage_options, split.row_start, split.row_end, batch_rows, judged
        )
    else:
        source = iter_jsonl_rows(
            split.path,
            spec.storage_options,
            split.row_start,
            split.row_end,
            split.byte_offset,
            batch_rows,
            judged,
        )
    if split.only_rows is not None:
        source = _only_rows(source, split.only_rows)
    if not spec.query:
        yield from source
        return
    from shardinfer.readers.query import QueryRunner

    runner = QueryRunner(spec.query, split.path)
    try:
        for batch in source:
            good, bad = split_off_bad_rows(batch)
            result = merge_bad_rows(_query_rows(runner, good, bad), bad)
            for out in result.to_batches(max_chunksize=batch_rows):
                if out.num_rows:
                    yield out
    finally:
        runner.close()


def _query_rows(runner: QueryRunner, good: pa.RecordBatch, bad: dict[int, str]) -> pa.Table:
    """The query over `good`; when a value makes DuckDB fail on the batch (text it cannot convert,
    say), the query row by row instead, each row it fails on added to `bad` with DuckDB's reason:
    one bad value must not stop the job, and as the query is row-wise the other rows' results are
    what the whole batch would give. A batch none of whose rows passes, or any other failure
    (memory, DuckDB itself), stops the job."""
    from shardinfer.readers.query import QueryFailed

    try:
        return runner(good)
    except QueryFailed as exc:
        if good.num_rows == 0 or not exc.by_value:
            raise
        whole_batch = exc
    results = []
    for i in range(good.num_rows):
        row = good.slice(i, 1)
        try:
            results.append(runner(row))
        except QueryFailed as exc:
            if not exc.by_value:
                raise
            index = row.column(ROW_INDEX_COLUMN)[0].as_py()
            reason = exc.detail.strip().splitlines()[0] if exc.detail.strip() else "failed"
            bad[index] = (
                f"input.query failed on this row: {reason}; fix the value in the input, or make the query "
                "accept it (e.g. TRY_CAST instead of CAST gives null)"
            )
    if not results and good.num_rows > 1:
        # Not one row passes: the query is wrong for this input, not a value. Stop with DuckDB's
        # message rather than reading the whole input a row at a time into error records.
        raise whole_batch
    if not results:
        return runner(good.slice(0, 0))
    return pa.concat_tables(results)


def _only_rows(source: Iterator[pa.RecordBatch], rows: tuple[int, ...]) -> Iterator[pa.RecordBatch]:
    """The batches' rows whose `__row_index` is one of `rows` (before any query: the plan chose them
    among the rows the query sees, and the query is row-wise)."""
    chosen = pa.array(rows, pa.int64())
    for batch in source:
        kept = batch.filter(pc.is_in(batch.column(ROW_INDEX_COLUMN), value_set=chosen))
        if kept.num_rows:
            yield kept
