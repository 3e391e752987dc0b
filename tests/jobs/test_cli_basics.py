"""CLI end to end through subprocess: exit-code classes, precedence, dry runs, re-submission."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pipeline_kit import cli, committed_rows, job_toml

from shardinfer.engine.sampling_noise import derive_seed
from shardinfer.jobs.cli import main


def test_usage_errors_exit_64(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("submit", "--no-such-flag", "x.toml").returncode == 64  # the real process, once
    assert main(["submit", str(tmp_path / "missing.toml")]) == 64
    job = tmp_path / "job.toml"
    job.write_text(job_toml("m", "in", "out"))
    assert main(["submit", "--conf", "temperature0.5", str(job)]) == 64
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main(["submit", "--master", "yarn", str(job)]) == 64
    assert main([]) == 64


def test_unexpected_failure_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shardinfer.jobs.cli as cli_module

    def broken(*args: Any) -> int:
        raise RuntimeError("something nobody planned for")

    monkeypatch.setattr(cli_module, "_submit", broken)
    job = tmp_path / "job.toml"
    job.write_text(job_toml("m", "in", "out"))
    assert main(["submit", str(job)]) == 1
    assert "RuntimeError: something nobody planned for" in capsys.readouterr().err


def test_bad_config_exits_78_naming_nearest_key(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(shards), str(tmp_path / "out"), sampling={"temprature": 0.5}))
    result = cli("submit", str(job))  # the real process, once
    assert result.returncode == 78
    assert "sampling.temprature" in result.stderr and "'temperature'" in result.stderr
    job.write_text(job_toml(model_dir, str(shards), str(tmp_path / "out")))
    assert main(["submit", "--conf", "sampler.top_p=0.5", str(job)]) == 78
    assert "'sampling'" in capsys.readouterr().err
    assert main(["submit", "--conf", "sampling.top_p=1.5", str(job)]) == 78
    assert "top_p" in capsys.readouterr().err
    assert main(["submit", "--conf", f"model.path={tmp_path / 'nope'}", str(job)]) == 78
    assert "model.path" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_missing_input_exits_66(tmp_path: Path, model_dir: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(tmp_path / "no-such-dir" / "*.parquet"), str(tmp_path / "out")))
    result = cli("submit", str(job))
    assert result.returncode == 66, result.stderr
    assert main(["status", str(tmp_path / "out")]) == 66


def test_dry_run_shows_precedence_and_writes_nothing(tmp_path: Path, model_dir: Path, shards: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        job_toml(
            model_dir,
            str(shards),
            str(tmp_path / "out" / "{ds}" / "{run_id}"),
            sampling={"temperature": 0.9, "top_p": 0.9, "top_k": 5},
        )
    )
    props = tmp_path / "defaults.conf"
    props.write_text("# spark-defaults style\nsampling.temperature 0.5\nsampling.top_p=0.7\n")
    result = cli(
        "submit",
        "--dry-run",
        "--properties-file",
        str(props),
        "--conf",
        "sampling.temperature=0.25",
        "--conf",
        "job.ds=2024-05-06",
        "--run-id",
        "scheduled__1",
        str(job),
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "temperature = 0.25  # --conf" in out
    assert "top_p = 0.7  # properties file" in out
    assert "top_k = 5  # job file" in out
    assert f'"{tmp_path / "out" / "2024-05-06" / "scheduled__1"}"' in out
    assert "# plan: 6 split(s)" in out
    assert not (tmp_path / "out").exists()


def test_generate_without_a_job_file(tmp_path: Path, model_dir: Path, shards: Path) -> None:
    out = tmp_path / "out"
    result = cli(
        "generate",
        "--model",
        str(model_dir),
        "--input",
        str(shards / "prompts-00.parquet"),
        "--output",
        str(out),
        "--conf",
        "sampling.max_tokens=3",
        "--conf",
        "sampling.temperature=0",
        "--conf",
        "input.id_column=id",
        "--log-format",
        "json",
    )
    assert result.returncode == 0, result.stderr
    rows = committed_rows(str(out))
    assert [r["row_id"] for r in rows] == [f"f0-{i:03d}" for i in range(8)]
    assert all(r["status"] == "ok" and r["completion_tokens"] == 3 for r in rows)
    # Seeds are the documented derivation, per row: hash(job.seed=0 default, row_id, sample 0).
    assert [r["seed"] for r in rows] == [derive_seed(0, r["row_id"], 0) for r in rows]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["event"] == "summary" and summary["rows_ok"] == 8 and summary["completion_tokens"] == 24
    for line in result.stderr.strip().splitlines():
        if line.startswith("{"):
            assert "run_id" in json.loads(line)


def test_completed_run_resubmitted_exits_0_without_work(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(shards), str(tmp_path / "out" / "ds={ds}")))
    airflow_id = "scheduled__2024-01-02T00:00:00+00:00"
    first = cli("submit", "--conf", "job.ds=2024-01-02", "--run-id", airflow_id, str(job))
    assert first.returncode == 0, first.stderr
    out = tmp_path / "out" / "ds=2024-01-02"
    assert committed_rows(str(out)) == reference
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    again = cli("submit", "--conf", "job.ds=2024-01-02", "--run-id", airflow_id, str(job))
    assert again.returncode == 0, again.stderr
    assert "already complete" in again.stderr
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    status = cli("status", "--json", str(out))
    report = json.loads(status.stdout)
    assert report["state"] == "done" and report["splits_committed"] == report["splits_total"] == 6
    assert report["rows_ok"] == 24 and report["rows_error"] == 0


def test_fingerprint_drift_refused_with_78(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        job_toml(
            model_dir, str(shards / "prompts-00.parquet"), str(tmp_path / "out"), sampling={"max_tokens": 2}
        )
    )
    assert cli("submit", str(job)).returncode == 0
    drift = cli("submit", "--conf", "sampling.temperature=0.3", str(job))
    assert drift.returncode == 78
    assert "sampling.defaults.temperature: 0.8 -> 0.3" in drift.stderr
    assert main(["submit", "--conf", "model.dtype=bfloat16", str(job)]) == 78
    assert "engine.numerics.dtype" in capsys.readouterr().err
    # Told to start over, the same location is rebuilt under the new fingerprint.
    over = cli("submit", "--conf", "sampling.temperature=0.3", "--conf", "job.start_over=true", str(job))
    assert over.returncode == 0, over.stderr
    success = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert success["fingerprint"]["sampling.defaults"]["temperature"] == 0.3
    # The same command again (a scheduler's retry) finds its own finished job: nothing is discarded.
    assert (
        main(["submit", "--conf", "sampling.temperature=0.3", "--conf", "job.start_over=true", str(job)]) == 0
    )
    assert "already complete" in capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "_SUCCESS").read_text()) == success


def test_too_many_bad_rows_exits_65_with_error_records(tmp_path: Path, model_dir: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"id": "a", "prompt": "hello fox"},
        {"id": "b", "prompt": None},
        {"id": "c", "prompt": ""},
        {"id": "d", "prompt": "split commit"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    job = tmp_path / "job.toml"
    job.write_text(
        job_toml(
            model_dir,
            str(tmp_path / "in.parquet"),
            str(tmp_path / "out"),
            input={"passthrough_columns": []},
            job={"max_error_fraction": 0.25},
        )
    )
    result = cli("submit", str(job))
    assert result.returncode == 65, result.stderr
    assert "2 of 4 output records are errors" in result.stderr
    assert "(empty_prompt 2; first: row 'b' (empty_prompt): " in result.stderr  # what the errors are
    got = {r["row_id"]: (r["status"], r["error_code"]) for r in committed_rows(str(tmp_path / "out"))}
    assert got == {
        "a": ("ok", None),
        "b": ("error", "empty_prompt"),
        "c": ("error", "empty_prompt"),
        "d": ("ok", None),
    }
    assert not (tmp_path / "out" / "_SUCCESS").exists()


def test_validate_reads_only(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(shards), str(tmp_path / "out")))
    assert main(["validate", str(job)]) == 0
    assert "ok: 6 split(s)" in capsys.readouterr().out
    assert main(["validate", "--conf", 'input.passthrough_columns=["topics"]', str(job)]) == 78
    assert "did you mean 'topic'?" in capsys.readouterr().err
    assert main(["validate", "--conf", "input.prompt_column=text", str(job)]) == 78  # a column the spec names
    assert not (tmp_path / "out").exists()


def test_corrupt_and_empty_input(tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "prompts.parquet").write_bytes(b"PAR1 this is not parquet")
    (tmp_path / "empty").mkdir()
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(tmp_path / "bad"), str(tmp_path / "out")))
    assert main(["submit", str(job)]) == 65
    assert "prompts.parquet" in capsys.readouterr().err
    assert main(["submit", "--conf", f"input.path={tmp_path / 'empty'}", str(job)]) == 66
    assert not (tmp_path / "out").exists()
