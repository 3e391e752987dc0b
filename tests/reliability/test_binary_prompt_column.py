"""A prompt column of bytes (Parquet written without string annotations, as Spark does without
spark.sql.parquet.binaryAsString) is refused with a query that decodes it, and that query works."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_kit import job_toml

from shardinfer.jobs.cli import main


def test_binary_prompt_column_names_a_query_that_decodes_it(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = ["café au lait", "two words", "naïve"]
    (tmp_path / "in").mkdir()
    table = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "prompt": pa.array([p.encode() for p in prompts], pa.binary()),
            "topic": ["a", "b", "c"],
        }
    )
    pq.write_table(table, tmp_path / "in" / "prompts.parquet")
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(tmp_path / "in"), str(tmp_path / "out")))
    assert main(["submit", "--dry-run", str(job)]) == 78
    err = capsys.readouterr().err
    suggested = re.search(r'input\.query = "(.+?)",', err)
    assert suggested is not None, err
    query = suggested.group(1)
    assert query == "SELECT * REPLACE (decode(prompt) AS prompt) FROM input"

    import duckdb

    source = table  # noqa: F841  (read by name by DuckDB below, as the readers name the input)
    decoded = duckdb.sql(query.replace("FROM input", "FROM source")).arrow().read_all()
    assert decoded.column("prompt").to_pylist() == prompts
    job.write_text(job_toml(model_dir, str(tmp_path / "in"), str(tmp_path / "out"), input={"query": query}))
    assert main(["submit", "--dry-run", str(job)]) == 0, capsys.readouterr().err
