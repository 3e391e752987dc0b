"""What a script around the command reads: JSON lines under --log-format json (dry runs and
--verbose tracebacks included), and errors that name the flag or key that fixes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_kit import job_toml

from shardinfer.jobs.cli import main


def _json_lines(text: str) -> list[dict[str, Any]]:
    """Every non-empty line parsed as one JSON object (a line that is not fails the test)."""
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert all(isinstance(r, dict) for r in records)
    return records


def _chat_input(folder: Path) -> Path:
    path = folder / "chat.parquet"
    messages = [[{"role": "user", "content": f"say {i}"}] for i in range(3)]
    pq.write_table(pa.table({"id": ["a", "b", "c"], "messages": messages}), path)
    return path


def test_generate_on_chat_input_says_which_column_to_name(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # generate defaults to a `prompt` column; chat data has `messages`, and the error says how to pick it.
    chat = _chat_input(tmp_path)
    argv = ["generate", "--model", str(model_dir), "--input", str(chat), "--output", str(tmp_path / "out")]
    assert main([*argv, "--dry-run"]) == 78
    err = capsys.readouterr().err
    assert "--conf input.messages_column=messages" in err
    assert not (tmp_path / "out").exists()
    # Told so, the same command plans the job.
    assert main([*argv, "--dry-run", "--conf", "input.messages_column=messages"]) == 0


def test_dry_run_under_json_log_format_is_one_object(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = shards / "prompts-00.parquet"
    argv = ["generate", "--model", str(model_dir), "--input", str(one), "--output", str(tmp_path / "out")]
    assert main([*argv, "--dry-run", "--log-format", "json", "--conf", "job.split_rows=4"]) == 0
    captured = capsys.readouterr()
    records = _json_lines(captured.out) + _json_lines(captured.err)
    plan = [r for r in records if r.get("event") == "dry_run"]
    assert len(plan) == 1
    assert all({"ts", "level", "run_id", "msg"} <= set(r) for r in records)
    # The flags of generate are credited to themselves: it has no job file.
    assert plan[0]["sources"]["input.path"] == "--input"
    assert plan[0]["sources"]["model.path"] == "--model"
    assert plan[0]["sources"]["job.split_rows"] == "--conf"
    rows = pq.read_metadata(one).num_rows
    assert sum(s["rows"] for s in plan[0]["splits"]) == rows
    assert len(plan[0]["splits"]) == -(-rows // 4)
    assert plan[0]["state"] == "new" and not (tmp_path / "out").exists()


def test_verbose_traceback_stays_inside_the_json_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shardinfer.jobs.cli as cli_module

    def broken(*args: Any) -> int:
        raise RuntimeError("something nobody planned for")

    monkeypatch.setattr(cli_module, "_submit", broken)
    job = tmp_path / "job.toml"
    job.write_text(job_toml("m", "in", "out"))
    assert main(["submit", "--verbose", "--log-format", "json", str(job)]) == 1
    captured = capsys.readouterr()
    records = _json_lines(captured.out) + _json_lines(captured.err)
    error = records[-1]
    assert error["level"] == "error" and error["exit_code"] == 1
    assert "Traceback" in error["traceback"] and "something nobody planned for" in error["traceback"]


def test_status_and_history_refuse_log_format_naming_json(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("status", "history"):
        assert main([command, "--log-format", "json", "out"]) == 64
        record = _json_lines(capsys.readouterr().err)[-1]
        assert "--json" in record["msg"]


def test_status_without_credentials_names_its_storage_options_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    botocore_exceptions = pytest.importorskip("botocore.exceptions")
    import shardinfer.jobs.status as status_module

    def no_credentials(*args: Any, **kwargs: Any) -> int:
        raise botocore_exceptions.NoCredentialsError()

    monkeypatch.setattr(status_module, "show_status", no_credentials)
    monkeypatch.setattr(status_module, "show_history", no_credentials)
    for command in ("status", "history"):
        assert main([command, "s3://bucket/out"]) == 78
        err = capsys.readouterr().err
        assert "--storage-options" in err and "output.storage_options" not in err


def test_history_says_a_killed_runs_record_is_interrupted_now(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    one = str(shards / "prompts-00.parquet")
    argv = ["generate", "--model", str(model_dir), "--input", one, "--output", str(out), "--run-id", "ok"]
    assert main([*argv, "--conf", "sampling.max_tokens=2"]) == 0
    # A run killed long ago: its record was never given an end, and its heartbeat stopped in 2020.
    stamp = "2020-01-01T00:00:00.000Z"
    killed = {"run_id": "killed", "state": "running", "started": stamp, "heartbeat": stamp, "workers": 1}
    (out / "_runs" / "killed.json").write_text(json.dumps(killed))
    capsys.readouterr()
    assert main(["history", "--json", str(out)]) == 0
    runs = {r["run_id"]: r for r in _json_lines(capsys.readouterr().out)}
    assert runs["killed"]["state"] == "running"  # the record as written
    assert runs["killed"]["state_now"] == "interrupted"
    assert runs["ok"]["state"] == runs["ok"]["state_now"] == "done"
    assert main(["history", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"now interrupted: last heartbeat {stamp}" in text


def test_status_and_history_json_errors_are_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("status", "history"):
        assert main([command, "--json", str(tmp_path / "nothing-here")]) == 66
        captured = capsys.readouterr()
        assert captured.out == ""
        record = _json_lines(captured.err)[-1]
        assert record["level"] == "error" and record["exit_code"] == 66 and "holds no job" in record["msg"]


def test_dry_run_refusal_under_json_log_format_is_one_object(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    one = str(shards / "prompts-00.parquet")
    argv = ["generate", "--model", str(model_dir), "--input", one, "--output", str(out), "--run-id", "r1"]
    assert main([*argv, "--conf", "sampling.max_tokens=2"]) == 0
    before = sorted(p.name for p in out.rglob("*"))
    capsys.readouterr()
    # Another max_tokens is another job: the dry run says the submit would be refused, as JSON.
    assert main([*argv, "--conf", "sampling.max_tokens=3", "--dry-run", "--log-format", "json"]) == 78
    captured = capsys.readouterr()
    records = _json_lines(captured.out) + _json_lines(captured.err)
    refusal = [r for r in records if r.get("event") == "dry_run"]
    assert len(refusal) == 1 and refusal[0]["would_exit"] == 78 and refusal[0]["writes"] is False
    assert "max_tokens" in refusal[0]["msg"] and refusal[0]["run_id"] == "r1"
    assert sorted(p.name for p in out.rglob("*")) == before
