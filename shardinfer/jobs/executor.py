"""Local executors: `local` runs the worker in this process, `local[N]` runs N worker processes.

Either way the driver's split scheduler (split_scheduler.py) decides who computes what: a worker
asks for a split when it has room for one, so every split is computed once, the biggest first,
and a split is computed again only after its worker died (split_driver.py reassigns it and
starts a replacement). The commit markers stay the source of truth for what is done.

A worker process talks to the driver over its pipes, one JSON object per line: on stdin the
payload (resolved job config, worker name) and then one `{"split": ...}` answer per request; on
stdout its events (split requests, progress, commits, its final statistics).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shardinfer.engine.config import usable_cpus
from shardinfer.errors import UsageError
from shardinfer.jobs.progress import Reporter
from shardinfer.jobs.split_driver import Inbox, RunStats, drive
from shardinfer.jobs.split_estimate import split_estimator
from shardinfer.jobs.split_scheduler import SplitScheduler
from shardinfer.pipeline.job import OpenedJob, run_worker, schema_to_text

if TYPE_CHECKING:
    from shardinfer.jobs.engine_prestart import EnginePrestart

_MASTER = re.compile(r"^local(?:\[(\*|\d+)\])?$")


def parse_master(master: str) -> int:
    """'local' -> 1, 'local[N]' -> N, 'local[*]' -> CPU count (GPU count when CUDA is visible)."""
    m = _MASTER.match(master.strip())
    if not m:
        raise UsageError(
            f"--master {master!r} is not supported: use local, local[N], local[*], ray or ray://HOST:PORT"
        )
    if m.group(1) is None:
        return 1
    if m.group(1) == "*":
        return max(1, _device_count() or usable_cpus())
    n = int(m.group(1))
    if n < 1:
        raise UsageError(f"--master {master!r}: N must be >= 1")
    return n


def _runs_on_cpu(device: str) -> bool:
    """Whether a worker given model.device `device` runs its engine on the CPU."""
    return device == "cpu" or (device == "auto" and _device_count() == 0)


def _device_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def _gpu_env(device: str, slot: int) -> dict[str, str]:
    """One GPU per worker: slot i sees only the i-th visible GPU (round-robin past the count)."""
    if device not in ("auto", "cuda"):
        return {}  # cpu, or an explicit cuda:N the user chose for every worker
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = (
        [d for d in visible.split(",") if d.strip()] if visible else [str(i) for i in range(_device_count())]
    )
    return {"CUDA_VISIBLE_DEVICES": ids[slot % len(ids)].strip()} if ids else {}


def worker_env(device: str, slot: int, num_workers: int, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of local worker `slot` of `num_workers`, given model.device and ours."""
    env = dict(environ)
    env.update(_gpu_env(device, slot))
    if _runs_on_cpu(device) and "OMP_NUM_THREADS" not in environ:
        # N CPU workers share the cores; torch's default (all cores each) oversubscribes them.
        env["OMP_NUM_THREADS"] = str(max(1, usable_cpus() // num_workers))
    return env


def make_scheduler(job: OpenedJob) -> SplitScheduler:
    """A scheduler over the splits not yet committed, biggest estimated first."""
    remaining = [s for s in job.splits if s.index not in job.committed]
    estimate = split_estimator(
        remaining, job.input_spec, job.sampling.max_tokens or 0, int(job.sampling.n or 1)
    )
    return SplitScheduler(remaining, estimate)


def run_in_process(
    job: OpenedJob,
    scheduler: SplitScheduler,
    stop: threading.Event,
    reporter: Reporter,
    stats: RunStats,
    prestart: EnginePrestart | None = None,
) -> None:
    """Run the job's splits on one engine in this process: the one `prestart` built while the job
    was planned when it was built for this job's model and engine settings, else one built here."""

    def emit(event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "split_done":
            scheduler.finish("0", int(event["split"]), "committed" if event.get("won") else "lost")
        elif kind == "split_skipped":
            scheduler.finish("0", int(event["split"]), "skipped")
        reporter.handle(event)

    from shardinfer.jobs.model_cache import with_local_model

    local_job = dataclasses.replace(job, config=with_local_model(job.config))
    engine, timeline = None, None
    if prestart is not None and prestart.serves(job.config):
        engine, timeline = prestart.take(), prestart.timeline
    result = run_worker(
        local_job,
        scheduler.pulled_by("0"),
        stop,
        job.config.job.run_id,
        emit=emit,
        engine=engine,
        timeline=timeline,
    )
    stats.add({"engine_stats": result.engine_stats})


def run_processes(
    job: OpenedJob,
    scheduler: SplitScheduler,
    num_workers: int,
    stop: threading.Event,
    reporter: Reporter,
    stats: RunStats,
) -> None:
    """N worker processes fed by the scheduler; a dead one is replaced (up to N restarts)."""
    inbox: Inbox = queue.Queue()

    schema = schema_to_text(job.input_schema)  # read once here, not once per worker

    def start(name: str, slot: int) -> ProcessWorker:
        return ProcessWorker(name, slot, job, schema, num_workers, inbox)

    drive(scheduler, inbox, start, num_workers, reporter, stats, stop, max_restarts=num_workers)


class ProcessWorker:
    """One `python -m shardinfer.jobs.worker` process and the thread that reads its events."""

    def __init__(
        self, name: str, slot: int, job: OpenedJob, input_schema: str, num_workers: int, inbox: Inbox
    ) -> None:
        self.name = name
        env = worker_env(job.config.model.device, slot, num_workers, os.environ)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "shardinfer.jobs.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._stdin_lock = threading.Lock()
        self._send({"config": job.config.to_dict(), "worker": name, "input_schema": input_schema})
        self._pump = threading.Thread(target=self._read_events, args=(inbox,), daemon=True)
        self._pump.start()

    def _send(self, message: dict[str, Any]) -> None:
        with self._stdin_lock:
            stdin = self._proc.stdin
            if stdin is None or stdin.closed:
                return
            try:
                stdin.write(json.dumps(message) + "\n")
                stdin.flush()
            except (BrokenPipeError, ValueError):
                pass  # the worker is gone; its exit is reported by the event reader

    def give(self, split: Any | None) -> None:
        self._send({"split": split.to_dict() if split is not None else None})

    def _close_stdin(self) -> None:
        with self._stdin_lock:
            if self._proc.stdin is not None and not self._proc.stdin.closed:
                with contextlib.suppress(BrokenPipeError):
                    self._proc.stdin.close()

    def terminate(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
        self._close_stdin()  # a request the worker is waiting on answers "no more work"

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()

    def _read_events(self, inbox: Inbox) -> None:
        assert self._proc.stdout is not None  # stdout=PIPE above
        for line in self._proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a stray print from a library, not an event
            if isinstance(event, dict):
                inbox.put((self.name, event))
        code = self._proc.wait()
        self._close_stdin()
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        inbox.put((self.name, {"event": "exited", "code": code, "reason": how}))
