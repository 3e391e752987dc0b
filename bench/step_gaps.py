"""Where a GPU waits for the host: idle gaps on the device in a profiler trace, and what the host
was doing during them.

A decode step that the host launches in time keeps the device busy from one step to the next;
any gap between device activities is time the device waited for the host to queue work. Given a
Chrome trace from torch.profiler (CPU and CUDA activities, with Python stacks for attribution),
`device_gaps` finds those gaps and `host_during_gaps` charges each microsecond of them to the
innermost host event open at that moment: a Python function of the engine, a CUDA runtime call
(a `cudaStreamSynchronize` there means the host itself was waiting), or an operator.
"""

from __future__ import annotations

import bisect
import itertools
from typing import Any

from bench.slow_steps import short_path

DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CATEGORIES = {"python_function", "cuda_runtime", "cuda_driver", "cpu_op", "user_annotation"}


def _intervals(events: list[dict[str, Any]], categories: set[str]) -> list[tuple[float, float, str]]:
    out = []
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in categories and "dur" in e:
            start = float(e["ts"])
            out.append((start, start + float(e["dur"]), str(e.get("name", "?"))))
    out.sort()
    return out


def device_busy(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """The device's busy time as disjoint (start, end) microsecond intervals, every stream merged."""
    merged: list[tuple[float, float]] = []
    for start, end, _ in _intervals(events, DEVICE_CATEGORIES):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def device_gaps(events: list[dict[str, Any]], min_us: float = 5.0) -> list[tuple[float, float]]:
    """Idle stretches of at least `min_us` between the first and the last device activity."""
    busy = device_busy(events)
    return [
        (a_end, b_start) for (_, a_end), (b_start, _) in itertools.pairwise(busy) if b_start - a_end >= min_us
    ]


def host_during_gaps(
    events: list[dict[str, Any]], gaps: list[tuple[float, float]], resolution_us: float = 2.0
) -> dict[str, float]:
    """Microseconds of the gaps charged to the innermost host event open at each moment
    (sampled every `resolution_us`); moments with no host event open count as '(no host event)'."""
    host = _intervals(events, HOST_CATEGORIES)
    starts = [s for s, _, _ in host]
    charged: dict[str, float] = {}
    for gap_start, gap_end in gaps:
        # Events that start before the gap ends; those still open at a moment contain it.
        candidates = host[: bisect.bisect_right(starts, gap_end)]
        open_here = [(s, e, n) for s, e, n in candidates if e > gap_start]
        t = gap_start + resolution_us / 2
        while t < gap_end:
            inside = [(s, e, n) for s, e, n in open_here if s <= t < e]
            # The innermost open event: the latest start, then the shortest.
            name = max(inside, key=lambda ev: (ev[0], -ev[1]))[2] if inside else "(no host event)"
            key = short_path(name)
            charged[key] = charged.get(key, 0.0) + min(resolution_us, gap_end - t + resolution_us / 2)
            t += resolution_us
    return charged


def summarize(events: list[dict[str, Any]], steps: int, min_us: float = 5.0, top: int = 20) -> dict[str, Any]:
    """Per step: device busy and idle milliseconds over the traced span, the gaps, and the host
    events the idle time is charged to (the `top` largest, milliseconds per step)."""
    busy = device_busy(events)
    if not busy or steps <= 0:
        return {
            "steps": steps,
            "device_busy_ms_per_step": 0.0,
            "device_idle_ms_per_step": 0.0,
            "gaps_per_step": 0.0,
            "largest_gaps_us": [],
            "host_during_gaps": {},
        }
    gaps = device_gaps(events, min_us)
    busy_us = sum(e - s for s, e in busy)
    idle_us = (busy[-1][1] - busy[0][0]) - busy_us
    charged = host_during_gaps(events, gaps)
    return {
        "steps": steps,
        "device_busy_ms_per_step": busy_us / 1000 / steps,
        "device_idle_ms_per_step": idle_us / 1000 / steps,
        "gaps_per_step": len(gaps) / steps,
        "largest_gaps_us": sorted((e - s for s, e in gaps), reverse=True)[:10],
        "host_during_gaps": {
            n: us / 1000 / steps for n, us in sorted(charged.items(), key=lambda kv: -kv[1])[:top]
        },
    }
