"""The record one run keeps of itself at the output location (`_runs/{run_id}.json`).

    started, host, pid, workers          when the run has the output location (after planning)
    version, numerics_revision           the shardinfer that ran, and its kernels' arithmetic
                                         (engine/release.py)
    heartbeat                            rewritten every HEARTBEAT_S seconds while it runs
    ended, exit_code, state, reason      when it ends, whatever the ending (an exception included)
    splits_committed, repaired, counters what this run did

A run killed with SIGKILL cannot write its end: its heartbeat stops, and `status` calls it
interrupted once the heartbeat is older than STALE_AFTER_S.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

from shardinfer.engine import release
from shardinfer.errors import EXIT_OK
from shardinfer.writers.job_file import utc_now
from shardinfer.writers.run_records import create_run_record, update_run_record

HEARTBEAT_S = 10.0
STALE_AFTER_S = 6 * HEARTBEAT_S


def state_of_exit(code: int) -> str:
    return "done" if code == EXIT_OK else "failed"


class RunRecorder:
    """Writes and keeps up to date one run's record; `warn` is told when a write fails."""

    def __init__(self, store: Any, run_id: str, workers: int, warn: Any = None) -> None:
        self.store = store
        self.warn = warn or (lambda message, **fields: None)
        self.record: dict[str, Any] = {
            "run_id": run_id,
            "state": "running",
            "started": utc_now(),
            "heartbeat": utc_now(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "workers": workers,
            "generation": getattr(store, "_generation", None),
            "version": release.VERSION,
            "numerics_revision": release.NUMERICS_REVISION,
        }
        self.name = create_run_record(store, run_id, self.record)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="shardinfer-heartbeat", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        try:
            update_run_record(self.store, self.name, self.record)
        except Exception as exc:  # a lost heartbeat must not fail the job; it is reported instead
            self.warn(f"could not update the run record _runs/{self.name}: {exc}")

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with self._lock:
                self.record["heartbeat"] = utc_now()
                self._write()

    def update(self, **fields: Any) -> None:
        with self._lock:
            self.record.update(fields)
            self._write()

    def finish(self, exit_code: int, reason: str, interrupted: bool = False, **fields: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            self.record.update(fields)
            self.record.update(
                ended=utc_now(),
                heartbeat=utc_now(),
                exit_code=exit_code,
                reason=reason,
                state="interrupted" if interrupted else state_of_exit(exit_code),
            )
            self._write()
