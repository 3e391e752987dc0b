"""Kill -9 at random and at the protocol's exact instants, SIGTERM, then resume: the committed
output must equal an uninterrupted run's, row for row (token ids and logprobs included)."""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path
from typing import Any

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


def _markers(out: Path) -> int:
    return len(list((out / "_commits").glob("*.json"))) if (out / "_commits").is_dir() else 0


def _wait_for_markers(proc: Any, out: Path, target: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while _markers(out) < target and proc.poll() is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"no progress to {target} commits within {timeout} s")
        time.sleep(0.02)


def _assert_clean(out: Path) -> None:
    """After a successful run: every part file is named by a marker, and _SUCCESS is valid."""
    assert part_files(out) == marker_parts(out)
    success = json.loads((out / "_SUCCESS").read_text())
    assert sorted(f["path"] for f in success["files"]) == marker_parts(out)


def test_kill9_at_random_moments_then_resume(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    # 24 splits of one row, one request at a time: many commit points, so each killed run dies with
    # work left. The split size changes no row's output, only the commit grain.
    job, out = fine_grained_job(tmp_path, model_dir, str(shards))
    rng = random.Random(1234)
    kills = 0
    for _ in range(3):
        proc = start_cli("submit", str(job))
        _wait_for_markers(proc, out, _markers(out) + 1)  # each killed run makes some progress...
        time.sleep(rng.uniform(0.0, 0.1))  # ...and dies at a random instant after it
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    assert kills == 3
    assert _markers(out) < 24
    final = cli("submit", str(job))
    assert final.returncode == 0, final.stderr
    rows = committed_rows(str(out))
    assert rows == reference
    assert len({(r["row_id"], r["sample_index"]) for r in rows}) == len(rows) == 24
    _assert_clean(out)


def test_kill_between_part_write_and_marker(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    job, out = standard_job(tmp_path, model_dir, str(shards))
    crashed = cli(
        "submit",
        str(job),
        env=cli_env(SHARDINFER_TEST_CRASH_AT="after_part", SHARDINFER_TEST_CRASH_SPLIT="2"),
    )
    assert crashed.returncode == -signal.SIGKILL
    orphans = [p for p in part_files(out) if p.startswith("part-00002-")]
    assert len(orphans) == 1 and not list((out / "_commits").glob("00002.*.json"))
    # The killed run never recorded its end: status and the last-run line both call it interrupted.
    status = cli("status", str(out))
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == f"{out}: interrupted"
    (last,) = [line for line in lines if line.startswith("  last run ")]
    assert " (interrupted) started " in last and "no end recorded (last heartbeat " in last
    assert json.loads(cli("status", "--json", str(out)).stdout)["last_run"]["state"] == "interrupted"
    resumed = cli("submit", str(job))
    assert resumed.returncode == 0, resumed.stderr
    assert committed_rows(str(out)) == reference
    assert orphans[0] not in part_files(out)  # the uncommitted attempt was removed at finalize
    _assert_clean(out)


def test_kill_while_writing_success(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    job, out = standard_job(tmp_path, model_dir, str(shards))
    crashed = cli("submit", str(job), env=cli_env(SHARDINFER_TEST_CRASH_AT="before_success"))
    assert crashed.returncode == -signal.SIGKILL
    assert _markers(out) == 6 and not (out / "_SUCCESS").exists()
    # A kill in the middle of the write leaves a truncated file; it must not be trusted.
    (out / "_SUCCESS").write_text('{\n "committer": "shardinfer",\n "files": [')
    resumed = cli("submit", str(job))
    assert resumed.returncode == 0, resumed.stderr
    assert "remaining=0" in resumed.stderr  # nothing was recomputed: only finalize ran again
    assert committed_rows(str(out)) == reference
    _assert_clean(out)


def test_sigterm_exits_75_and_rerun_completes(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    job, out = fine_grained_job(tmp_path, model_dir, str(shards))
    proc = start_cli("submit", str(job))
    _wait_for_markers(proc, out, 1)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 30
    assert proc.returncode == 75, err
    assert not (out / "_SUCCESS").exists()
    rerun = cli("submit", str(job))
    assert rerun.returncode == 0, rerun.stderr
    assert committed_rows(str(out)) == reference
    _assert_clean(out)
