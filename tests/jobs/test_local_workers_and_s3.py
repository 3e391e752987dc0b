"""local[N] workers and object storage, end to end through the CLI."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import s3fs
from pipeline_kit import (
    cli,
    cli_env,
    committed_rows,
    fine_grained_job,
    job_toml,
    marker_parts,
    part_files,
    standard_job,
    start_cli,
)


def test_local2_commits_every_split_exactly_once(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    job, out = standard_job(tmp_path, model_dir, str(shards))
    result = cli("submit", "--master", "local[2]", "--log-format", "json", str(job))
    assert result.returncode == 0, result.stderr
    assert committed_rows(str(out)) == reference
    assert part_files(out) == marker_parts(out)  # losers of commit races deleted their parts
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["workers"] == 2 and summary["splits"] == 6
    # Every split was committed by exactly one of this run's attempts (winners + losers = attempts).
    assert summary["run_splits_committed"] == 6


def test_local2_dead_worker_is_reported_and_its_splits_redone(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    job, out = standard_job(tmp_path, model_dir, str(shards))
    env = cli_env(
        SHARDINFER_TEST_CRASH_AT="after_part",
        SHARDINFER_TEST_CRASH_SPLIT="1",
        SHARDINFER_TEST_CRASH_ONCE=str(tmp_path / "crashed-once"),
    )
    result = cli("submit", "--master", "local[2]", str(job), env=env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "crashed-once").exists()
    # Split 1 is worker 1's, unless worker 0 reached it first while taking the others' splits.
    assert re.search(r"worker [01] died \(killed by signal 9\)", result.stderr)
    assert committed_rows(str(out)) == reference
    assert part_files(out) == marker_parts(out)


def test_s3_input_and_output_through_moto_with_faults(
    tmp_path: Path,
    model_dir: Path,
    shards: Path,
    s3_bucket: Any,
    fault_proxy: Any,
    reference: list[dict[str, Any]],
) -> None:
    fs = s3fs.S3FileSystem(**s3_bucket.storage_options)
    for path in sorted(shards.glob("*.parquet")):
        fs.put_file(str(path), f"{s3_bucket.name}/in/{path.name}")
    proxy = fault_proxy(every=13, faults=("503", "drop"))  # throttling and dropped connections on output
    job = tmp_path / "job.toml"
    job.write_text(
        job_toml(
            model_dir,
            s3_bucket.url("in/*.parquet"),
            s3_bucket.url("out/{ds}"),
            input={"storage_options": s3_bucket.storage_options},
            output={"storage_options": proxy.storage_options()},
        )
    )
    result = cli("submit", "--conf", "job.ds=2024-03-04", str(job))
    assert result.returncode == 0, result.stderr
    assert proxy.faults_injected  # the run really went through failures, and lost nothing
    url = s3_bucket.url("out/2024-03-04")
    assert committed_rows(url, s3_bucket.storage_options) == reference
    status = cli("status", "--json", "--storage-options", json.dumps(s3_bucket.storage_options), url)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["splits_committed"] == 6
    again = cli("submit", "--conf", "job.ds=2024-03-04", str(job))
    assert again.returncode == 0 and "already complete" in again.stderr


def test_local2_sigterm_reaches_the_workers_and_rerun_completes(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    job, out = fine_grained_job(tmp_path, model_dir, str(shards))
    proc = start_cli("submit", "--master", "local[2]", str(job))
    deadline = time.monotonic() + 90
    while not list(out.glob("_commits/*.json")):  # wait for the first commit: the job is under way
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=35)
    assert proc.returncode == 75, err
    assert "died" not in err  # workers that stop on request are not reported as dead
    assert "ERROR worker" not in err  # nor as failed: the driver says once why the job stopped
    rerun = cli("submit", "--master", "local[2]", str(job))
    assert rerun.returncode == 0, rerun.stderr
    assert committed_rows(str(out)) == reference
    assert part_files(out) == marker_parts(out)


def test_local2_runs_a_model_on_object_storage_from_each_machines_copy(
    tmp_path: Path, model_dir: Path, shards: Path, s3_bucket: Any, reference: list[dict[str, Any]]
) -> None:
    # Workers open the job with the model where the user put it (the fingerprint names that URL)
    # and run the engine on the local copy; a worker opening it with the copy's path would see
    # the fingerprint drift and refuse.
    url = s3_bucket.put_folder(model_dir, "model")
    job, out = standard_job(tmp_path, url, str(shards), model={"storage_options": s3_bucket.storage_options})
    env = cli_env(SHARDINFER_MODEL_CACHE=str(tmp_path / "model-cache"))
    result = cli("submit", "--master", "local[2]", str(job), env=env)
    assert result.returncode == 0, result.stderr
    assert committed_rows(str(out)) == reference
    assert part_files(out) == marker_parts(out)
    assert any((tmp_path / "model-cache").rglob("config.json"))  # the engine really ran on a copy
