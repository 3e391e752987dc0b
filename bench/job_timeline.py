"""Reading a job's timeline (pipeline/timeline.py's JSON lines) for bench/job_throughput.py."""

from __future__ import annotations

from typing import Any


def timeline_points(events: list[dict[str, Any]]) -> list[tuple[float, int]]:
    """(wall time, completion tokens finished so far) of the job's workers, summed over workers.

    Each worker counts its own tokens; a point of one worker carries the others' latest counts."""
    latest: dict[int, int] = {}
    first_step = min((e["t"] for e in events if e["event"] == "first_step"), default=None)
    points: list[tuple[float, int]] = [] if first_step is None else [(first_step, 0)]
    for e in sorted((e for e in events if e["event"] == "tokens"), key=lambda e: e["t"]):
        latest[e["pid"]] = int(e["completion_tokens"])
        points.append((float(e["t"]), sum(latest.values())))
    return points


def tail_seconds(events: list[dict[str, Any]], share: float = 0.05) -> float | None:
    """Seconds the job's last `share` of requests took: from the moment (1 - share) of them had
    finished, summed over workers, to the last one. What a long tail of a few slow rows costs,
    which speculative decoding should shorten (those rows decode alone)."""
    latest: dict[int, int] = {}
    points: list[tuple[float, int]] = []
    for e in sorted((e for e in events if e["event"] == "tokens" and "requests" in e), key=lambda e: e["t"]):
        latest[e["pid"]] = int(e["requests"])
        points.append((float(e["t"]), sum(latest.values())))
    if len(points) < 2 or points[-1][1] <= 0:
        return None
    total = points[-1][1]
    end = next(t for t, n in points if n >= total)
    return end - _crossing(points, (1.0 - share) * total)


def steady_rate(points: list[tuple[float, int]], low: float = 0.1, high: float = 0.9) -> float | None:
    """Tokens per second between the moments `low` and `high` of the final count were reached
    (linear between points): the rate of the middle of a run, without start-up and tail."""
    if len(points) < 2 or points[-1][1] <= 0:
        return None
    total = points[-1][1]
    t_low, t_high = _crossing(points, low * total), _crossing(points, high * total)
    if t_high <= t_low:
        return None
    return (high - low) * total / (t_high - t_low)


def _crossing(points: list[tuple[float, int]], level: float) -> float:
    """The first time the count reaches `level`, interpolated between the points around it."""
    prev_t, prev_n = points[0]
    for t, n in points[1:]:
        if n >= level:
            if n == prev_n:
                return t
            return prev_t + (t - prev_t) * (level - prev_n) / (n - prev_n)
        prev_t, prev_n = t, n
    return points[-1][0]


def job_startup(events: list[dict[str, Any]], spawned: float, imports_s: float) -> dict[str, Any]:
    """Seconds from the job process's start: the import time (measured apart), job planning
    (what else happens before the engine build; a local job plans beside the build, so little
    is left here), the engine build with its own phases
    (`engine_<phase>`, engine/startup_phases.py), the first step (and its distance from the
    engine being ready) and the first committed split."""

    def first(name: str) -> float | None:
        times = [e["t"] for e in events if e["event"] == name]
        return min(times) - spawned if times else None

    build_start, ready = first("engine_build_start"), first("engine_ready")
    out: dict[str, Any] = {"import_s": imports_s}
    if build_start is not None:
        out["plan_s"] = max(0.0, build_start - imports_s)
    if build_start is not None and ready is not None:
        out["engine_build_s"] = ready - build_start
    phases = next((e.get("phases") for e in events if e["event"] == "engine_ready"), None) or {}
    out.update({f"engine_{k}": float(v) for k, v in phases.items()})
    out["first_step_s"] = first("first_step")
    if ready is not None and out["first_step_s"] is not None:
        # Reader start, first rows tokenised and admitted, the first step launched.
        out["ready_to_first_step_s"] = out["first_step_s"] - ready
    commits = [e["t"] for e in events if e["event"] == "split_committed"]
    out["first_commit_s"] = min(commits) - spawned if commits else None
    return out
