"""A job on expert-parallel ranks: the same committed rows as one engine, also after a rank dies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pipeline_kit import cli, cli_env, committed_rows, standard_job

from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint


@pytest.fixture(scope="module")
def dsv3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("dsv3"), "deepseek_v3")


@pytest.fixture(scope="module")
def one_engine(tmp_path_factory: pytest.TempPathFactory, dsv3_dir: Path, shards: Path) -> list[dict[str, Any]]:
    job, out = standard_job(tmp_path_factory.mktemp("one"), dsv3_dir, str(shards))
    result = cli("submit", str(job))
    assert result.returncode == 0, result.stderr
    return committed_rows(str(out))


def test_two_ranks_commit_the_one_engine_rows(tmp_path: Path, dsv3_dir: Path, shards: Path,
                                              one_engine: list[dict[str, Any]]) -> None:
    job, out = standard_job(tmp_path, dsv3_dir, str(shards), engine={"expert_parallel_size": 2})
    result = cli("submit", str(job))
    assert result.returncode == 0, result.stderr
    assert committed_rows(str(out)) == one_engine
    assert "experts        2 ranks, moe_lb" in result.stdout


def test_a_rank_killed_mid_job_loses_and_repeats_no_row(tmp_path: Path, dsv3_dir: Path, shards: Path,
                                                        one_engine: list[dict[str, Any]]) -> None:
    job, out = standard_job(tmp_path, dsv3_dir, str(shards), engine={"expert_parallel_size": 2})
    env = cli_env(SHARDINFER_TEST_CRASH_AT="expert_rank_1_step_12",
                  SHARDINFER_TEST_CRASH_ONCE=str(tmp_path / "killed-once"))
    first = cli("submit", str(job), env=env)
    assert (tmp_path / "killed-once").exists()  # the rank did die
    assert first.returncode == 75, first.stderr  # retryable, like a lost worker
    assert "expert-parallel rank 1: stopped without replying (exit code -9)" in first.stderr
    committed_before = len(list((out / "_commits").glob("*.json")))
    assert 0 < committed_before < 6  # it died with work done and work left
    second = cli("submit", str(job), env=env)  # the rerun resumes from the commits
    assert second.returncode == 0, second.stderr
    assert f"{6 - committed_before} split(s) computed" in second.stdout
    rows = committed_rows(str(out))
    assert rows == one_engine
    assert len({(r["row_id"], r["sample_index"]) for r in rows}) == len(rows) == 24
