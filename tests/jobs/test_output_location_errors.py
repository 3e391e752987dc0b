"""Output locations that cannot work are refused with the right exit code and a message naming
them: a placeholder escaping its base, a file, a missing bucket, credentials the store refuses, a
full disk; and an input with
files but no rows."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from pipeline_kit import job_toml, write_shards

from shardinfer.errors import exit_code_for
from shardinfer.jobs.cli import main
from shardinfer.readers import Split
from shardinfer.writers import OutputStore, StorageError, make_job_record


@pytest.mark.parametrize(("flag", "value"), [("--name", "../../elsewhere"), ("--run-id", "..")])
def test_placeholder_values_cannot_leave_the_base(
    tmp_path: Path, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.toml"
    job.write_text(job_toml("m", "in", str(tmp_path / "base" / "{name}-{run_id}")))
    assert main(["submit", flag, value, str(job)]) == 78
    assert "one path segment" in capsys.readouterr().err
    assert not (tmp_path / "elsewhere").exists()


def test_output_that_is_a_file_is_a_config_error(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = write_shards(tmp_path / "in", files=1, rows=4)
    (tmp_path / "out").write_text("not a directory")
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(shards), str(tmp_path / "out")))
    assert main(["submit", str(job)]) == 78
    assert f"output.path='{tmp_path / 'out'}' is a file" in capsys.readouterr().err


def test_missing_bucket_is_a_config_error(
    tmp_path: Path, model_dir: Path, s3_bucket, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    shards = write_shards(tmp_path / "in", files=1, rows=4)
    job = tmp_path / "job.toml"
    options = {"output": {"storage_options": s3_bucket.storage_options}}
    job.write_text(job_toml(model_dir, str(shards), "s3://no-such-bucket/out", **options))
    assert main(["submit", str(job)]) == 78, json.dumps(options)
    assert "bucket 'no-such-bucket' does not exist" in capsys.readouterr().err


def test_output_credentials_the_store_refuses_are_named_as_such(
    tmp_path: Path, model_dir: Path, s3_bucket, fault_proxy, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store answering 403 to everything (a wrong key or secret) is not a missing bucket."""
    shards = write_shards(tmp_path / "in", files=1, rows=4)
    denying = fault_proxy(every=1, faults=("403",))
    job = tmp_path / "job.toml"
    options = {"output": {"storage_options": denying.storage_options()}}
    job.write_text(job_toml(model_dir, str(shards), s3_bucket.url("out"), **options))
    assert main(["submit", str(job)]) == 78
    err = capsys.readouterr().err
    assert f"bucket {s3_bucket.name!r}" in err and "refused" in err and "does not exist" not in err
    assert "output.storage_options" in err


def test_empty_jsonl_input_is_a_config_error(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "prompts.jsonl").write_text("")
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(tmp_path / "in"), str(tmp_path / "out")))
    assert main(["submit", str(job)]) == 78
    assert str(tmp_path / "in") in capsys.readouterr().err  # named: the file, or the path with no rows


def test_full_disk_is_retryable_and_names_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardinfer.writers.output_store as output_store

    split = Split(0, 0, "in.parquet", 0, 1)
    store = OutputStore(str(tmp_path / "out"))
    store.write_job(make_job_record("r", {"hash": "ab" * 32}, [split]))

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(output_store, "put_bytes", full)
    from store_like import one_part_table

    with pytest.raises(StorageError) as info:
        store.write_part(split, "a", one_part_table(split), {})
    assert exit_code_for(info.value) == 75
    assert str(tmp_path / "out") in str(info.value) and "no space left" in str(info.value)


def test_storage_outage_is_retryable_not_a_missing_bucket(
    tmp_path: Path,
    model_dir: Path,
    s3_bucket,
    fault_proxy,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A store answering 503 to everything is down, not empty: retry later (75), never "does not exist"."""
    import s3fs

    import shardinfer.storage as storage

    # No waiting between retries, and no retry below ours: the outage lasts the whole test anyway.
    monkeypatch.setattr(storage.RetryPolicy, "delay", lambda self, n: 0.0)
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    shards = write_shards(tmp_path / "in", files=1, rows=4)
    down = fault_proxy(every=1, faults=("503",))
    job = tmp_path / "job.toml"
    bare = {"config_kwargs": {"retries": {"mode": "standard", "total_max_attempts": 1}}}
    options = {"output": {"storage_options": down.storage_options() | bare}}
    job.write_text(job_toml(model_dir, str(shards), s3_bucket.url("out"), **options))
    assert main(["submit", str(job)]) == 75
    err = capsys.readouterr().err
    assert "does not exist" not in err and "refused" not in err
    assert s3_bucket.name in err


def test_new_job_refuses_an_output_folder_holding_foreign_files(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Someone's data.parquet in the output folder would be read as rows by a dataset reader of it."""
    shards = write_shards(tmp_path / "in", files=1, rows=4)
    out = tmp_path / "out"
    out.mkdir()
    (out / "data.parquet").write_bytes(b"someone else's rows")
    (out / "README").write_text("notes")
    (out / ".hidden").write_text("editor state")  # hidden: no dataset reader reads it
    (out / "t.jsonl").write_text("")  # the job's own timeline, left by a run stopped before its plan
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(shards), str(out), job={"timeline_path": str(out / "t.jsonl")}))
    assert main(["submit", str(job)]) == 78
    err = capsys.readouterr().err
    assert "('README', 'data.parquet')" in err and ".hidden" not in err and "t.jsonl" not in err
    assert "choose an empty output path, or move them away" in err
    assert sorted(p.name for p in out.iterdir()) == [
        ".hidden",
        "README",
        "data.parquet",
        "t.jsonl",
    ]  # nothing written
