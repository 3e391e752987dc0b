"""The input schema is read once per job and handed to workers, which then read no input to learn it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardinfer.pipeline.config import JobConfig
from shardinfer.pipeline.job import open_job, output_schema_of, schema_from_text, schema_to_text, write_plan


def _config(tmp_path: Path, model_dir: Path) -> JobConfig:
    table = pa.table({"id": ["a", "b"], "prompt": ["x", "y"], "topic": [1, 2]})
    pq.write_table(table, tmp_path / "in.parquet")
    return JobConfig.from_dict(
        {
            "input": {
                "path": str(tmp_path / "in.parquet"),
                "id_column": "id",
                "prompt_column": "prompt",
                "passthrough_columns": ["topic"],
            },
            "model": {"path": str(model_dir), "device": "cpu", "dtype": "float32"},
            "output": {"path": str(tmp_path / "out")},
        }
    )


def test_a_worker_uses_the_schema_it_was_handed(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path, model_dir)
    parent = open_job(config)
    write_plan(parent, "r1")
    expected = pa.schema([("id", pa.string()), ("prompt", pa.string()), ("topic", pa.int64())])
    assert parent.input_schema.names == [*expected.names, "__row_index"]
    text = schema_to_text(parent.input_schema)
    assert schema_from_text(text).equals(parent.input_schema)

    import shardinfer.readers.splits as reader_splits

    def no_reading(*args: object, **kwargs: object) -> pa.Schema:
        raise AssertionError("a worker handed the schema must not read it from the input")

    monkeypatch.setattr(reader_splits, "read_schema", no_reading)
    worker = open_job(config, plan=False)
    worker.input_schema_ = schema_from_text(text)
    out = output_schema_of(worker)
    assert out.field("topic").type == pa.int64() and out.names[-1] == "topic"
