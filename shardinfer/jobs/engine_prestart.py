"""The engine of a one-worker local job, built while the job is planned.

Planning (listing the input, reading Parquet footers, the fingerprint, the plan file) and building
the engine (weights to the device, KV sizing, warm-up, CUDA graphs) need nothing from each other,
so the build starts on a thread as soon as the job's configuration is known instead of after the
plan: the job's first step comes that much sooner. (Only for a model on a local path: a model in
object storage is copied first, and a plan error should not wait for that copy.)

A job that goes on waits for the build before it writes its plan. An error of the build (a bad
[engine] key, a model that does not load) reaches the job where it did before, when the engine is
taken; an error of the plan comes first, as it did, and the build's outcome is then dropped.

A job that ends without the engine (a plan refused, a stop while planning or while the engine is
still built, a job already complete) does not wait for the build: a model load can take minutes,
and the user is owed the error at once. The build cannot be stopped half way, and an interpreter
that tears itself down while a thread is inside torch or safetensors may abort, so the command
ends its process without that teardown (jobs/cli.py, `main`), as a local[N] worker does; nothing
is lost, since such a job has written nothing its exit could leave half done. A program that runs
the command in-process waits for the dropped build instead, once the error is printed, so that no
build outlives the call.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Any

from shardinfer.pipeline.timeline import Timeline

# Builds that close() dropped while they still ran: the command's exit must not wait for them.
_dropped: list[threading.Thread] = []

# How often a wait for the build looks at the job's stop event (a signal's handler sets it).
_STOP_POLL_S = 0.2


class EnginePrestart:
    """One engine build on a thread; `take()` hands it over once, `close()` drops it unwaited."""

    def __init__(self, config: Any, timeline: Timeline | None) -> None:
        self.config = config  # what the engine is built for: a job on another config builds its own
        self.timeline = timeline
        self._engine: Any = None
        self._error: BaseException | None = None
        self._closed = False  # set by close(): what the build makes is then let go on its thread
        self._lock = threading.Lock()
        # torch is imported here, on the caller's thread, before the build starts: its import is
        # not safe from two threads at once (one of them can get the half-initialised module), and
        # planning may import it too. Commands that build no engine never import it.
        import torch  # noqa: F401

        # A daemon: a dropped build must not keep the process alive.
        self._thread = threading.Thread(target=self._build, name="engine-build", daemon=True)
        self._thread.start()

    def _build(self) -> None:
        from shardinfer.jobs.model_cache import with_local_model
        from shardinfer.pipeline.job import build_engine_marked

        engine: Any = None
        error: BaseException | None = None
        try:
            engine = build_engine_marked(with_local_model(self.config), self.timeline)
        except BaseException as exc:  # handed to the job's thread by take()
            error = exc
        with self._lock:
            if not self._closed:
                self._engine, self._error = engine, error
        # A dropped build's engine is released here, on this thread, when `engine` goes.

    def serves(self, config: Any) -> bool:
        """Whether the engine being built is the one `config` asks for."""
        return bool(config.model == self.config.model and config.engine == self.config.engine)

    def wait(self, stop: threading.Event) -> bool:
        """Wait for the build; False when `stop` is set first (a signal asked the job to stop: it
        then ends without the engine, and close() drops the build)."""
        while self._thread.is_alive():
            if stop.is_set():
                return False
            self._thread.join(_STOP_POLL_S)
        return True

    def raise_build_error(self) -> None:
        """Wait for the build and raise its error, if it failed; a built engine stays for take().
        Called before the job writes its plan: a spec this model cannot run (a max_model_len past
        its positions, MTP without an MTP layer) must not leave the output location owned by a job
        that never ran, which the corrected spec, another fingerprint, could then not use."""
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def take(self) -> Any:
        """The built engine (waiting for the build), or the build's error raised here."""
        self._thread.join()
        engine, self._engine = self._engine, None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return engine

    def close(self) -> None:
        """Drop the build without waiting for it (no-op after take()): the job ends without its
        engine, and what the build still makes is released as soon as it is made."""
        with self._lock:
            self._closed = True
            self._engine = self._error = None
        if self._thread.is_alive():
            _dropped[:] = [t for t in _dropped if t.is_alive()] + [self._thread]


def dropped_build_running() -> bool:
    """Whether a build that close() dropped is still running."""
    return any(t.is_alive() for t in _dropped)


def wait_for_dropped_builds() -> None:
    """Wait for every build that close() dropped: for a program running the command in-process,
    which must not be left with a thread building an engine nobody takes."""
    while _dropped:
        _dropped.pop().join()


def end_dropped_builds() -> None:
    """Before the process exits past a dropped build that still runs: end the processes the build
    started (an expert-parallel engine's ranks), which would otherwise go on loading their share of
    the model on the devices, then fail on the pipes of a driver that is gone. They are this
    process's children: a one-worker local job has started no other before its first split."""
    for pid in _child_pids():
        with contextlib.suppress(ProcessLookupError, PermissionError):  # ended since, its pid maybe reused
            os.kill(pid, signal.SIGTERM)


def _child_pids() -> list[int]:
    """This process's child processes, read from /proc (none where there is no /proc)."""
    me = os.getpid()
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (command) state ppid ...": the command may hold spaces and parentheses.
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a process that ended since /proc was listed
        if ppid == me:
            children.append(int(stat.parent.name))
    return children
