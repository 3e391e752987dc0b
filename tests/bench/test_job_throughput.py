"""bench/job_throughput.py end to end on the CPU with a tiny checkpoint, and its timeline maths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.job_throughput import run_measured
from bench.job_timeline import job_startup, steady_rate, tail_seconds, timeline_points
from bench.record import job_row

REPO = Path(__file__).resolve().parents[2]


def test_steady_rate_interpolates_the_middle_of_the_run() -> None:
    # 0 tokens at t=0, 100 at t=10 (10/s), then 900 more in 5 s (180/s) to 1000 at t=15.
    points = [(0.0, 0), (10.0, 100), (15.0, 1000)]
    # 10% (100 tokens) at t=10; 90% (900) at t = 10 + 5 * 800/900.
    assert steady_rate(points) == pytest.approx(800 / (5 * 800 / 900))
    assert steady_rate([(0.0, 0)]) is None
    assert steady_rate([(0.0, 0), (1.0, 0)]) is None


def test_points_sum_workers_and_startup_is_measured_from_spawn() -> None:
    events = [
        {"event": "engine_build_start", "t": 103.0, "pid": 1},
        {"event": "engine_ready", "t": 110.0, "pid": 1, "phases": {"model_load_s": 4.0}},
        {"event": "first_step", "t": 111.0, "pid": 1},
        {"event": "tokens", "t": 112.0, "pid": 1, "completion_tokens": 50},
        {"event": "tokens", "t": 112.5, "pid": 2, "completion_tokens": 30},
        {"event": "tokens", "t": 113.0, "pid": 1, "completion_tokens": 70},
        {"event": "split_committed", "t": 114.0, "pid": 1, "completion_tokens": 70},
    ]
    assert timeline_points(events) == [(111.0, 0), (112.0, 50), (112.5, 80), (113.0, 100)]
    assert job_startup(events, spawned=100.0, imports_s=2.0) == {
        "import_s": 2.0,
        "plan_s": 1.0,
        "engine_build_s": 7.0,
        "engine_model_load_s": 4.0,
        "first_step_s": 11.0,
        "ready_to_first_step_s": 1.0,
        "first_commit_s": 14.0,
    }


def test_tail_is_the_last_share_of_requests_summed_over_workers() -> None:
    events = [
        {"event": "tokens", "t": 10.0, "pid": 1, "completion_tokens": 500, "requests": 50},
        {"event": "tokens", "t": 12.0, "pid": 2, "completion_tokens": 400, "requests": 40},
        {"event": "tokens", "t": 14.0, "pid": 1, "completion_tokens": 590, "requests": 59},
        {"event": "tokens", "t": 20.0, "pid": 2, "completion_tokens": 410, "requests": 41},
        {"event": "tokens", "t": 21.0, "pid": 2, "completion_tokens": 410, "requests": 41},
    ]
    # 100 requests: 95 finished at t = 12 + 2 * (95 - 90) / (99 - 90); the 100th at t = 20.
    assert tail_seconds(events) == pytest.approx(20.0 - (12.0 + 2.0 * 5 / 9))
    assert tail_seconds([{"event": "tokens", "t": 1.0, "pid": 1, "completion_tokens": 5}]) is None


def test_peak_rss_is_the_measured_process_own_not_an_earlier_child(tmp_path: Path) -> None:
    """A larger child run before (the bench's checkpoint writer, say) must not count for the job."""
    big = "b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096])"
    subprocess.run([sys.executable, "-c", big], check=True)
    _, _, code, big_mb = run_measured([sys.executable, "-c", big], tmp_path / "big.log")
    assert code == 0 and big_mb > 300
    _, _, code, small_mb = run_measured([sys.executable, "-c", "pass"], tmp_path / "small.log")
    assert code == 0 and 0 < small_mb < 100
    _, _, code, _ = run_measured([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "exit.log")
    assert code == 3


def _bench(tmp_path: Path, workload: str, *args: str) -> tuple[dict, Path]:
    """Runs bench/job_throughput.py on the CPU; its result JSON and its output folder."""
    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO / "bench" / "job_throughput.py"), "--workload", workload, *args]
    done = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [path] = out.glob(f"job-{workload}-*.json")
    return json.loads(path.read_text()), out


@pytest.mark.slow
def test_tiny_workload_runs_end_to_end_on_cpu(tmp_path: Path) -> None:
    rows, lo, hi = 12, 2, 5
    result, _ = _bench(
        tmp_path,
        "tiny",
        "--device",
        "cpu",
        "--rows",
        str(rows),
        "--files",
        "2",
        "--in-range",
        "8",
        "24",
        "--out-range",
        str(lo),
        str(hi),
        "--max-num-seqs",
        "8",
        "--max-model-len",
        "256",
        "--job-conf",
        "job.split_rows=4",
        "--job-conf",
        "engine.num_kv_blocks=64",
        "--ckpt-dir",
        str(tmp_path / "ckpt"),
    )
    for key in (
        "workload",
        "gpu",
        "commit",
        "date",
        "batch_invariant",
        "rows",
        "job_output_tok_s",
        "engine_output_tok_s",
        "steady_ratio",
        "wall_ratio",
        "startup_s",
        "gpu_idle_fraction",
        "peak_rss_mb",
    ):
        assert key in result, key
    # ignore_eos: every row generates exactly its max_tokens, through the job and the engine alike.
    assert result["completion_tokens"] == result["engine"]["completion_tokens"]
    assert rows * lo <= result["completion_tokens"] <= rows * hi
    assert result["splits_committed"] == 4 and result["rows"] == rows
    assert result["job_output_tok_s"] > 0 and result["engine_output_tok_s"] > 0 and result["peak_rss_mb"] > 0
    assert result["gpu_idle_fraction"] is None  # no device to measure on the CPU
    start = result["startup_s"]
    assert (
        start["import_s"] > 0
        and 0 < start["engine_build_s"] < start["first_step_s"] < start["first_commit_s"]
    )
    assert "| tiny |" in job_row(result)
    assert result["tail_s"] is not None and 0 <= result["tail_s"] < result["job_wall_s"]


