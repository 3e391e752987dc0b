"""What a submit (and its dry run) warns of before it runs: a job that runs as asked but most likely
not as meant. Warnings only: each of these jobs still runs (exit 0)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_kit import job_toml, standard_job, write_shards

from shardinfer.jobs.cli import main
from shardinfer.jobs.spec import load_toml, resolve
from shardinfer.pipeline.job import open_job, write_plan
from shardinfer.writers.job_file import utc_now
from shardinfer.writers.run_records import create_run_record


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _warnings(text: str) -> list[dict[str, Any]]:
    return [r for r in _json_lines(text) if r.get("level") == "warning"]


def test_a_run_date_in_the_output_path_is_warned_of(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # ds was filled with today's date (UTC) in silence: a run interrupted before midnight and rerun
    # after it planned a new job in a new folder.
    job = tmp_path / "job.toml"
    job.write_text(
        job_toml(model_dir, str(shards), str(tmp_path / "out" / "job_{ds}"), job={"split_rows": 8})
    )
    assert main(["submit", "--dry-run", "--run-id", "r1", str(job)]) == 0
    captured = capsys.readouterr()
    ds = next(line for line in captured.out.splitlines() if line.startswith("ds = ")).split('"')[1]
    assert (
        f"output.path holds {{ds}}, and no job.ds was given: this run fills it with today's date (UTC), {ds}, "
        f"and writes to {tmp_path / 'out' / f'job_{ds}'}" in captured.err
    )
    assert f"to resume it, rerun with --conf job.ds={ds}" in captured.err
    # Under --log-format json it is a warning record, as the {run_id} one is.
    assert main(["submit", "--dry-run", "--run-id", "r1", "--log-format", "json", str(job)]) == 0
    (record,) = [w for w in _warnings(capsys.readouterr().err) if "{ds}" in w["msg"]]
    assert record["output"] == str(tmp_path / "out" / f"job_{ds}")
    # A date given is no warning; the run itself warns as its dry run does.
    assert main(["submit", "--dry-run", "--run-id", "r1", "--conf", "job.ds=2024-05-06", str(job)]) == 0
    assert "{ds}" not in capsys.readouterr().err
    assert main(["submit", "--run-id", "r1", str(job)]) == 0
    ran = capsys.readouterr().err.split("to resume it, rerun with --conf job.ds=")[1].split()[0]
    assert (tmp_path / "out" / f"job_{ran}" / "_SUCCESS").is_file()  # the date it named is the one used


def test_a_ds_not_written_with_dashes_is_warned_of_and_taken_as_given(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # job.ds=20240506 (Airflow's ds_nodash) fills {ds} as written: another folder than 2024-05-06's.
    # Taken as given (a scheduled job planned with it must still resume), with a warning.
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(shards), str(tmp_path / "out" / "{ds}"), job={"split_rows": 8}))
    assert main(["submit", "--run-id", "r1", "--conf", "job.ds=20240506", str(job)]) == 0
    err = capsys.readouterr().err
    assert (
        "job.ds='20240506' is not written YYYY-MM-DD: {ds} in output.path is filled with it as written" in err
    )
    assert "--conf job.ds=2024-05-06 (Airflow's {{ ds }}, not {{ ds_nodash }})" in err
    assert (tmp_path / "out" / "20240506" / "_SUCCESS").is_file()
    assert main(["submit", "--dry-run", "--run-id", "r2", "--conf", "job.ds=2024-W19-1", str(job)]) == 0
    assert "--conf job.ds=2024-05-06 would use another location" in capsys.readouterr().err
    assert main(["submit", "--dry-run", "--run-id", "r3", "--conf", "job.ds=2024-05-06", str(job)]) == 0
    assert "not written YYYY-MM-DD" not in capsys.readouterr().err
    assert main(["validate", "--conf", "job.ds=2024-13-01", str(job)]) == 78
    assert "job.ds='2024-13-01' is not a date: use YYYY-MM-DD" in capsys.readouterr().err


def _planned_with_a_run(tmp_path: Path, model_dir: Path, shards: Path, **record: Any) -> tuple[Path, Path]:
    """A planned job whose output holds the record of run `other` (from another host), as written."""
    job, out = standard_job(tmp_path, model_dir, str(shards), job={"split_rows": 8})
    planned = open_job(resolve(load_toml(str(job))).config)
    write_plan(planned, "first")
    fields = {"run_id": "other", "state": "running", "started": utc_now(), "heartbeat": utc_now()}
    fields.update(host="another-host", pid=1, workers=1, generation=planned.generation, **record)
    create_run_record(planned.store, "other", fields)
    return job, out


def test_a_second_run_beside_a_live_one_is_warned_of(
    tmp_path: Path,
    model_dir: Path,
    shards: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A second submit computed the same uncommitted splits beside the live run, in silence.
    import shardinfer.jobs.run_record as run_record

    monkeypatch.setattr(run_record, "STALE_AFTER_S", 10.0**9)  # however slow the test, the heartbeat is fresh
    job, out = _planned_with_a_run(tmp_path, model_dir, shards)
    assert main(["status", str(out)]) == 0
    assert f"{out}: running" in capsys.readouterr().out  # the run `status` calls running is the one warned of
    assert main(["submit", "--dry-run", str(job)]) == 0
    err = capsys.readouterr().err
    assert "another run, other, is running at this output (its last heartbeat" in err
    assert "from host another-host): this run would compute the same uncommitted splits beside it" in err
    assert main(["submit", "--dry-run", "--log-format", "json", str(job)]) == 0
    (record,) = [w for w in _warnings(capsys.readouterr().err) if "another run" in w["msg"]]
    assert record["other_run_id"] == "other" and record["heartbeat_age_s"] >= 0
    # Not refused: a scheduler's retry after a run that died must run.
    assert main(["submit", str(job)]) == 0
    assert "another run, other, is running" in capsys.readouterr().err


def test_ended_and_stale_runs_are_not_warned_of(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = "2020-01-01T00:00:00.000Z"
    for name, record in (("stale", {"heartbeat": stale}), ("ended", {"ended": utc_now(), "state": "failed"})):
        (tmp_path / name).mkdir()
        job, _ = _planned_with_a_run(tmp_path / name, model_dir, shards, **record)
        assert main(["submit", "--dry-run", str(job)]) == 0
        assert "another run" not in capsys.readouterr().err, name


def _float_ids(path: Path, column: str) -> Path:
    """Ids as pandas writes an integer column with a null: float64."""
    ids = pa.array([101.0, 102.0, None, 104.0], pa.float64())
    pq.write_table(
        pa.table({column: ids, "prompt": ["a b", "c d", "e f", "g h"], "topic": list("wxyz")}), path
    )
    return path


@pytest.mark.parametrize(("column", "sql"), [("qid", "qid"), ("q id", '"q id"')])
def test_a_float_id_column_is_warned_of_with_the_query_that_casts_it(
    tmp_path: Path, model_dir: Path, column: str, sql: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Its row ids are written "101.0" (and "101" from JSONL): they did not join back to the input.
    data = _float_ids(tmp_path / "in.parquet", column)
    job, _ = standard_job(tmp_path, model_dir, str(data), input={"id_column": column})
    assert main(["submit", "--dry-run", str(job)]) == 0
    err = capsys.readouterr().err
    query = f"SELECT * REPLACE (CAST({sql} AS BIGINT) AS {sql}) FROM input"
    assert (
        f"input.id_column={column!r} is a column of double: each row_id is written as the float's text" in err
    )
    assert f"input.query = {json.dumps(query)}" in err
    # The query it gives ends the warning: it is judged after the query.
    assert main(["submit", "--dry-run", "--conf", f"input.query={query}", str(job)]) == 0
    assert "row_id is written as the float's text" not in capsys.readouterr().err


def test_the_dry_run_shows_every_sampling_value_with_its_source(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # max_tokens left out was 16 without a word: the dry run showed only the keys the spec set.
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(shards), str(tmp_path / "out")).replace("max_tokens = 5\n", ""))
    assert main(["submit", "--dry-run", "--conf", "sampling.top_p=0.9", str(job)]) == 0
    out = capsys.readouterr().out
    assert "max_tokens = 16  # default" in out
    assert "temperature = 0.8  # job file" in out
    assert "top_p = 0.9  # --conf" in out
    assert "n = 1  # default" in out
    assert "seed =" not in out.split("[sampling]")[1].split("[output]")[0]  # job.seed is the seed
    assert main(["submit", "--dry-run", "--log-format", "json", str(job)]) == 0
    (plan,) = [r for r in _json_lines(capsys.readouterr().out) if r.get("event") == "dry_run"]
    assert (
        plan["spec"]["sampling"]["max_tokens"] == 16 and plan["sources"]["sampling.max_tokens"] == "default"
    )
    # A value the checkpoint sets is credited to it: the job then samples greedily, and n samples
    # of a row are one text, which the run warns of.
    model = tmp_path / "greedy-model"
    shutil.copytree(model_dir, model)
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(
        json.dumps({**config, "do_sample": False, "max_new_tokens": 7})
    )
    text = job_toml(model, str(shards), str(tmp_path / "out2"))
    job.write_text(text.replace("temperature = 0.8\n", "").replace("max_tokens = 5\n", ""))
    assert main(["submit", "--dry-run", "--conf", "sampling.n=3", str(job)]) == 0
    captured = capsys.readouterr()
    assert "temperature = 0.0  # model's generation_config.json" in captured.out
    assert "max_tokens = 7  # model's generation_config.json" in captured.out
    assert (
        "sampling.temperature=0 (model's generation_config.json) with sampling.n=3: greedy sampling gives n "
        "identical samples, so each row's 3 samples will be the same text; set temperature > 0"
        in captured.err
    )


def test_greedy_samples_are_warned_of_only_with_several_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model_dir: Path
) -> None:
    data = write_shards(tmp_path / "in", files=1, rows=4)
    job, _ = standard_job(tmp_path, model_dir, str(data))
    for confs, warned in (
        (["sampling.temperature=0", "sampling.n=2"], True),
        (["sampling.temperature=0"], False),
        (["sampling.n=2"], False),  # temperature 0.8: samples differ
    ):
        argv = [item for conf in confs for item in ("--conf", conf)]
        assert main(["submit", "--dry-run", *argv, str(job)]) == 0
        err = capsys.readouterr().err
        assert ("greedy sampling gives n identical samples" in err) is warned, confs
        assert ("sampling.temperature=0 (--conf) with sampling.n=2" in err) is warned, confs
