"""A job's memory is bounded by its read-ahead window, not by its input: the same job over 50k
and over 500k rows (tiny prompts, one token each, the stub engine) peaks at the same RSS, under a
fixed bound. Each job runs in its own process, so its peak RSS is its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardinfer.testing.stub_engine import write_stub_model_dir

HERE = Path(__file__).parent
SPLIT_ROWS = 10_000  # two splits in flight: 20k rows is the window
# Growth over the process's footprint after imports that the window may use: its rows as Python
# objects, Arrow batches and part tables, the writer's buffers.
WINDOW_BOUND_MB = 300.0
# Between 50k and 500k rows (ten times the input, 450k more rows of Python objects if the job
# held them) the peak may move by noise (allocator arenas), not by the input.
GROWTH_BOUND_MB = 40.0


def _run(tmp_path: Path, model: Path, rows: int) -> dict[str, float]:
    src = tmp_path / f"in-{rows}.parquet"
    pq.write_table(
        pa.table({"prompt": [f"hi {i % 97}" for i in range(rows)]}), src, row_group_size=SPLIT_ROWS
    )
    out = tmp_path / f"out-{rows}"
    done = subprocess.run(
        [sys.executable, str(HERE / "memory_job.py"), str(model), str(src), str(out), str(SPLIT_ROWS)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["records"] == rows
    return result


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 550k rows: a few minutes of CPU, far longer on a crowded machine
def test_peak_rss_does_not_grow_with_the_input(tmp_path: Path) -> None:
    model = write_stub_model_dir(tmp_path / "model")
    small = _run(tmp_path, model, 50_000)
    large = _run(tmp_path, model, 500_000)
    for run in (small, large):
        assert run["peak_mb"] - run["after_imports_mb"] < WINDOW_BOUND_MB, run
    # Growth over each process's own footprint after imports: two interpreters' import footprints
    # differ by tens of MB whatever the input.
    growth = [run["peak_mb"] - run["after_imports_mb"] for run in (small, large)]
    assert growth[1] - growth[0] < GROWTH_BOUND_MB, (small, large)
