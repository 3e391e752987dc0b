"""Repeated row ids: counted in the summary; with job.unique_ids = true an error (exit 65)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pipeline_kit import cli, standard_job


def test_repeated_ids_are_counted_or_refused(tmp_path: Path, model_dir: Path) -> None:
    ids = ["a", "b", "a", "c", "b", "a"]  # by hand: "a" repeats twice, "b" once -> 3 repeated rows
    rows = [{"id": i, "prompt": f"fox {k}", "topic": "t"} for k, i in enumerate(ids)]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in" / "a.parquet", row_group_size=2)
    # Two samples per row: 12 records, but repeats are counted per input row, not per record.
    job, out = standard_job(
        tmp_path, model_dir, str(tmp_path / "in"), job={"split_rows": 2}, sampling={"n": 2}
    )
    counted = cli("submit", str(job))
    assert counted.returncode == 0, counted.stderr
    summary = json.loads((out / "_SUCCESS").read_text())["summary"]
    assert summary["records"] == 12
    assert summary["duplicate_row_ids"] == 3
    assert "duplicate ids  3 input row(s)" in counted.stdout
    strict = cli(
        "submit", "--conf", "job.unique_ids=true", "--conf", f"output.path={tmp_path / 'strict'}", str(job)
    )
    assert strict.returncode == 65, strict.stderr
    assert "3 input row(s) repeat the row id of an earlier row (first: 'a')" in strict.stderr
    assert not (tmp_path / "strict" / "_SUCCESS").exists()
    # Unique ids pass the strict check, and the count says so.
    unique = cli(
        "submit",
        "--conf", "job.unique_ids=true",
        "--conf", "input.id_column=prompt",
        "--conf", f"output.path={tmp_path / 'unique'}",
        str(job),
    )  # fmt: skip
    assert unique.returncode == 0, unique.stderr
    assert json.loads((tmp_path / "unique" / "_SUCCESS").read_text())["summary"]["duplicate_row_ids"] == 0
