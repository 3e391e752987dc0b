"""job.incremental over a rewritten input file: only the rows whose ids the output does not hold
are planned, as new splits after the committed ones; without an id column the file is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_kit import prompt_rows, write_shards

from shardinfer.errors import ConfigError, InputChanged
from shardinfer.pipeline.config import JobConfig
from shardinfer.pipeline.job import open_job, write_plan
from shardinfer.readers.splits import read_split
from shardinfer.splits import Split
from shardinfer.writers import output_schema


def _config(inp: Path, out: Path, **job: Any) -> JobConfig:
    return JobConfig.from_dict(
        {
            "job": {"seed": 3, "split_rows": 4, "run_id": "r1", **job},
            "input": {"path": str(inp), "id_column": "id", "prompt_column": "prompt"},
            "model": {"path": "", "device": "cpu", "dtype": "float32"},
            "sampling": {"temperature": 0.5, "max_tokens": 3},
            "output": {"path": str(out)},
        }
    )


def _commit_all(cfg: JobConfig) -> list[Split]:
    """Plan the job and commit every split with the ids its rows have (no engine needed)."""
    job = open_job(cfg)
    write_plan(job, "r1")
    for split in job.splits:
        ids = [b.column("id").to_pylist() for b in read_split(split, job.input_spec)]
        rows = [{"row_id": i, "sample_index": 0, "status": "ok"} for chunk in ids for i in chunk]
        table = pa.Table.from_pylist(rows, schema=output_schema())
        assert job.store.commit(split, job.store.write_part(split, "a", table, {}))
    return job.splits


def _rewrite(path: Path, rows: list[dict[str, Any]]) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=4)


def test_rows_with_new_ids_of_a_rewritten_file_become_new_splits(tmp_path: Path, model_dir: Path) -> None:
    shards = write_shards(tmp_path / "in", files=2, rows=8)
    cfg = _config(shards, tmp_path / "out")
    cfg.model.path = str(model_dir)
    old = _commit_all(cfg)
    assert [(s.path.endswith("01.parquet"), s.row_start) for s in old] == [
        (False, 0), (False, 4), (True, 0), (True, 4)
    ]  # fmt: skip
    before = prompt_rows(1, 8)
    changed_prompt = {**before[5], "prompt": "another prompt for an old id"}
    new = [{"id": f"n{k}", "prompt": f"new row {k}", "topic": "new"} for k in range(3)]
    # Row indexes 4, 9 and 10 hold the new ids; an old id's prompt changed, and stays committed.
    _rewrite(
        shards / "prompts-01.parquet",
        before[:4] + new[:1] + before[4:5] + [changed_prompt] + before[6:] + new[1:],
    )
    url = str(shards / "prompts-01.parquet")
    with pytest.raises(InputChanged, match=f"changed: {url}"):
        open_job(cfg)
    cfg.job.incremental = True
    job = open_job(cfg)
    assert job.growth is not None and job.growth.rewritten_rows == {url: 3}
    # By hand: the file's ranges are rows [0,4) [4,8) [8,11); the new rows fill one split over two.
    assert job.splits == [*old, Split(4, 1, url, 4, 11, None, (4, 9, 10))]
    write_plan(job, "r2")
    stored = job.store.read_job()
    assert stored is not None and stored["superseded_splits"] == [2, 3]
    assert stored["splits"][4]["only_rows"] == [4, 9, 10]
    assert "only_rows" not in stored["splits"][0]  # plans without it keep their records
    rows = [r for b in read_split(job.splits[4], job.input_spec) for r in b.to_pylist()]
    assert [(r["id"], r["__row_index"]) for r in rows] == [("n0", 4), ("n1", 9), ("n2", 10)]
    # The listing now holds the new version: a plain rerun resumes the grown plan.
    cfg.job.incremental = False
    again = open_job(cfg)
    assert again.state == "resume" and again.splits == job.splits and again.committed == {0, 1, 2, 3}
    # A removed file is still refused: its committed rows would outlive their input.
    (shards / "prompts-00.parquet").unlink()
    cfg.job.incremental = True
    with pytest.raises(InputChanged, match=r"files were removed .*prompts-00\.parquet"):
        open_job(cfg)


def test_a_rewritten_file_without_an_id_column_is_refused(tmp_path: Path, model_dir: Path) -> None:
    shards = write_shards(tmp_path / "in", files=2, rows=8)
    cfg = _config(shards, tmp_path / "out", incremental=True)
    cfg.model.path = str(model_dir)
    cfg.input.id_column = ""
    _commit_all(cfg)
    _rewrite(shards / "prompts-01.parquet", prompt_rows(1, 8) + prompt_rows(2, 2))
    with pytest.raises(InputChanged) as info:
        open_job(cfg)
    message = str(info.value)
    assert str(shards / "prompts-01.parquet") in message
    assert "no input.id_column" in message and "put new rows into new files" in message
    assert "job.start_over=true" in message


def test_a_rewritten_first_file_is_checked_against_the_planned_schema(
    tmp_path: Path, model_dir: Path
) -> None:
    shards = write_shards(tmp_path / "in", files=2, rows=8)
    cfg = _config(shards, tmp_path / "out", incremental=True)
    cfg.model.path = str(model_dir)
    _commit_all(cfg)
    # The first split's file itself gets another column: the check must not read its new version
    # as the planned schema.
    _rewrite(shards / "prompts-00.parquet", [{**r, "extra": 1} for r in prompt_rows(0, 9)])
    with pytest.raises(ConfigError, match=r"prompts-00\.parquet has another schema"):
        open_job(cfg)
