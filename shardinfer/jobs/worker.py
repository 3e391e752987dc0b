"""Entry point of one `local[N]` worker process: `python -m shardinfer.jobs.worker`.

The first stdin line is the payload (resolved job config, this worker's name, the input schema
the parent read). The worker then pulls its splits from the driver: it writes
`{"event": "want_split"}` to stdout whenever it has room for another split and reads the answer,
`{"split": {...}}` or `{"split": null}` (no more work), from stdin; a closed stdin (the driver
stopping, or gone) also means no more work. Other events go to stdout as JSON lines; logs and
errors to stderr; the exit code follows shardinfer.errors.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

from shardinfer.errors import EXIT_OK, Interrupted, exit_code_for
from shardinfer.jobs.secrets_guard import guard_job
from shardinfer.pipeline.config import JobConfig

_stdout_lock = threading.Lock()  # the engine, preparation and writer threads all emit


def _emit(event: dict[str, Any]) -> None:
    line = json.dumps(event, default=str) + "\n"
    with _stdout_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def pulled_splits(requests: TextIO) -> Iterator[Any]:
    """The splits the driver hands this worker, one request and one answer at a time."""
    from shardinfer.splits import Split

    while True:
        _emit({"event": "want_split"})
        line = requests.readline()
        if not line:
            return
        answer = json.loads(line).get("split")
        if answer is None:
            return
        yield Split.from_dict(answer)


def _watch_parent(stop: threading.Event, parent: int) -> None:
    """Stop when the parent dies (a kill -9 of the job must not leave workers running on)."""
    while not stop.is_set():
        if os.getppid() != parent:
            stop.set()
            return
        time.sleep(0.5)


def main() -> int:
    payload = json.loads(sys.stdin.readline())
    # The spec arrives with its credentials (in memory, over the pipe): this process needs them to
    # read and write, and prints nothing that carries them.
    guard_job(payload.get("config", {}))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Ctrl-C is the driver's to act on: a terminal sends it to the whole process group, the driver
    # then stops its workers (SIGTERM), and a driver started with SIGINT ignored keeps running. A
    # worker stopping on its own SIGINT would look to that driver like a worker that died.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(stop, os.getppid()), daemon=True).start()
    try:
        from shardinfer.jobs.model_cache import with_local_model
        from shardinfer.pipeline.job import open_job, run_worker, schema_from_text

        # The job is opened with its spec as submitted (its fingerprint names the model where the
        # user put it); only the engine reads the machine-local copy of a model on object storage.
        config = JobConfig.from_dict(payload["config"])
        job = dataclasses.replace(open_job(config, plan=False), config=with_local_model(config))
        if payload.get("input_schema"):
            job.input_schema_ = schema_from_text(payload["input_schema"])
        result = run_worker(job, pulled_splits(sys.stdin), stop, config.job.run_id, emit=_emit)
        _emit(result.to_event())
        return EXIT_OK
    except BaseException as exc:
        # A worker the driver stopped (SIGTERM: Ctrl-C, preemption) did as asked; the driver says why
        # the job stopped, once. Anything else is this worker's own failure.
        if not (isinstance(exc, Interrupted) and stop.is_set()):
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
