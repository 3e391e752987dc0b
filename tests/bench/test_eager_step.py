"""bench/eager_step.py on the CPU (tiny shape): the first step's timings and its host profile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_first_call_is_timed_and_profiled(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "eager_step.py"),
            "--workload",
            "tiny",
            "--device",
            "cpu",
            "--repeats",
            "2",
            "--top",
            "5",
            "--ckpt-dir",
            str(tmp_path / "ckpt"),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = (tmp_path / "out").glob("eager-tiny-*.json")
    record = json.loads(result.read_text())
    assert len(record["timed"]) == 2 and record["median"]["first_call_ms"] > 0
    # The profile covers the first step() call alone: the engine's step is its outermost frame,
    # and the model's forward ran inside it.
    top = record["by_cumulative_time"]
    assert len(top) == 5 and "llm_engine.py" in top[0]["function"] and top[0]["function"].endswith(" step")
    assert top[0]["cumtime_ms"] <= record["profiled_call"]["first_call_ms"]


def test_a_bad_count_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "eager_step.py"),
            "--workload",
            "tiny",
            "--device",
            "cpu",
            "--repeats",
            "0",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "--repeats 0: give at least 1" in done.stderr
    assert not list(tmp_path.iterdir())
