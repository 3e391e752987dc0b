"""Where the engine thread is when a step runs long: samples of its Python stack.

A benchmark's step loop calls `begin(i)` before and `end()` after each engine step; a watcher
thread looks every `interval_s` and, while a step has run past `threshold_s`, records the
engine thread's stack (at most `per_step` samples per step). A step stalled in Python (a
compile, a lock, a blocking copy) shows where; one stalled inside a native call shows that call.
File names are given relative to the repository or to site-packages, so results name no machine.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parent.parent)


def short_path(filename: str) -> str:
    """A file name relative to the repository or to site-packages; other absolute paths lose their
    directories, and anything else (a relative path, a native function's name) is kept."""
    if filename.startswith(_ROOT):
        return filename[len(_ROOT) :].lstrip("/")
    marker = "site-packages/"
    if marker in filename:
        return filename.split(marker, 1)[1]
    return Path(filename).name if filename.startswith("/") else filename


class SlowStepSampler:
    def __init__(
        self, threshold_s: float = 0.15, interval_s: float = 0.03, per_step: int = 4, max_samples: int = 40
    ) -> None:
        self.samples: list[dict[str, Any]] = []
        self._target = threading.get_ident()
        self._threshold, self._interval = threshold_s, interval_s
        self._per_step, self._max = per_step, max_samples
        self._step: int | None = None
        self._start = 0.0
        self._taken = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="slow-step-sampler", daemon=True)
        self._thread.start()

    def begin(self, step: int) -> None:
        self._start, self._taken, self._step = time.perf_counter(), 0, step

    def end(self) -> None:
        self._step = None

    def close(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join()
        return self.samples

    def _watch(self) -> None:
        while not self._stop.wait(self._interval):
            step = self._step
            elapsed = time.perf_counter() - self._start
            if step is None or elapsed < self._threshold or self._taken >= self._per_step:
                continue
            if len(self.samples) >= self._max:
                return
            frame = sys._current_frames().get(self._target)
            if frame is None:
                continue
            stack = [
                f"{short_path(f.filename)}:{f.lineno} {f.name}" for f in traceback.extract_stack(frame)[-14:]
            ]
            self.samples.append({"step": step, "after_ms": round(elapsed * 1e3, 1), "stack": stack})
            self._taken += 1


def summary_lines(samples: list[dict[str, Any]], steps: int = 3, frames: int = 3) -> list[str]:
    """One line per slow step (the first `steps`): its first sample's innermost frames."""
    lines: list[str] = []
    seen: set[int] = set()
    for s in samples:
        if s["step"] in seen:
            continue
        seen.add(s["step"])
        lines.append(
            f"slow step {s['step']} at {s['after_ms']} ms: " + " <- ".join(reversed(s["stack"][-frames:]))
        )
        if len(lines) == steps:
            break
    return lines
