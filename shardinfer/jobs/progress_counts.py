"""The numbers a person watching a long job wants, kept apart from how they are shown.

Rows count as done when generated, but a split's rows are only kept once its commit marker
is written. A worker that dies takes its uncommitted rows with it, so each worker's generated
but not yet committed rows are tracked separately (`pending`): they count towards the display
while the worker lives and are moved to `rows_redone` when it dies, so "done" never runs past
the total and a reassigned split is not counted twice.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

NOW_WINDOW_S = 30.0  # "tok/s now" is the rate over this trailing window


class JobProgress:
    def __init__(self, total_records: int, total_splits: int, clock: Any = time.monotonic) -> None:
        self.total_records = total_records
        self.total_splits = total_splits
        self._clock = clock
        self.started = clock()
        self.kept_records = 0
        self.splits_done = 0
        self.error_rows = 0
        self.tokens = 0
        self.rows_redone = 0
        self._pending: dict[str, int] = {}
        self._samples: deque[tuple[float, int]] = deque([(self.started, 0)])

    # ---- events ---------------------------------------------------------------------------
    def generated(self, worker: str, records: int, tokens: int) -> None:
        self._pending[worker] = self._pending.get(worker, 0) + records
        self.tokens += tokens
        now = self._clock()
        self._samples.append((now, self.tokens))
        while len(self._samples) > 2 and self._samples[1][0] < now - NOW_WINDOW_S:
            self._samples.popleft()

    def split_done(self, worker: str, event: dict[str, Any]) -> None:
        records = int(event.get("records", 0))
        # Error rows made before the engine are in `records` but were never reported as generated.
        self._pending[worker] = max(0, self._pending.get(worker, 0) - records)
        if event.get("won"):
            self.kept_records += records
            self.splits_done += 1
            self.error_rows += int(event.get("rows_error", 0))
        else:
            self.rows_redone += records

    def worker_lost(self, worker: str) -> None:
        self.rows_redone += self._pending.pop(worker, 0)

    # ---- derived --------------------------------------------------------------------------
    @property
    def rows_done(self) -> int:
        return min(self.total_records, self.kept_records + sum(self._pending.values()))

    def elapsed(self) -> float:
        return max(self._clock() - self.started, 1e-9)

    def tokens_per_s_avg(self) -> float:
        return self.tokens / self.elapsed()

    def tokens_per_s_now(self) -> float:
        first_t, first_tokens = self._samples[0]
        span = self._clock() - first_t
        return (self.tokens - first_tokens) / span if span > 0 else 0.0

    def eta_s(self) -> float | None:
        """Seconds left at the average row rate so far; None before the first row."""
        done = self.rows_done
        if done <= 0:
            return None
        return (self.total_records - done) * self.elapsed() / done

    def fields(self) -> dict[str, Any]:
        """Numeric progress fields, for JSON log lines."""
        eta = self.eta_s()
        return {
            "rows_done": self.rows_done,
            "rows_total": self.total_records,
            "splits_done": self.splits_done,
            "splits_total": self.total_splits,
            "tok_per_s_now": round(self.tokens_per_s_now(), 1),
            "tok_per_s_avg": round(self.tokens_per_s_avg(), 1),
            "eta_s": round(eta, 1) if eta is not None else None,
            "error_rows": self.error_rows,
            "rows_redone": self.rows_redone,
        }

    def postfix(self) -> str:
        """The live line's tail after the bar: splits, rates, ETA, errors."""
        eta = self.eta_s()
        eta_text = "?" if eta is None else f"{int(eta) // 60}:{int(eta) % 60:02d}"
        text = (
            f"splits {self.splits_done}/{self.total_splits}, {self.tokens_per_s_now():.0f} tok/s now, "
            f"{self.tokens_per_s_avg():.0f} avg, ETA {eta_text}, {self.error_rows} error rows"
        )
        return text + (f", {self.rows_redone} rows redone" if self.rows_redone else "")
