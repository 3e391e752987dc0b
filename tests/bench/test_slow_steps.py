"""The slow-step sampler records where a long step spends its time, and names no machine path."""

from __future__ import annotations

import time

from bench.slow_steps import SlowStepSampler, summary_lines


def _stalled_work() -> None:
    time.sleep(0.3)


def test_a_long_step_is_sampled_inside_the_stalling_call() -> None:
    sampler = SlowStepSampler(threshold_s=0.05, interval_s=0.01, per_step=2)
    sampler.begin(0)
    time.sleep(0.01)  # a short step: never sampled
    sampler.end()
    sampler.begin(1)
    _stalled_work()
    sampler.end()
    samples = sampler.close()
    assert [s["step"] for s in samples] == [1, 1]
    assert all(s["after_ms"] >= 50 for s in samples)
    innermost = samples[0]["stack"][-1]
    assert "_stalled_work" in innermost and innermost.startswith("tests/bench/test_slow_steps.py:")
    assert not any(frame.startswith("/") for s in samples for frame in s["stack"])
    (line,) = summary_lines(samples)
    assert line.startswith("slow step 1 at ") and "_stalled_work" in line
