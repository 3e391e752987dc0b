"""Entry point of one `local[N]` worker process: `python -m shardinfer.jobs.worker < payload.json`.

The payload is the resolved job config, this worker's index and the input schema the parent
read; the split plan comes from the output's `_job.json`, written by the parent before any
worker starts. Events go to stdout as
JSON lines; logs and errors to stderr; the exit code follows shardinfer.errors.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

from shardinfer.errors import EXIT_OK, exit_code_for
from shardinfer.pipeline.config import JobConfig


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event, default=str) + "\n")
    sys.stdout.flush()


def _watch_parent(stop: threading.Event, parent: int) -> None:
    """Stop when the parent dies (a kill -9 of the job must not leave workers running on)."""
    while not stop.is_set():
        if os.getppid() != parent:
            stop.set()
            return
        time.sleep(0.5)


def main() -> int:
    payload = json.loads(sys.stdin.read())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threading.Thread(target=_watch_parent, args=(stop, os.getppid()), daemon=True).start()
    try:
        from shardinfer.jobs.executor import worker_order
        from shardinfer.pipeline.job import open_job, run_worker, schema_from_text

        config = JobConfig.from_dict(payload["config"])
        job = open_job(config, plan=False)
        if payload.get("input_schema"):
            job.input_schema_ = schema_from_text(payload["input_schema"])
        order = worker_order(job.splits, int(payload["worker"]), int(payload["num_workers"]))
        result = run_worker(job, order, stop, config.job.run_id, emit=_emit)
        _emit(result.to_event())
        return EXIT_OK
    except BaseException as exc:
        print(f"[shardinfer] ERROR worker {payload.get('worker')}: {exc}", file=sys.stderr, flush=True)
        return exit_code_for(exc)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything this worker committed is already durable. Skip interpreter teardown: a reader or
    # writer thread still inside native code (pyarrow, duckdb, torch) when a stopped worker
    # finalizes can abort the process (SIGABRT), which the parent would report as a crash.
    os._exit(code)
