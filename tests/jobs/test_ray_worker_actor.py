"""The Ray worker actor's class, run in this process without Ray: it loads its engine as soon as it
starts (while the driver plans), but opens the job and asks for splits only after `begin`."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pipeline_kit import committed_rows, standard_job

import shardinfer.pipeline.job as job_module
from shardinfer.errors import Interrupted
from shardinfer.jobs.ray_worker import SplitActor
from shardinfer.jobs.spec import load_toml, resolve
from shardinfer.pipeline.job import open_job, write_plan


def _built_signal(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    built = threading.Event()
    real = job_module.build_engine

    def build_and_signal(cfg: Any) -> Any:
        engine = real(cfg)
        built.set()
        return engine

    monkeypatch.setattr(job_module, "build_engine", build_and_signal)
    return built


def _run_in_thread(actor: SplitActor) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = actor.run()
        except BaseException as exc:  # handed to the test thread, which asserts on it
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def _work_to_the_end(
    actor: SplitActor, config: Any, thread: threading.Thread, outcome: dict[str, Any]
) -> None:
    """Plan the job as the driver does, feed the actor every split, then finalize."""
    from shardinfer.pipeline.job import finalize_job

    planned = open_job(config)
    write_plan(planned, config.job.run_id)
    actor.begin()
    pending = list(planned.splits)
    while thread.is_alive():
        for event in actor.poll(0.2):
            if event["event"] == "want_split":
                actor.give(pending.pop(0).to_dict() if pending else None)
    assert "error" not in outcome, outcome
    assert "engine_stats" in outcome["result"]
    finalize_job(planned, config.job.run_id, {})


def test_actor_builds_before_the_plan_and_works_only_after_begin(
    tmp_path: Path,
    model_dir: Path,
    shards: Path,
    reference: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = _built_signal(monkeypatch)
    job, out = standard_job(tmp_path, model_dir, str(shards))
    config = resolve(load_toml(str(job))).config
    actor = SplitActor(config.to_dict(), "0")
    thread, outcome = _run_in_thread(actor)
    assert built.wait(timeout=120), outcome
    # The engine is loaded and nothing is planned yet: the actor must not have opened the job.
    assert actor.poll(0.5) == []
    assert not out.exists()
    _work_to_the_end(actor, config, thread, outcome)
    # Committed exactly as an uninterrupted `local` run of the same job commits them.
    assert committed_rows(str(out)) == reference


def test_actor_runs_a_model_on_object_storage_from_its_copy(
    tmp_path: Path, model_dir: Path, shards: Path, s3_bucket: Any, reference: list[dict[str, Any]]
) -> None:
    # The actor's engine reads the copy in its model cache; the job it opens names the model's URL,
    # as the driver's plan does, so the fingerprints agree.
    url = s3_bucket.put_folder(model_dir, "model")
    job, out = standard_job(tmp_path, url, str(shards), model={"storage_options": s3_bucket.storage_options})
    config = resolve(load_toml(str(job))).config
    cache = tmp_path / "model-cache"
    actor = SplitActor(config.to_dict(), "0", str(cache))
    thread, outcome = _run_in_thread(actor)
    _work_to_the_end(actor, config, thread, outcome)
    assert committed_rows(str(out)) == reference
    assert any(cache.rglob("config.json"))


def test_actor_stopped_before_begin_is_interrupted_without_touching_the_output(
    tmp_path: Path, model_dir: Path, shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = _built_signal(monkeypatch)
    job, out = standard_job(tmp_path, model_dir, str(shards))
    actor = SplitActor(resolve(load_toml(str(job))).config.to_dict(), "0")
    thread, outcome = _run_in_thread(actor)
    assert built.wait(timeout=120), outcome
    actor.stop()
    thread.join(timeout=30)
    assert isinstance(outcome.get("error"), Interrupted), outcome
    assert not out.exists()
