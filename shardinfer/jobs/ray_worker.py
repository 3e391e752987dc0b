"""The Ray worker actor: one engine on one GPU (or a few CPUs), splits pulled from the driver.

The actor runs the same `run_worker` as a local worker process, on a thread of its own; the
driver talks to it through three small methods (the actor is threaded, so they run beside
`run`):

    run()        load the engine, wait for begin(), open the job, work until told there is
                 no more work
    begin()      the job is planned (its _job.json written): the driver starts actors before
                 it plans, so engine loading overlaps the listing and planning of the input
    poll(t)      the events since the last poll (split requests, progress, commits), waiting
                 up to t seconds for one: the driver's reader for this actor calls it in a loop
    give(split)  the answer to a split request (None: no more work)

Nothing here decides what is done: commits are the create-if-absent markers in the output, as
for local workers, so an actor killed at any instant leaves at worst an uncommitted part.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
from collections.abc import Iterator
from typing import Any

_NO_MORE = object()


class SplitActor:
    """Wrapped by `ray.remote` in ray_executor.py (this module does not import ray)."""

    def __init__(self, config: dict[str, Any], name: str, model_cache_dir: str = "") -> None:
        self.config = config
        self.name = name
        self.model_cache_dir = model_cache_dir
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._answers: queue.Queue[Any] = queue.Queue()
        self._stop = threading.Event()
        self._begun = threading.Event()

    def pid(self) -> int:
        return os.getpid()

    def run(self) -> dict[str, Any]:
        from shardinfer.errors import Interrupted
        from shardinfer.jobs.model_cache import with_local_model
        from shardinfer.jobs.secrets_guard import guard_job, redacted_error
        from shardinfer.pipeline.config import JobConfig
        from shardinfer.pipeline.job import build_engine_marked, open_job, run_worker
        from shardinfer.pipeline.timeline import open_timeline

        guard_job(self.config)  # the actor's log files and its errors, which Ray keeps as text
        try:
            submitted = JobConfig.from_dict(self.config)
            # The engine reads the machine-local copy of a model on object storage; the job is
            # opened with the spec as submitted, whose fingerprint names the model where it lives.
            config = with_local_model(submitted, self.model_cache_dir)
            timeline = open_timeline(config.job.timeline_path)
            engine = build_engine_marked(config, timeline)
            while not self._begun.wait(timeout=0.5):
                if self._stop.is_set():
                    raise Interrupted("stopped before the job was planned")
            job = dataclasses.replace(open_job(submitted, plan=False), config=config)
            result = run_worker(
                job,
                self._pulled(),
                self._stop,
                config.job.run_id,
                emit=self._events.put,
                engine=engine,
                timeline=timeline,
            )
        except Exception as exc:
            raise redacted_error(exc) from None
        return {"engine_stats": result.engine_stats}

    def begin(self) -> None:
        self._begun.set()

    def _pulled(self) -> Iterator[Any]:
        from shardinfer.splits import Split

        while not self._stop.is_set():
            self._events.put({"event": "want_split"})
            answer = self._answers.get()
            if answer is _NO_MORE or answer is None:
                return
            yield Split.from_dict(answer)

    def poll(self, timeout_s: float) -> list[dict[str, Any]]:
        try:
            events = [self._events.get(timeout=timeout_s)]
        except queue.Empty:
            return []
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                return events

    def give(self, split: dict[str, Any] | None) -> None:
        self._answers.put(split)

    def stop(self) -> None:
        """Stop as SIGTERM stops a local worker: abandon uncommitted splits; run() raises Interrupted."""
        self._stop.set()
        self._answers.put(_NO_MORE)
