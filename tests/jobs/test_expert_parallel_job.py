"""A job on expert-parallel ranks: the same committed rows as one engine, also after a rank dies and
under the Ray executor (whose worker actor runs the ranks)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from pipeline_kit import cli, cli_env, committed_rows, standard_job, start_cli

from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint


def _commits(out: Path) -> int:
    return len(list((out / "_commits").glob("*.json"))) if (out / "_commits").is_dir() else 0


def _rank_pid(job_pid: int, rank: int) -> int:
    """The pid of the rank process with that rank (rank_main; the only expert-parallel job running)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"shardinfer.engine.parallel.rank_main" in argv and argv[-2:-1] == [str(rank).encode()]:
            return int(entry.name)
    raise AssertionError(f"job {job_pid} has no rank {rank} process")


@pytest.fixture(scope="module")
def dsv3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("dsv3"), "deepseek_v3")


@pytest.fixture(scope="module")
def one_engine(
    tmp_path_factory: pytest.TempPathFactory, dsv3_dir: Path, shards: Path
) -> list[dict[str, Any]]:
    job, out = standard_job(tmp_path_factory.mktemp("one"), dsv3_dir, str(shards))
    result = cli("submit", str(job))
    assert result.returncode == 0, result.stderr
    return committed_rows(str(out))


def test_two_ranks_commit_the_one_engine_rows(
    tmp_path: Path, dsv3_dir: Path, shards: Path, one_engine: list[dict[str, Any]]
) -> None:
    # Two replicas more than experts, placed again from the measured load every 3 steps.
    job, out = standard_job(
        tmp_path,
        dsv3_dir,
        str(shards),
        engine={"expert_parallel_size": 2, "expert_redundancy": 2, "expert_rebalance_steps": 3},
    )
    result = cli("submit", str(job))
    assert result.returncode == 0, result.stderr
    assert committed_rows(str(out)) == one_engine
    assert re.search(r"experts        2 ranks, moe_lb \S+, [1-9]\d* rebalance\(s\)", result.stdout), (
        result.stdout
    )


def test_a_rank_killed_mid_job_loses_and_repeats_no_row(
    tmp_path: Path, dsv3_dir: Path, shards: Path, one_engine: list[dict[str, Any]]
) -> None:
    # One-row splits, one request at a time: many commits, so the rank dies with work left.
    job, out = standard_job(
        tmp_path,
        dsv3_dir,
        str(shards),
        engine={"expert_parallel_size": 2},
        job={"split_rows": 1, "max_inflight_requests": 1},
    )
    proc = start_cli("submit", str(job))
    deadline = time.monotonic() + 90
    while _commits(out) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "no commits before the kill"
        time.sleep(0.02)
    os.kill(_rank_pid(proc.pid, 1), signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 75, stderr  # retryable, like a lost worker
    assert "expert-parallel rank 1: stopped without replying (exit code -9)" in stderr
    committed_before = _commits(out)
    assert 2 <= committed_before < 24  # it died with work done and work left
    second = cli("submit", str(job))  # the rerun resumes from the commits
    assert second.returncode == 0, second.stderr
    assert f"{24 - committed_before} split(s) computed" in second.stdout
    rows = committed_rows(str(out))
    assert rows == one_engine
    assert len({(r["row_id"], r["sample_index"]) for r in rows}) == len(rows) == 24


def test_a_ray_worker_runs_expert_parallel_ranks(
    tmp_path: Path, dsv3_dir: Path, shards: Path, one_engine: list[dict[str, Any]], ray_address: str
) -> None:
    job, out = standard_job(tmp_path, dsv3_dir, str(shards), engine={"expert_parallel_size": 2})
    result = cli(
        "submit",
        "--master",
        "ray",
        "--conf",
        "ray.num_workers=1",
        "--conf",
        "ray.num_cpus_per_worker=1",
        "--log-format",
        "json",
        str(job),
        env=cli_env(RAY_ADDRESS=ray_address),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert committed_rows(str(out)) == one_engine
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["expert_parallel"]["ranks"] == 2
