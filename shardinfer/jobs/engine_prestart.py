"""The engine of a one-worker local job, built while the job is planned.

Planning (listing the input, reading Parquet footers, the fingerprint, the plan file) and building
the engine (weights to the device, KV sizing, warm-up, CUDA graphs) need nothing from each other,
so the build starts on a thread as soon as the job's configuration is known instead of after the
plan: the job's first step comes that much sooner. (Only for a model on a local path: a model in
object storage is copied first, and a plan error should not wait for that copy.)

The build is always waited for before the job goes on or ends, whatever happened to the plan: a
build cannot be stopped half way, and a process that exits while a thread still loads weights or
launches device work may not exit cleanly. An error of the build (a bad [engine] key, a model that
does not load) reaches the job where it did before, when the engine is taken; an error of the plan
comes first, as it did, and the build's outcome is then dropped.
"""

from __future__ import annotations

import threading
from typing import Any

from shardinfer.pipeline.timeline import Timeline


class EnginePrestart:
    """One engine build on a thread; `take()` hands it over once, `close()` waits and drops it."""

    def __init__(self, config: Any, timeline: Timeline | None) -> None:
        self.config = config  # what the engine is built for: a job on another config builds its own
        self.timeline = timeline
        self._engine: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._build, name="engine-build", daemon=True)
        self._thread.start()

    def _build(self) -> None:
        from shardinfer.jobs.model_cache import with_local_model
        from shardinfer.pipeline.job import build_engine_marked

        try:
            self._engine = build_engine_marked(with_local_model(self.config), self.timeline)
        except BaseException as exc:  # handed to the job's thread by take()
            self._error = exc

    def serves(self, config: Any) -> bool:
        """Whether the engine being built is the one `config` asks for."""
        return bool(config.model == self.config.model and config.engine == self.config.engine)

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
        """Wait for the build and drop what it made (no-op after take())."""
        self._thread.join()
        self._engine = None
        self._error = None
