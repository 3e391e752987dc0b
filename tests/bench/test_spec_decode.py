"""bench/spec_decode.py end to end on the CPU (tiny shape): repeated points and step timelines."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_repeats_and_timelines_are_recorded(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "spec_decode.py"), "--workload", "tiny", "--device", "cpu",
         "--batches", "2", "--alphas", "0.8", "--depths", "1", "--no-schedule", "--output-len", "72",
         "--repeats", "2", "--timeline-batches", "2", "--ckpt-dir", str(tmp_path / "ckpt"),
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = (tmp_path / "out").glob("spec-tiny-*.json")
    record = json.loads(result.read_text())
    # Each point once per repeat, plain decoding timed again beside the second.
    assert [(p["repeat"], p["depth"]) for p in record["points"]] == [(0, 1), (1, 1)]
    assert all(p["identical"] for p in record["points"])
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
    for args, message in ((["--models", "9b"], "--models: unknown ['9b']"), (["--models", "8b"], "--refine-m 0")):
        done = subprocess.run([sys.executable, script, *args, "--refine-m", "0" if args[1] == "8b" else "32"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]


def test_spec_decode_names_a_bad_argument(tmp_path: Path) -> None:
    script = str(ROOT / "bench" / "spec_decode.py")
    for args, message in (
        (["--repeats", "0"], "--repeats 0"),
        (["--timeline-batches", "16"], "--timeline-batches [16]: not among --batches [2]"),
    ):
        done = subprocess.run(
            [sys.executable, script, "--workload", "tiny", "--device", "cpu", "--batches", "2", *args,
             "--out", str(tmp_path)],
            capture_output=True, text=True, timeout=300,
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]
        assert not list(tmp_path.iterdir())  # nothing written
