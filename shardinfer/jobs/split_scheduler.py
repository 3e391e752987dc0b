"""The driver's split scheduler: one place that decides which worker computes which split.

Every executor (`local`, `local[N]`, Ray) asks it for work on behalf of its workers. A split is
handed to exactly one worker at a time, so it is computed once; it goes back into the queue
only when its worker dies before reporting it committed, and then it is counted as redone, with
the reason. The commit markers stay the source of truth: a reassigned split whose dead worker
did commit it is skipped by the next worker (or loses the create-if-absent race), never written
twice.

Length-aware order: the splits with the most estimated tokens go first, so the last wave of a
run is made of short splits and workers finish close together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Redo:
    """One split handed out again, and why (the dead worker and how it died)."""

    split: int
    worker: str
    reason: str


@dataclass
class SchedulerCounts:
    """What the scheduler saw in this run; `attempts - kept - lost - skipped` were abandoned."""

    attempts: int = 0  # splits handed to a worker (a redone split counts once per hand-out)
    kept: int = 0  # committed by the worker it was handed to
    lost: int = 0  # another attempt's marker won (only after a reassignment)
    skipped: int = 0  # already committed when its worker reached it
    redone: list[Redo] = field(default_factory=list)

    def to_summary(self) -> dict[str, Any]:
        reasons: dict[str, int] = {}
        for r in self.redone:
            reasons[r.reason] = reasons.get(r.reason, 0) + 1
        return {
            "run_split_attempts": self.attempts,
            "run_splits_committed": self.kept,
            "run_splits_lost": self.lost,
            "run_splits_skipped": self.skipped,
            "run_splits_redone": len(self.redone),
            "run_redo_reasons": reasons,
        }


class SplitScheduler:
    """Hands out splits (largest estimate first), tracks who holds what, requeues a dead worker's.

    Thread-safe: executors call it from one thread per worker.
    """

    def __init__(self, splits: Iterable[Any], estimate: Callable[[Any], float] | None = None) -> None:
        splits = list(splits)
        weigh = estimate or (lambda s: float(s.num_rows))
        self._weight = {s.index: float(weigh(s)) for s in splits}
        self._pending: list[Any] = sorted(splits, key=self._order_key)
        self._held: dict[str, dict[int, Any]] = {}
        self._done: set[int] = set()
        self._lock = threading.Lock()
        self.counts = SchedulerCounts()
        self.total = len(splits)

    def _order_key(self, split: Any) -> tuple[float, int]:
        return (-self._weight[split.index], split.index)

    def next_split(self, worker: str) -> Any | None:
        """The next split for `worker`, or None when none is left to hand out."""
        with self._lock:
            if not self._pending:
                return None
            split = self._pending.pop(0)
            self._held.setdefault(worker, {})[split.index] = split
            self.counts.attempts += 1
            return split

    def finish(self, worker: str, index: int, outcome: str) -> None:
        """`worker` is done with split `index`: outcome "committed", "lost" or "skipped"."""
        with self._lock:
            if self._held.get(worker, {}).pop(index, None) is None:
                return  # a late report from a worker already declared dead: its split was requeued
            self._done.add(index)
            if outcome == "committed":
                self.counts.kept += 1
            elif outcome == "lost":
                self.counts.lost += 1
            else:
                self.counts.skipped += 1

    def worker_lost(self, worker: str, reason: str) -> list[int]:
        """`worker` died: the splits it held go back to the queue, in estimate order."""
        with self._lock:
            held = self._held.pop(worker, {})
            for index in held:
                self.counts.redone.append(Redo(index, worker, reason))
            self._pending = sorted(self._pending + list(held.values()), key=self._order_key)
            return sorted(held)

    def held_by(self, worker: str) -> list[int]:
        with self._lock:
            return sorted(self._held.get(worker, {}))

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    @property
    def finished(self) -> bool:
        with self._lock:
            return not self._pending and not any(self._held.values())

    def pulled_by(self, worker: str) -> Iterable[Any]:
        """The splits `worker` is handed, one per pull, for an in-process worker."""
        while (split := self.next_split(worker)) is not None:
            yield split
