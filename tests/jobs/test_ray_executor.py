"""`--master ray` on a local Ray cluster on the CPU: two worker actors, the tiny model.

One cluster serves the whole module (it takes seconds to start); each job is a CLI process that
connects to it through RAY_ADDRESS, as a driver on a real cluster would. Every run is compared
with the rows of an uninterrupted `local` run of the same job.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from pipeline_kit import (
    cli,
    cli_env,
    committed_rows,
    fine_grained_job,
    marker_parts,
    part_files,
    standard_job,
    start_cli,
)

TWO_ACTORS = ("--conf", "ray.num_workers=2", "--conf", "ray.num_cpus_per_worker=1")


def _ray_env(address: str) -> dict[str, str]:
    return cli_env(RAY_ADDRESS=address)


def _actor_pids() -> list[int]:
    """PIDs of live worker actor processes (Ray titles them ray::SplitActor...)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.startswith(b"ray::SplitActor"):
            pids.append(int(entry.name))
    return pids


def _wait_for_commits(proc: Any, out: Path, count: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while len(list(out.glob("_commits/*.json"))) < count:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the Ray job made no progress"
        time.sleep(0.05)


def _wait_for_working_actors(proc: Any, out: Path, count: int, timeout: float = 180) -> list[int]:
    """PIDs of `count` actors that have each committed a split (a commit marker names its writer's
    pid): an actor that has committed holds its next splits until the job runs out of them, while
    one still building its engine holds none."""
    deadline = time.monotonic() + timeout
    while True:
        writers = set()
        for marker in out.glob("_commits/*.json"):
            try:
                writers.add(int(json.loads(marker.read_text())["writer"].rsplit(":", 1)[1]))
            except (OSError, ValueError, KeyError):
                continue  # being written
        working = sorted(writers & set(_actor_pids()))
        if len(working) >= count:
            return working
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"fewer than {count} actors committed a split"
        time.sleep(0.05)


def test_ray_run_equals_local_run(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]], ray_address: str
) -> None:
    job, out = standard_job(tmp_path, model_dir, str(shards))
    result = cli(
        "submit",
        "--master",
        "ray",
        *TWO_ACTORS,
        "--log-format",
        "json",
        str(job),
        env=_ray_env(ray_address),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert committed_rows(str(out)) == reference
    assert part_files(out) == marker_parts(out)
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert (
        summary["workers"] == 2 and summary["run_split_attempts"] == 6 and summary["run_splits_redone"] == 0
    )
    per_actor = summary["run_workers"]
    assert sum(w["rows_committed"] for w in per_actor.values()) == 24
    assert sum(w["generated_tokens"] for w in per_actor.values()) == summary["run_completion_tokens"]


def test_ray_actor_killed_mid_split_is_replaced_and_rows_are_exactly_once(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]], ray_address: str
) -> None:
    job, out = fine_grained_job(tmp_path, model_dir, str(shards))
    proc = start_cli(
        "submit", "--master", "ray", *TWO_ACTORS, "--log-format", "json", str(job), env=_ray_env(ray_address)
    )
    # The first actor to commit is killed at once: most splits are still waiting then, so the
    # survivor cannot take them all alone and the driver starts a replacement (near the end of a
    # job it rightly does not, which made a later kill's restart count a race).
    victims = _wait_for_working_actors(proc, out, 1)
    assert len(_actor_pids()) == 2, victims
    os.kill(victims[0], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert "died (actor died" in stderr
    assert committed_rows(str(out)) == reference
    assert part_files(out) == marker_parts(out)
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["run_worker_restarts"] == 1
    # The killed actor held at least the split it was working on; each was handed out again.
    assert summary["run_splits_redone"] >= 1
    assert summary["run_split_attempts"] == 24 + summary["run_splits_redone"]


@pytest.mark.slow
def test_ray_driver_killed_then_rerun_finishes_exactly_once(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]], ray_address: str
) -> None:
    job, out = fine_grained_job(tmp_path, model_dir, str(shards))
    proc = start_cli("submit", "--master", "ray", *TWO_ACTORS, str(job), env=_ray_env(ray_address))
    _wait_for_commits(proc, out, 3)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert len(list(out.glob("_commits/*.json"))) < 24  # killed with work left
    rerun = cli("submit", "--master", "ray", *TWO_ACTORS, str(job), env=_ray_env(ray_address), timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert committed_rows(str(out)) == reference
    assert part_files(out) == marker_parts(out)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("how", ["env", "master"])
def test_wrong_cluster_address_exits_75_naming_it(
    tmp_path: Path, model_dir: Path, shards: Path, how: str
) -> None:
    job, _ = standard_job(tmp_path, model_dir, str(shards))
    address = f"127.0.0.1:{_closed_port()}"
    if how == "env":
        result = cli("submit", "--master", "ray", str(job), env=cli_env(RAY_ADDRESS=address))
    else:
        result = cli("submit", "--master", f"ray://{address}", str(job))
    assert result.returncode == 75, result.stderr
    assert address in result.stderr and "cannot reach the Ray cluster" in result.stderr
