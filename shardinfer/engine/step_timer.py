"""Step times measured where they are paid, for the draft budget.

`StepTimes` holds the budget's estimate of a decode step's device time per (width, batch bucket):
seeded by the CUDA graphs' replay times measured at capture (tiny contexts, cuda_graphs.py), then
replaced by what the running steps take. The first measurement of a (width, bucket) replaces
its seed; later ones are folded into a running mean over the last WINDOW measurements. A width
the schedule has not run for a while was measured at shorter contexts than the batch has now:
its next measurement replaces the old estimate again instead of being averaged with it. A width
not measured at this bucket but at another takes that measurement, scaled by the seeds' ratio
between the two buckets.

Seeds from tiny contexts are lower than the real steps' times, so a width not yet run anywhere
looks cheap and is tried: the schedule measures every width it might choose before settling.

`StepTimer` measures the device time of a step with two CUDA events recorded on the stream around
its work (forward, sampling, drafting), and reads them only once `query()` says the later one is
done: nothing on the hot path waits for the device. Events complete in stream order, so the
pending steps are read oldest first and reading stops at the first one not done.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

WINDOW = 8  # measurements a (width, bucket) estimate averages over
STALE_AFTER = 64  # measurements of a bucket after which a width's own estimate is out of date
MAX_PENDING = 64  # timed steps kept while nobody reads them (the oldest are dropped)


class RunningTimes:
    """Per (width, bucket): a running mean over the last WINDOW measurements, started afresh when
    the width was not measured for STALE_AFTER measurements of its bucket."""

    def __init__(self) -> None:
        self.estimate: dict[tuple[int, int], float] = {}
        self.count: dict[tuple[int, int], int] = {}
        self.when: dict[tuple[int, int], int] = {}  # the bucket's measurement index at the last one
        self.measured: dict[int, int] = {}  # per bucket: measurements so far

    def observe(self, width: int, bucket: int, ms: float) -> None:
        if ms <= 0:
            return
        key = (width, bucket)
        index = self.measured.get(bucket, 0)
        self.measured[bucket] = index + 1
        n = self.count.get(key, 0)
        if n and index - self.when[key] > STALE_AFTER:
            n = 0
        n = min(n + 1, WINDOW)
        old = self.estimate.get(key, ms)
        self.estimate[key] = old + (ms - old) / n
        self.count[key] = n
        self.when[key] = index


class StepTimes:
    """Device times (CUDA events, `observe`) and paced times (`observe_paced`: the wall time between
    one engine step and the next, charged to the first). A step costs the run the larger of the
    two: the device's time when the host keeps ahead of it, the host's when it does not, which no
    device event sees (a verify step's host work can exceed its device time at mid-size batches:
    docs/performance.md, "Speculative decoding")."""

    def __init__(self, seed: dict[tuple[int, int], float] | None) -> None:
        self.seed = dict(seed or {})
        self.device = RunningTimes()
        self.paced = RunningTimes()

    @property
    def estimate(self) -> dict[tuple[int, int], float]:
        """The device-time estimates by (width, bucket)."""
        return self.device.estimate

    def observe(self, width: int, bucket: int, ms: float) -> None:
        """Fold one step's device time (`width` rows per request at batch bucket `bucket`) in."""
        self.device.observe(width, bucket, ms)

    def observe_paced(self, width: int, bucket: int, ms: float) -> None:
        """Fold one step's paced wall time in."""
        self.paced.observe(width, bucket, ms)

    def ms(self, width: int, bucket: int) -> float | None:
        """The estimated step time (None: nothing known): the device time, or the paced time of
        this very (width, bucket) where that is larger."""
        device = self._device_ms(width, bucket)
        paced = self.paced.estimate.get((width, bucket))
        if device is None or paced is None:
            return device if paced is None else paced
        return max(device, paced)

    def _device_ms(self, width: int, bucket: int) -> float | None:
        """Measured if it was; else the width's measurement at the nearest bucket where it was
        measured, scaled from there to here by the seeds' ratio (a batch shrinking into a new
        bucket keeps what it learned); else the seed."""
        got = self.estimate.get((width, bucket))
        if got is not None:
            return got
        seed = self.seed.get((width, bucket))
        if seed is None:
            return None
        near = [
            (abs(math.log(b / bucket)), b)
            for (w, b) in self.estimate
            if w == width and self.seed.get((w, b), 0.0) > 0
        ]
        if not near:
            return seed
        b = min(near)[1]
        return self.estimate[width, b] * seed / self.seed[width, b]

    def __bool__(self) -> bool:
        return bool(self.seed or self.estimate or self.paced.estimate)


class TimingEvent(Protocol):
    def record(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end: Any) -> float: ...


def cuda_timing_event() -> TimingEvent:
    import torch

    return torch.cuda.Event(enable_timing=True)


class StepTimer:
    """Start/stop marks on the device stream around each timed step; `poll` returns the finished
    ones' (key, milliseconds) without waiting. `make_event` is replaceable for tests."""

    def __init__(self, make_event: Callable[[], TimingEvent] = cuda_timing_event) -> None:
        self.make_event = make_event
        self.pending: deque[tuple[Any, TimingEvent, TimingEvent]] = deque()

    def start(self) -> TimingEvent:
        event = self.make_event()
        event.record()
        return event

    def stop(self, start: TimingEvent, key: Any) -> None:
        end = self.make_event()
        end.record()
        self.pending.append((key, start, end))
        if len(self.pending) > MAX_PENDING:
            self.pending.popleft()

    def poll(self) -> list[tuple[Any, float]]:
        done: list[tuple[Any, float]] = []
        while self.pending and self.pending[0][2].query():
            key, start, end = self.pending.popleft()
            done.append((key, start.elapsed_time(end)))
        return done
