"""A worker's own timeline, for benchmarks and for finding where a slow job spends its time.

Off unless `job.timeline_path` names a local file. Then the worker records wall-clock marks
(`time.time()`, comparable across processes): engine build start and end (with the phases
the engine timed, when it times them), the first and last step, the running count of
completed tokens and requests (at most every `TOKEN_MARK_S`), each committed split with its counts, and at
the end the device's idle share between the first and the last step. Each worker appends its
lines, one JSON object each carrying its pid, when it ends; a killed worker leaves none.

Idle time on a CUDA device is measured with events around each step's launch (the forward and
the sampling queued on the stream): the device time between one launch's end event and the
next launch's start event is time the device had nothing queued from the step loop, waiting
for the host. Events are read back once both are complete, so the clock never makes the host
wait for the device.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from shardinfer.errors import ConfigError
from shardinfer.redaction import redact_text

TOKEN_MARK_S = 0.1


class LaunchClock:
    """Device idle time between consecutive step launches of a CUDA engine (see module doc)."""

    def __init__(self, engine: Any) -> None:
        import torch

        self._torch = torch
        self._pairs: deque[tuple[Any, Any]] = deque()  # (start, end) events not yet read back
        self.idle_ms = 0.0
        self.span_ms = 0.0
        self._launches = 0
        self._engine = engine
        self._original: Callable[..., Any] = engine._launch
        engine._launch = self._timed_launch

    def _timed_launch(self, *args: Any, **kwargs: Any) -> Any:
        cuda = self._torch.cuda
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        launched = self._original(*args, **kwargs)
        end.record()
        self._pairs.append((start, end))
        self._launches += 1
        self._read_back(final=False)
        return launched

    def _read_back(self, final: bool) -> None:
        # A pair is final once the next pair's start event completed (its gap is then known).
        while len(self._pairs) >= 2 and (final or self._pairs[1][0].query()):
            (s0, e0), (s1, _) = self._pairs[0], self._pairs[1]
            busy = s0.elapsed_time(e0)
            gap = max(0.0, e0.elapsed_time(s1))
            self.span_ms += busy + gap
            self.idle_ms += gap
            self._pairs.popleft()

    def close(self) -> dict[str, Any]:
        self._engine._launch = self._original
        if self._pairs:
            self._torch.cuda.synchronize()
            self._read_back(final=True)
            s, e = self._pairs.popleft()
            self.span_ms += s.elapsed_time(e)
        return {
            "launches": self._launches,
            "device_span_s": self.span_ms / 1e3,
            "device_idle_s": self.idle_ms / 1e3,
            "gpu_idle_fraction": self.idle_ms / self.span_ms if self.span_ms > 0 else None,
        }


class Timeline:
    """Marks of one worker, written as JSON lines to `path` by `close()`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lines: list[dict[str, Any]] = []
        self._lock = threading.Lock()  # the writer thread marks commits
        self._tokens = 0
        self._requests = 0
        self._last_token_mark = 0.0
        self._first_step = False
        self._clock: LaunchClock | None = None

    def mark(self, event: str, **fields: Any) -> None:
        with self._lock:
            self._lines.append({"event": event, "t": time.time(), "pid": os.getpid(), **fields})

    def watch_engine(self, engine: Any) -> None:
        """Start measuring device idle time, when the engine runs on CUDA."""
        device = getattr(engine, "device", None)
        if getattr(device, "type", None) == "cuda" and hasattr(engine, "_launch"):
            self._clock = LaunchClock(engine)

    def step(self, finished_tokens: int, finished_requests: int = 0) -> None:
        """After each engine step: `finished_tokens` completion tokens of the `finished_requests`
        requests it finished."""
        if not self._first_step:
            self._first_step = True
            self.mark("first_step")
        self._tokens += finished_tokens
        self._requests += finished_requests
        now = time.monotonic()
        if finished_tokens and now - self._last_token_mark >= TOKEN_MARK_S:
            self._last_token_mark = now
            self.mark("tokens", completion_tokens=self._tokens, requests=self._requests)

    def engine_done(self) -> None:
        """The step loop ended: the final token count, the last step, the device's idle share."""
        self.mark("tokens", completion_tokens=self._tokens, requests=self._requests)
        self.mark("last_step")
        if self._clock is not None:
            self.mark("device", **self._clock.close())
            self._clock = None

    def close(self) -> None:
        """Append every mark to the file (after the writer's last commit)."""
        text = redact_text("".join(json.dumps(line, default=str) + "\n" for line in self._lines))
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(text)


def check_timeline_path(path: str, output_dir: str = "") -> None:
    """A ConfigError naming job.timeline_path when a worker could not append to it at its end,
    found before the job runs. `output_dir`, the job's local output location, may be missing yet:
    the job creates it before any worker ends."""
    if not path:
        return
    problem = None
    parent = os.path.dirname(os.path.abspath(path))
    if "://" in path:
        problem = "is a URL: the timeline is a local file; give a local path"
    elif os.path.isdir(path):
        problem = f"is a directory: name a file in it, e.g. {os.path.join(path, 'timeline.jsonl')!r}"
    elif output_dir and parent == os.path.abspath(output_dir) and not os.path.exists(parent):
        return
    elif not os.path.isdir(parent):
        what = "is not a directory" if os.path.exists(parent) else "does not exist"
        problem = f"is in {parent!r}, which {what}: create the directory or choose another path"
    elif not os.access(path if os.path.exists(path) else parent, os.W_OK):
        problem = "cannot be written by this user: choose another path"
    if problem:
        raise ConfigError(f"job.timeline_path={path!r} {problem}")


def open_timeline(path: str) -> Timeline | None:
    return Timeline(path) if path else None
