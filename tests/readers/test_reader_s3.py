"""Readers against a real S3 API (moto on 127.0.0.1), directly and through a flaky connection."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import s3fs

from shardinfer.readers import InputSpec, list_input_files, plan_splits, read_split


def _put_inputs(fs: s3fs.S3FileSystem, bucket: str) -> dict[str, pa.Table]:
    tables = {}
    for name, start in [("in/b.parquet", 100), ("in/a.parquet", 0)]:
        table = pa.table({"prompt": [f"p{start + i}" for i in range(12)]})
        buf = io.BytesIO()
        pq.write_table(table, buf, row_group_size=4)
        fs.pipe_file(f"{bucket}/{name}", buf.getvalue())
        tables[f"s3://{bucket}/{name}"] = table
    fs.pipe_file(f"{bucket}/in/_SUCCESS", b"{}")
    fs.pipe_file(f"{bucket}/in/rows.jsonl", b'{"prompt": "x"}\n')
    return tables


def test_plan_and_read_on_s3(s3_bucket) -> None:
    tables = _put_inputs(s3fs.S3FileSystem(**s3_bucket.storage_options), s3_bucket.name)
    spec = InputSpec(s3_bucket.url("in/*.parquet"), storage_options=s3_bucket.storage_options)
    assert list_input_files(spec) == sorted(tables)
    # A directory: hidden names skipped, only the declared format kept.
    directory = InputSpec(s3_bucket.url("in"), format="parquet", storage_options=s3_bucket.storage_options)
    assert list_input_files(directory) == sorted(tables)
    splits = plan_splits(spec, split_rows=8)
    assert [(s.file_index, s.row_start, s.row_end) for s in splits] == [
        (0, 0, 8),
        (0, 8, 12),
        (1, 0, 8),
        (1, 8, 12),
    ]
    for s in splits:
        got = pa.Table.from_batches(list(read_split(s, spec, batch_rows=3)))
        assert got.drop_columns(["__row_index"]).equals(tables[s.path].slice(s.row_start, s.num_rows))


def test_reads_survive_throttling_and_dropped_connections(s3_bucket, fault_proxy) -> None:
    tables = _put_inputs(s3fs.S3FileSystem(**s3_bucket.storage_options), s3_bucket.name)
    proxy = fault_proxy(every=2, faults=("503", "drop", "500"))
    options = proxy.storage_options()
    spec = InputSpec(f"s3://{s3_bucket.name}/in/*.parquet", storage_options=options)
    splits = plan_splits(spec, split_rows=8)
    rows = [r["prompt"] for s in splits for b in read_split(s, spec) for r in b.to_pylist()]
    assert rows == [f"p{i}" for i in range(12)] + [f"p{100 + i}" for i in range(12)]
    assert len(proxy.faults_injected) >= 3
    assert sorted(tables) == [s.path for s in splits[::2]]
