"""A one-worker local job builds its engine while the job is planned (jobs/engine_prestart.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pipeline_kit import committed_rows, job_toml

import shardinfer.pipeline.job as job_module
from shardinfer.jobs.cli import main


def _job(tmp_path: Path, model_dir: Path, shards: Path, **sections: dict[str, Any]) -> Path:
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml(model_dir, str(shards), str(tmp_path / "out"), **sections))
    return spec


def _no_build_thread_left() -> bool:
    return not any(t.name == "engine-build" and t.is_alive() for t in threading.enumerate())


def test_engine_build_overlaps_the_plan_and_the_rows_are_the_same(
    tmp_path: Path,
    model_dir: Path,
    shards: Path,
    reference: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    marks: dict[str, float] = {}
    real_open, real_build = job_module.open_job, job_module.build_engine

    def slow_open(config: Any) -> Any:
        marks["plan_start"] = time.monotonic()
        time.sleep(0.5)  # a plan that takes a while: the build must not wait for it
        opened = real_open(config)
        marks["plan_end"] = time.monotonic()
        return opened

    def timed_build(config: Any) -> Any:
        marks["build_start"] = time.monotonic()
        return real_build(config)

    monkeypatch.setattr(job_module, "open_job", slow_open)
    monkeypatch.setattr(job_module, "build_engine", timed_build)
    out = tmp_path / "out"
    assert main(["submit", str(_job(tmp_path, model_dir, shards))]) == 0
    assert marks["build_start"] < marks["plan_end"]
    assert committed_rows(str(out)) == reference
    assert _no_build_thread_left()


def test_a_bad_plan_is_reported_as_before_and_the_build_is_waited_for(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _job(tmp_path, model_dir, tmp_path / "no-such-input")
    assert main(["submit", str(spec)]) == 66
    assert "no-such-input" in capsys.readouterr().err
    assert _no_build_thread_left()
    assert not (tmp_path / "out").exists()


def test_a_bad_engine_key_exits_78_naming_it(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _job(tmp_path, model_dir, shards, engine={"max_num_seqz": 4})
    assert main(["submit", str(spec)]) == 78
    assert "max_num_seqz" in capsys.readouterr().err
    assert _no_build_thread_left()


def test_a_setting_the_model_cannot_run_exits_78_and_leaves_the_output_unwritten(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The engine refuses a max_model_len past the model's positions: a config error (78) raised
    before the plan is written, so the corrected spec (another fingerprint) can use the location."""
    spec = _job(tmp_path, model_dir, shards, engine={"max_model_len": 10**8})
    assert main(["submit", str(spec)]) == 78
    err = capsys.readouterr().err
    assert "max_model_len=100000000 exceeds the model's max_position_embeddings" in err
    assert not (tmp_path / "out" / "_job.json").exists()
    assert _no_build_thread_left()
    assert main(["submit", str(_job(tmp_path, model_dir, shards))]) == 0


def test_a_dry_run_builds_no_engine(
    tmp_path: Path, model_dir: Path, shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_build(config: Any) -> Any:
        raise AssertionError("a dry run built an engine")

    monkeypatch.setattr(job_module, "build_engine", no_build)
    assert main(["submit", "--dry-run", str(_job(tmp_path, model_dir, shards))]) == 0


def test_a_model_in_object_storage_is_not_copied_beside_the_plan(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plan error is reported at once, not after the model's copy into the local cache."""
    import shardinfer.jobs.model_cache as model_cache

    copied: list[str] = []

    def no_copy(path: str, *args: Any, **kwargs: Any) -> str:
        copied.append(path)
        raise AssertionError("the model was copied before the plan")

    monkeypatch.setattr(model_cache, "local_model_path", no_copy)
    import fsspec

    memory = fsspec.filesystem("memory")
    for f in model_dir.iterdir():  # a model folder in (in-process) object storage
        memory.pipe(f"/models/tiny/{f.name}", f.read_bytes())
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("memory://models/tiny", str(tmp_path / "no-such-input"), str(tmp_path / "out")))
    try:
        assert main(["submit", str(spec)]) == 66
    finally:
        memory.rm("/models/tiny", recursive=True)
    assert "no-such-input" in capsys.readouterr().err
    assert copied == [] and _no_build_thread_left()
