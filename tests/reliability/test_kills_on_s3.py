"""kill -9 of the whole job and of one `local[2]` worker while the output goes to S3 (moto on
127.0.0.1) through a proxy that throttles and drops connections; the resumed job's output must
equal an uninterrupted local run's, row for row."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import s3fs
from pipeline_kit import cli, cli_env, committed_rows, job_toml, start_cli


def _marker_count(fs: Any, commits: str) -> int:
    """Commit markers under `commits` now; on S3 a prefix can vanish from a listing between two
    calls while the first markers land, so "not there yet" reads as none."""
    try:
        return len(fs.glob(f"{commits}/*.json"))
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_job_and_worker_killed_on_s3_with_faults_resume_exactly(
    tmp_path: Path,
    model_dir: Path,
    shards: Path,
    s3_bucket: Any,
    fault_proxy: Any,
    reference: list[dict[str, Any]],
    survived: Counter[str],
) -> None:
    fs = s3fs.S3FileSystem(**s3_bucket.storage_options)
    for path in sorted(shards.glob("*.parquet")):
        fs.put_file(str(path), f"{s3_bucket.name}/in/{path.name}")
    proxy = fault_proxy(every=11, faults=("503", "drop", "drop_after"))
    job = tmp_path / "job.toml"
    job.write_text(
        job_toml(
            model_dir,
            s3_bucket.url("in/*.parquet"),
            s3_bucket.url("out"),
            job={"split_rows": 1, "max_inflight_requests": 1},
            input={"storage_options": s3_bucket.storage_options},
            output={"storage_options": proxy.storage_options()},
        )
    )
    env = cli_env(
        SHARDINFER_TEST_CRASH_AT="after_part",
        SHARDINFER_TEST_CRASH_SPLIT="5",
        SHARDINFER_TEST_CRASH_ONCE=str(tmp_path / "worker-killed"),
    )
    running = start_cli("submit", "--master", "local[2]", str(job), env=env)
    commits = f"{s3_bucket.name}/out/_commits"
    deadline = time.monotonic() + 180
    while running.poll() is None and time.monotonic() < deadline:
        fs.invalidate_cache()
        if _marker_count(fs, commits) >= 3:
            break
        time.sleep(0.2)
    assert running.poll() is None, "the job ended before it could be killed"
    running.send_signal(signal.SIGKILL)
    running.wait()
    resumed = cli("submit", "--master", "local[2]", str(job), env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert (tmp_path / "worker-killed").exists()  # one worker died at the commit point, in one run
    assert committed_rows(s3_bucket.url("out"), s3_bucket.storage_options) == reference
    survived["kills survived"] += 2
    survived["faults survived"] += len(proxy.faults_injected)
