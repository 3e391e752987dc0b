"""Rows the reader could not decode travel on as rows, carrying the reason, never as an exception.

One undecodable row (a JSONL line that is not JSON or nests too deeply, a key or type the
inferred schema lacks, a Parquet string cell that is not valid UTF-8) must not stop a job that
has millions of good ones: the pipeline turns it into an error record and goes on.

Such a row keeps its place and its `__row_index`; a batch that holds one gets one more column,
`__row_error` (string), non-null on the rows that could not be decoded. Their cells are null
where they could not be read, and only there (a JSONL line that is no object at all has none):
the id usually survives, so the error record carries the row's own id. Batches without a bad row
do not have the column, so the common path costs nothing. A cell that cannot be read in a column
the job does not read is null too, but its row is no error row (InputSpec.judged_columns).
"""

from __future__ import annotations

import pyarrow as pa

from shardinfer.splits import ROW_ERROR_COLUMN, ROW_INDEX_COLUMN


def attach_row_errors(batch: pa.RecordBatch, errors: dict[int, str]) -> pa.RecordBatch:
    """`batch` with the `__row_error` column when `errors` (row position -> reason) is not empty."""
    if not errors:
        return batch
    reasons = [errors.get(i) for i in range(batch.num_rows)]
    return batch.append_column(ROW_ERROR_COLUMN, pa.array(reasons, type=pa.string()))


def null_invalid_utf8(
    batch: pa.RecordBatch, where: str, first_row: int, judged: frozenset[str] | None = None
) -> pa.RecordBatch:
    """Null out the cells holding invalid UTF-8 (Parquet does not check it) and name them per row.

    Only full validation finds them, and it is a fast scan over the string bytes; the slow
    cell-by-cell search runs only for a batch that failed it. `first_row` is the file row index
    of the batch's first row, for the message. Only a cell of a `judged` column (every column when
    None) makes its row an error: the job reads no other, so there the null is all it takes.
    """
    try:
        batch.validate(full=True)
        return batch
    except pa.ArrowInvalid:
        pass
    columns = list(batch.columns)
    errors: dict[int, str] = {}
    for c, column in enumerate(columns):
        try:
            column.validate(full=True)
            continue
        except pa.ArrowInvalid:
            pass
        name = batch.schema.field(c).name
        bad = [i for i in range(batch.num_rows) if not _valid(column.slice(i, 1))]
        keep = pa.array([None if i in bad else i for i in range(batch.num_rows)], type=pa.int64())
        columns[c] = column.take(keep)  # a null index gives a null cell: the bad bytes are dropped
        if judged is not None and name not in judged:
            continue
        for i in bad:
            previous = errors.get(i)
            what = f"column {name!r} of row {first_row + i} in {where} is not valid UTF-8"
            errors[i] = f"{previous}; {what}" if previous else what
    fixed = pa.RecordBatch.from_arrays(columns, schema=batch.schema)
    fixed.validate(full=True)  # anything else wrong with the batch is the file's problem, not a row's
    return attach_row_errors(fixed, {i: f"{why}; fix the text in the input" for i, why in errors.items()})


def _valid(cell: pa.Array) -> bool:
    try:
        cell.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def split_off_bad_rows(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, dict[int, str]]:
    """(the good rows without `__row_error`, {__row_index: reason} of the bad ones)."""
    index = batch.schema.get_field_index(ROW_ERROR_COLUMN)
    if index < 0:
        return batch, {}
    reasons = batch.column(index)
    good = reasons.is_null()
    bad_rows = batch.filter(pa.compute.invert(good))
    bad = dict(
        zip(
            bad_rows.column(ROW_INDEX_COLUMN).to_pylist(),
            bad_rows.column(ROW_ERROR_COLUMN).to_pylist(),
            strict=True,
        )
    )
    return batch.filter(good).remove_column(index), bad


def merge_bad_rows(result: pa.Table, bad: dict[int, str]) -> pa.Table:
    """Put rows set aside before a query back in `__row_index` order, all-null but for the reason.

    The query is row-wise and keeps input order, so ordering by `__row_index` restores the
    input order of the merged rows.
    """
    if not bad:
        return result
    indexes = sorted(bad)
    columns = {
        name: (
            pa.array(indexes, type=pa.int64())
            if name == ROW_INDEX_COLUMN
            else pa.nulls(len(indexes), type=result.schema.field(name).type)
        )
        for name in result.column_names
    }
    set_aside = pa.table(columns, schema=result.schema)
    merged = pa.concat_tables([result, set_aside]).sort_by(ROW_INDEX_COLUMN)
    reasons = [bad.get(i) for i in merged.column(ROW_INDEX_COLUMN).to_pylist()]
    return merged.append_column(ROW_ERROR_COLUMN, pa.array(reasons, type=pa.string()))