@pytest.mark.slow
def test_demo_workload_with_mtp_drafts_generates_what_the_plain_engine_does(tmp_path: Path) -> None:
    """The demo model's chat rows through the job (its messages column and chat template, MTP
    drafts on) and through the engine without a drafter (LLM.chat's rendering): greedy, so the same
    tokens, and the job's summary reports the drafts it verified."""
    result, out = _bench(
        tmp_path,
        "demo",
        "--device",
        "cpu",
        "--rows",
        "24",
        "--out-range",
        "16",
        "48",
        "--max-num-seqs",
        "8",
        "--job-conf",
        "job.split_rows=8",
        "--job-conf",
        "engine.speculative=mtp",
    )
    assert result["completion_tokens"] == result["engine"]["completion_tokens"] > 24
    [log] = out.glob("job-demo-*.log")
    summary = next(json.loads(line) for line in log.read_text().splitlines() if '"summary"' in line)
    assert summary["rows_ok"] == 24
    assert summary["speculative"]["accepted_draft_tokens"] > 0


@pytest.mark.slow
def test_a_recorded_job_replays_as_drafts_and_writes_the_same_tokens(tmp_path: Path) -> None:
    """--record, then --replay with prompt lookup on: the second job drafts the first one's
    outputs, accepts most of them, and writes the same tokens (equal output digests)."""
    common = [
        "--device",
        "cpu",
        "--rows",
        "12",
        "--files",
        "2",
        "--in-range",
        "8",
        "24",
        "--out-range",
        "16",
        "32",
        "--max-num-seqs",
        "8",
        "--skip-engine",
        "--ckpt-dir",
        str(tmp_path / "ckpt"),
        "--job-conf",
        "job.split_rows=4",
    ]
    recording = tmp_path / "recorded.jsonl"
    plain, _ = _bench(tmp_path / "plain", "tiny", *common, "--record", str(recording))
    assert len(recording.read_text().splitlines()) == 12
    spec, out = _bench(
        tmp_path / "spec",
        "tiny",
        *common,
        "--replay",
        f"{recording}:0.8",
        "--job-conf",
        "engine.speculative=ngram",
        "--job-conf",
        "engine.speculative_depth=2",
    )
    assert spec["output_digest"] == plain["output_digest"] and spec["replay_alpha"] == 0.8
    [log] = out.glob("job-tiny-*.log")
    summary = next(json.loads(line) for line in log.read_text().splitlines() if '"summary"' in line)
    assert summary["speculative"]["acceptance_p1"] > 0.6
    assert "replay drafts at alpha 0.8" in job_row(spec)


def test_replay_without_a_prompt_lookup_engine_is_refused_before_any_job(tmp_path: Path) -> None:
    recording = tmp_path / "recorded.jsonl"
    recording.write_text("")
    cmd = [
        sys.executable,
        str(REPO / "bench" / "job_throughput.py"),
        "--workload",
        "tiny",
        "--device",
        "cpu",
        "--replay",
        f"{recording}:0.8",
        "--out",
        str(tmp_path / "out"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and "--job-conf engine.speculative=ngram" in done.stderr
    assert not (tmp_path / "out").exists()


def test_numerics_conf_reaches_the_engine_run_too() -> None:
    """The job's numerics keys become the comparison engine's arguments, typed as the job parses
    them; other keys (a job-only setting, a speculative mode) stay the job's."""
    from bench.job_throughput import numerics_conf

    conf = [
        "model.quantization=fp8",
        'engine.kv_cache_dtype="fp8"',
        "engine.speculative=ngram",
        "job.split_rows=64",
    ]
    assert numerics_conf(conf) == {"quantization": "fp8", "kv_cache_dtype": "fp8"}
    assert numerics_conf([]) == {}


def test_the_recorded_engine_settings_are_the_jobs_own() -> None:
    """A --job-conf engine key is recorded over the spec's value (the job ran with it)."""
    from bench.job_throughput import job_engine_settings

    args = SimpleNamespace(
        batch_invariant="on",
        max_num_seqs=512,
        max_num_batched_tokens=16384,
        max_model_len=4096,
        job_conf=["engine.max_num_seqs=1024", "model.quantization=fp8", "job.split_rows=64"],
    )
    assert job_engine_settings(args) == {
        "batch_invariant": True,
        "max_num_seqs": 1024,
        "max_num_batched_tokens": 16384,
        "max_model_len": 4096,
        "quantization": "fp8",
    }
