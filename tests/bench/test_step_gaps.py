"""The idle-gap accounting of bench/step_gaps.py on hand-built traces (times in microseconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import step_gaps


def _ev(cat: str, name: str, ts: float, dur: float) -> dict[str, object]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


TRACE = [
    # Device: busy 0-100 (two overlapping kernels on two streams), idle 100-140, a copy 140-150,
    # idle 150-152 (below the 5 us threshold), busy 152-300.
    _ev("kernel", "gemm", 0, 80),
    _ev("kernel", "attn", 50, 50),
    _ev("gpu_memcpy", "Memcpy HtoD", 140, 10),
    _ev("kernel", "gemm", 152, 148),
    # Host: step() spans everything; inside it, schedule() 90-120, then a sync 120-145.
    _ev("python_function", "shardinfer/engine/llm_engine.py(218): step", 0, 300),
    _ev("python_function", "shardinfer/engine/scheduler.py(40): schedule", 90, 30),
    _ev("cuda_runtime", "cudaStreamSynchronize", 120, 25),
    {"ph": "i", "cat": "kernel", "name": "instant", "ts": 110},  # not a complete event: ignored
]


def test_busy_intervals_merge_streams_and_gaps_keep_those_over_the_threshold() -> None:
    assert step_gaps.device_busy(TRACE) == [(0.0, 100.0), (140.0, 150.0), (152.0, 300.0)]
    assert step_gaps.device_gaps(TRACE, min_us=5.0) == [(100.0, 140.0)]
    assert step_gaps.device_gaps(TRACE, min_us=1.0) == [(100.0, 140.0), (150.0, 152.0)]


def test_gap_time_goes_to_the_innermost_open_host_event() -> None:
    charged = step_gaps.host_during_gaps(TRACE, [(100.0, 140.0)], resolution_us=1.0)
    assert charged["shardinfer/engine/scheduler.py(40): schedule"] == pytest.approx(20.0)
    assert charged["cudaStreamSynchronize"] == pytest.approx(20.0)
    assert sum(charged.values()) == pytest.approx(40.0)


def test_gap_time_without_any_host_event_is_named_so() -> None:
    trace = [_ev("kernel", "a", 0, 10), _ev("kernel", "b", 30, 10), _ev("cpu_op", "aten::copy_", 25, 10)]
    charged = step_gaps.host_during_gaps(trace, step_gaps.device_gaps(trace), resolution_us=1.0)
    assert charged == {"(no host event)": pytest.approx(15.0), "aten::copy_": pytest.approx(5.0)}


def test_summary_is_per_step() -> None:
    summary = step_gaps.summarize(TRACE, steps=2)
    assert summary["device_busy_ms_per_step"] == pytest.approx((100 + 10 + 148) / 1000 / 2)
    assert summary["device_idle_ms_per_step"] == pytest.approx((40 + 2) / 1000 / 2)
    assert summary["gaps_per_step"] == 0.5
    assert summary["largest_gaps_us"] == [40.0]
    assert summary["host_during_gaps"]["cudaStreamSynchronize"] == pytest.approx(20.0 / 1000 / 2, rel=0.1)


def test_a_trace_without_device_activity_reports_nothing_idle() -> None:
    summary = step_gaps.summarize([_ev("cpu_op", "aten::mm", 0, 10)], steps=3)
    assert summary["device_idle_ms_per_step"] == 0.0 and summary["host_during_gaps"] == {}


def test_frames_name_no_machine_directory() -> None:
    inside = str(
        Path(step_gaps.__file__).resolve().parent.parent / "shardinfer/engine/llm_engine.py(218): step"
    )
    trace = [_ev("kernel", "a", 0, 10), _ev("kernel", "b", 30, 10), _ev("python_function", inside, 5, 30)]
    charged = step_gaps.host_during_gaps(trace, step_gaps.device_gaps(trace), resolution_us=1.0)
    assert charged == {"shardinfer/engine/llm_engine.py(218): step": pytest.approx(20.0)}
