"""bench/finalize_latency.py end to end on a few splits: both reading modes finish the same job
with the same requests, and status counts every committed row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_concurrent_and_serial_reads_finish_the_same_job(tmp_path: Path) -> None:
    cmd = [sys.executable, str(REPO / "bench" / "finalize_latency.py"), "--splits", "6", "--latency-ms", "1"]
    done = subprocess.run([*cmd, "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (saved,) = tmp_path.glob("finalize-latency-*.json")
    result = json.loads(saved.read_text())
    concurrent, serial = result["runs"]
    assert (concurrent["part_read_concurrency"], serial["part_read_concurrency"]) == (16, 1)
    for run in (concurrent, serial):
        assert run["records"] == run["status_records"] == 6
        assert run["status_state"] == "interrupted"  # every split committed, not yet finalized
    for key in ("finalize_requests", "status_requests"):
        assert concurrent[key] == serial[key] > 0, key


def test_a_bad_split_count_is_named() -> None:
    cmd = [sys.executable, str(REPO / "bench" / "finalize_latency.py"), "--splits", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "'0': give a whole number of at least 1" in done.stderr
