"""One worker's data flow: reader/preparer thread -> engine loop -> writer thread.

    [prep thread]  read_split batches -> RowPreparer (chat template, tokenise, overrides)
          |  bounded queue (rows), at most `max_splits_in_flight` splits open
    [engine loop]  add_request while num_unfinished < max_inflight (backpressure), step(),
          |        results into per-split SplitAssembly
    [writer thread] complete split -> Arrow table in input order -> write_part -> commit

The engine loop runs on the calling thread and is the only one that touches the engine. A stop
(SIGTERM, or the parent process gone) stops admission, aborts in-flight requests, lets the
writer finish splits that were already complete, and raises Interrupted: nothing half-done is
ever committed, so a rerun redoes exactly the abandoned splits and, sampling being
deterministic, writes the same rows.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from shardinfer.engine.heap import freeze_startup_heap
from shardinfer.errors import INVALID_REQUEST, Interrupted, ShardinferError
from shardinfer.pipeline.assembly import Failed, OutputOptions, SplitAssembly, engine_result
from shardinfer.pipeline.config import JobSection
from shardinfer.pipeline.messages import (
    PreparationDone,
    PrepMessage,
    RowsPrepared,
    SplitOpened,
    SplitRead,
    SplitToWrite,
    WriteMessage,
    WriterStop,
)
from shardinfer.pipeline.part_table import Entry, build_part_table
from shardinfer.pipeline.rows import PreparedRow, RowPreparer
from shardinfer.pipeline.seams import Engine, SplitStore
from shardinfer.pipeline.timeline import Timeline
from shardinfer.splits import Split
from shardinfer.testing.faults import crash_point

if TYPE_CHECKING:
    from shardinfer.readers.spec import InputSpec

Event = dict[str, Any]
WORKER_DONE = "worker_done"  # the event a worker process ends with, carrying its WorkerResult


@dataclass
class WorkerSettings:
    max_inflight_requests: int = JobSection.max_inflight_requests
    max_splits_in_flight: int = 2
    batch_rows: int = 256
    run_id: str = "run"
    progress_interval_s: float = 1.0


@dataclass
class WorkerResult:
    committed: list[int] = field(default_factory=list)  # splits this worker committed
    lost: list[int] = field(default_factory=list)  # splits another attempt committed first
    skipped: list[int] = field(default_factory=list)  # already committed when reached
    engine_stats: dict[str, Any] = field(default_factory=dict)

    def to_event(self) -> Event:
        """The `worker_done` event a worker process sends its parent (one JSON line)."""
        return {
            "event": WORKER_DONE,
            "committed": self.committed,
            "lost": self.lost,
            "skipped": self.skipped,
            "engine_stats": self.engine_stats,
        }

    @classmethod
    def from_event(cls, event: Event) -> WorkerResult:
        return cls(
            committed=[int(i) for i in event.get("committed", [])],
            lost=[int(i) for i in event.get("lost", [])],
            skipped=[int(i) for i in event.get("skipped", [])],
            engine_stats=dict(event.get("engine_stats", {})),
        )


class SplitWorker:
    """Runs the splits of `order` (skipping committed ones) through one engine, exactly once each."""

    def __init__(
        self,
        *,
        engine: Engine,
        preparer: RowPreparer,
        store: SplitStore,
        input_spec: InputSpec,
        schema: pa.Schema,
        metadata: dict[str, str],
        options: OutputOptions,
        settings: WorkerSettings,
        stop: threading.Event,
        emit: Callable[[Event], None] = lambda e: None,
        read_split: Callable[..., Iterable[pa.RecordBatch]] | None = None,
        timeline: Timeline | None = None,
    ) -> None:
        if read_split is None:
            from shardinfer.readers.splits import read_split as default_read_split

            read_split = default_read_split
        self.engine = engine
        self.preparer = preparer
        self.store = store
        self.input_spec = input_spec
        self.schema = schema
        self.metadata = metadata
        self.options = options
        self.settings = settings
        self.stop = stop
        self.emit = emit
        self._read_split = read_split
        self.timeline = timeline
        # Prepared rows travel a read batch at a time (one queue hand-off per batch, not per row);
        # two batches queued plus the one being admitted bound the read-ahead beyond open splits.
        self._rows: queue.Queue[PrepMessage] = queue.Queue(maxsize=2)
        self._writes: queue.Queue[WriteMessage] = queue.Queue()
        self._open_splits = threading.Semaphore(max(1, settings.max_splits_in_flight))
        self._fatal: list[BaseException] = []
        # Set when the engine loop has ended, for whatever reason: the preparation thread stops
        # feeding rows nobody will read, so run() can wait for it before the process exits.
        self._engine_done = threading.Event()
        self._committed_cache: set[int] = set()
        self._committed_at = 0.0
        self.result = WorkerResult()

    # ---- preparation thread -------------------------------------------------------------
    def _is_committed(self, index: int) -> bool:
        # One listing of _commits/ serves many splits; refreshing at most every 2 s keeps a big
        # job from listing the prefix once per split while still noticing other workers' commits.
        if time.monotonic() - self._committed_at > 2.0:
            self._committed_cache = self.store.committed_indexes()
            self._committed_at = time.monotonic()
        return index in self._committed_cache

    def _put(self, item: PrepMessage) -> bool:
        while not (self.stop.is_set() or self._engine_done.is_set()):
            try:
                self._rows.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _prepare_loop(self, order: Iterable[Split]) -> None:
        # A slot is taken before the next split is pulled: when `order` pulls from the driver's
        # scheduler, a worker then holds only the splits it can work on, and the rest stay with
        # the driver for whichever worker frees a slot first.
        splits = iter(order)
        try:
            while True:
                while not self._open_splits.acquire(timeout=0.1):
                    if self.stop.is_set() or self._engine_done.is_set():
                        return
                split = None if self.stop.is_set() else next(splits, None)
                if split is None:
                    self._open_splits.release()
                    return
                if self._is_committed(split.index):
                    self._open_splits.release()
                    self.result.skipped.append(split.index)
                    self.emit({"event": "split_skipped", "split": split.index})
                    continue
                if not self._put(SplitOpened(split)):
                    return
                pos = 0
                for batch in self._read_split(split, self.input_spec, self.settings.batch_rows):
                    rows = batch.to_pylist()
                    prepared = self._prepare_batch(split, pos, rows)
                    if not self._put(RowsPrepared(prepared)):
                        return
                    pos += len(rows)
                if not self._put(SplitRead(split.index, pos)):
                    return
        except BaseException as exc:  # surfaced on the engine thread, which owns the exit code
            self._fatal.append(exc)
        finally:
            self._put(PreparationDone())

    def _prepare_batch(self, split: Split, first_pos: int, rows: list[dict[str, Any]]) -> list[PreparedRow]:
        batch = getattr(self.preparer, "prepare_batch", None)
        if batch is not None:
            return list(batch(split.index, split.file_index, first_pos, rows))
        # A preparer of its own (score jobs) that prepares row by row.
        return [
            self.preparer.prepare(split.index, split.file_index, first_pos + k, row)
            for k, row in enumerate(rows)
        ]

    # ---- writer thread ------------------------------------------------------------------
    def _write_loop(self) -> None:
        while True:
            item = self._writes.get()
            if isinstance(item, WriterStop):
                return
            try:
                self._write_split(item.split, item.entries)
            except BaseException as exc:
                self._fatal.append(exc)
                return
            finally:
                self._open_splits.release()

    def _write_split(self, split: Split, entries: list[Entry]) -> None:
        table, stats = build_part_table(entries, self.schema, self.options)
        attempt = attempt_id(self.settings.run_id)
        meta = dict(self.metadata)
        meta["shardinfer.split_stats"] = _json(stats)
        part = self.store.write_part(split, attempt, table, meta)
        crash_point("after_part", split.index)
        won = self.store.commit(split, part)
        crash_point("after_commit", split.index)
        (self.result.committed if won else self.result.lost).append(split.index)
        if self.timeline is not None:
            self.timeline.mark("split_committed", split=split.index, won=won, **stats)
        self.emit({"event": "split_done", "split": split.index, "won": won, **stats})

    # ---- engine loop --------------------------------------------------------------------
    def run(self, order: Iterable[Split]) -> WorkerResult:
        # Imports, the engine and the job's setup live as long as the worker: out of the cyclic
        # collector's view, its collections walk only the rows in flight (engine/heap.py), not
        # the whole heap each time the per-row churn crosses a threshold.
        freeze_startup_heap()
        prep = threading.Thread(
            target=self._prepare_loop, args=(order,), name="shardinfer-prepare", daemon=True
        )
        writer = threading.Thread(target=self._write_loop, name="shardinfer-write", daemon=True)
        prep.start()
        writer.start()
        if self.timeline is not None:
            self.timeline.watch_engine(self.engine)
        try:
            self._engine_loop()
        finally:
            if self.timeline is not None:
                self.timeline.engine_done()
            self._engine_done.set()
            self._writes.put(WriterStop())
            writer.join()
            if self.timeline is not None:
                self.timeline.close()
            # A process exiting while this thread is inside native code (a parquet read, a
            # tokenizer call) can abort in the C++ runtime: wait for it to reach a check.
            prep.join(timeout=30)
        self.result.engine_stats = dict(self.engine.stats())
        if self._fatal:
            raise self._fatal[0]
        if self.stop.is_set():
            raise Interrupted(
                "stopped before every split was done; abandoned splits were not committed — "
                "rerun the same command to finish"
            )
        return self.result

    def _engine_loop(self) -> None:
        engine = self.engine
        open_splits: dict[int, SplitAssembly] = {}
        inflight: dict[str, tuple[PreparedRow, int]] = {}
        prep_done = False
        pending: deque[PreparedRow] = deque()  # rows of the newest prepared batch not yet admitted
        tokens_since = 0
        rows_since = 0
        last_emit = time.monotonic()
        while True:
            if self.stop.is_set() or self._fatal:
                for rid in list(inflight):
                    engine.abort(rid)
                return
            # Admission: pull prepared rows while the engine has room (backpressure bound).
            # Messages are taken in order, and the next only once `pending` is empty, so a split's
            # SplitRead is seen after every one of its rows was admitted.
            while not prep_done and engine.num_unfinished < self.settings.max_inflight_requests:
                if pending:
                    row = pending.popleft()
                    self._admit(row, open_splits[row.split_index], inflight)
                    continue
                idle = not engine.has_unfinished()
                try:
                    item = self._rows.get(timeout=0.05) if idle else self._rows.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, RowsPrepared):
                    pending.extend(item.rows)
                elif isinstance(item, SplitOpened):
                    open_splits[item.split.index] = SplitAssembly(item.split)
                elif isinstance(item, SplitRead):
                    open_splits[item.split_index].expected_rows = item.rows
                else:
                    prep_done = True
            if engine.has_unfinished():
                step_tokens = step_requests = 0
                for out in engine.step():
                    step_tokens += self._finish(out, inflight, open_splits)
                    step_requests += 1
                rows_since += step_requests
                tokens_since += step_tokens
                if self.timeline is not None:
                    self.timeline.step(step_tokens, step_requests)
            for index in [i for i, a in open_splits.items() if a.complete]:
                done = open_splits.pop(index)
                self._writes.put(SplitToWrite(done.split, done.ordered()))
            now = time.monotonic()
            if now - last_emit >= self.settings.progress_interval_s and (tokens_since or rows_since):
                self.emit({"event": "progress", "records": rows_since, "completion_tokens": tokens_since})
                tokens_since = rows_since = 0
                last_emit = now
            if prep_done and not open_splits and not engine.has_unfinished():
                if tokens_since or rows_since:
                    self.emit({"event": "progress", "records": rows_since, "completion_tokens": tokens_since})
                return

    def _finish(
        self, out: Any, inflight: dict[str, tuple[PreparedRow, int]], open_splits: dict[int, SplitAssembly]
    ) -> int:
        """File a finished request's result in its split, as the engine gave it; returns the tokens
        it generated. (Scoring jobs override this and `_admit`, filing ready-made records: see
        score_worker.py.)"""
        row, j = inflight.pop(out.request_id)
        open_splits[row.split_index].put(row.pos, j, engine_result(out))
        return len(out.outputs[0].token_ids)

    def _admit(
        self, row: PreparedRow, assembly: SplitAssembly, inflight: dict[str, tuple[PreparedRow, int]]
    ) -> None:
        assembly.add_row(row)
        if row.error is not None:
            for j in range(row.n):
                assembly.put(row.pos, j, Failed(row.error.code, row.error.message))
            return
        assert row.prompt_ids is not None  # RowPreparer sets it on every row without an error
        for j, params in enumerate(row.params):
            rid = f"{row.split_index}/{row.pos}/{j}"
            try:
                self.engine.add_request(rid, row.prompt_ids, params)
            except ValueError as exc:  # the engine refuses a request with a ValueError, and goes on
                code = exc.error_code if isinstance(exc, ShardinferError) else INVALID_REQUEST
                assembly.put(row.pos, j, Failed(code, str(exc)))
                continue
            inflight[rid] = (row, j)


def attempt_id(run_id: str) -> str:
    """A unique id for one attempt at one split: the run id (made file-name safe) plus randomness.

    Scheduler run ids carry characters such as ':' and '+' (`scheduled__2024-01-01T00:00:00+00:00`)
    that do not belong in object names; they become '_' and the id is cut to fit 64 characters.
    """
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id).lstrip("_.-")[:48] or "run"
    return f"{safe}-{uuid.uuid4().hex[:12]}"


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
