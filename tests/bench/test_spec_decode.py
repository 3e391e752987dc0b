"""bench/spec_decode.py end to end on the CPU (tiny shape): repeated points and step timelines."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_repeats_and_timelines_are_recorded(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "spec_decode.py"),
            "--workload",
            "tiny",
            "--device",
            "cpu",
            "--batches",
            "2",
            "--alphas",
            "0.8",
            "--depths",
            "1",
            "--no-schedule",
            "--output-len",
            "72",
            "--repeats",
            "2",
            "--timeline-batches",
            "2",
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
    (result,) = (tmp_path / "out").glob("spec-tiny-*.json")
    record = json.loads(result.read_text())
    # Each point once per repeat, plain decoding timed again beside the second.
    assert [(p["repeat"], p["depth"]) for p in record["points"]] == [(0, 1), (1, 1)]
    assert all(p["identical"] for p in record["points"])
    # Each timed run's step calls: 72 tokens at one a step (plain) or up to two (one draft), plus
    # the prefill call; the summary's parts add up to the run's step time.
    for p in record["points"]:
        plain, spec = p["plain_step_times"], p["spec_step_times"]
        assert len(plain["first_steps_ms"]) == len(spec["first_steps_ms"]) == 4
        assert plain["median_step_ms"] > 0 and spec["median_step_ms"] > 0
        assert plain["beyond_steady_ms"] is not None
    # A timeline per depth (0: plain), each pass summarised and its trace written.
    timelines = record["step_timelines"]["2"]
    assert set(timelines) == {"0", "1"}
    for depth, passes in timelines.items():
        assert set(passes) == {"timing", "stacks"}
        for name, summary in passes.items():
            assert summary["steps"] == 12
            trace = tmp_path / "out" / f"timeline-b2-d{depth}-{name}.json.gz"
            events = json.loads(gzip.decompress(trace.read_bytes()))
            assert any(e.get("cat") == "cpu_op" for e in events)


def test_refine_names_a_bad_argument() -> None:
    script = str(ROOT / "bench" / "kernels" / "bench_matmul.py")
    for args, message in (
        (["--models", "9b"], "--models: unknown ['9b']"),
        (["--models", "8b"], "--refine-m 0"),
    ):
        done = subprocess.run(
            [sys.executable, script, *args, "--refine-m", "0" if args[1] == "8b" else "32"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]


def test_spec_decode_names_a_bad_argument(tmp_path: Path) -> None:
    script = str(ROOT / "bench" / "spec_decode.py")
    for args, message in (
        (["--repeats", "0"], "--repeats 0"),
        (["--timeline-batches", "16"], "--timeline-batches [16]: not among --batches [2]"),
        (["--timeline-batches", "2", "--timeline-skip", "-1"], "--timeline-skip -1"),
    ):
        done = subprocess.run(
            [
                sys.executable,
                script,
                "--workload",
                "tiny",
                "--device",
                "cpu",
                "--batches",
                "2",
                *args,
                "--out",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]
        assert not list(tmp_path.iterdir())  # nothing written


def test_step_times_split_a_run_into_its_start_and_steady_steps() -> None:
    sys.path.insert(0, str(ROOT))
    from bench.spec_decode import step_times

    # A 100 ms prefill call, then steady calls of 5 ms but one of 6: the median of the calls after
    # the first four is 5, and the run spent 131 - 7 x 5 = 96 ms beyond steady steps.
    got = step_times([100.0, 5.0, 5.0, 5.0, 6.0, 5.0, 5.0])
    assert got == {"first_steps_ms": [100.0, 5.0, 5.0, 5.0], "median_step_ms": 5.0, "beyond_steady_ms": 96.0}
    assert step_times([3.0, 2.0])["beyond_steady_ms"] is None  # no steady calls to measure against
