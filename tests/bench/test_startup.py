"""bench/startup.py end to end on the CPU with the tiny workload (the bench's own plumbing: fresh
processes per mode, their Triton cache directories, the result file)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.record import startup_rows

REPO = Path(__file__).resolve().parents[2]


def test_startup_bench_runs_each_mode_in_its_own_process(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(REPO / "bench" / "startup.py"),
        "--device",
        "cpu",
        "--workload",
        "tiny",
        "--modes",
        "cold-off,cold-on,warm-on",
        "--requests",
        "3",
        "--prompt-len",
        "20",
        "--max-model-len",
        "256",
        "--max-num-batched-tokens",
        "64",
        "--max-num-seqs",
        "4",
        "--ckpt-dir",
        str(tmp_path / "ckpt"),
        "--out",
        str(tmp_path / "out"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = (tmp_path / "out").glob("startup-tiny-*.json")
    result = json.loads(path.read_text())
    assert [r["mode"] for r in result["runs"]] == ["cold-off", "cold-on", "warm-on"]
    for run in result["runs"]:
        assert run["total_s"] >= run["import_s"] + run["engine_build_s"] > 0
        assert "model_load_s" in run["phases"]
        assert run["compiled_ahead"] is None  # nothing compiles on the CPU
    assert startup_rows([result]) == []  # CPU runs are smoke runs, never results
    rows = startup_rows([{**result, "gpu": "a GPU"}])
    assert [row.split(" | ")[5] for row in rows] == ["cold, ahead off", "cold, ahead on", "warm, ahead on"]
