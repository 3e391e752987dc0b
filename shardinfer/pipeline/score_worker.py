"""The split worker of score jobs: the generation worker's threads, commits and resume, with
scoring spans in place of sampled completions.

Only admission and completion differ (`_admit`, `_finish`). Of a row's continuations, the first
enters the engine alone; the others wait until it has finished, by which time the context's
full KV blocks are in the prefix cache, so each follower prefills only its continuation (and
the context's last partial block). Rolling windows of a document share no prefix and all enter
at once; the document's record is filed when its last window is scored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

from shardinfer.errors import ENGINE_ERROR, INVALID_REQUEST
from shardinfer.pipeline.assembly import SplitAssembly
from shardinfer.pipeline.rows import PreparedRow
from shardinfer.pipeline.runner import SplitWorker
from shardinfer.pipeline.score_rows import ScoreRow, document_record, pair_record, score_error_record
from shardinfer.pipeline.scoring import SpanScore, add_span, span_score

Inflight = dict[str, tuple[PreparedRow, int]]


class ScoreWorker(SplitWorker):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._followers: dict[str, list[tuple[str, ScoreRow, int]]] = {}  # leader id -> waiting spans
        self._windows: dict[str, list[SpanScore | None]] = {}  # document row key -> window scores
        self._read_split = self._noting_schemas(self._read_split)

    def _noting_schemas(
        self, read_split: Callable[..., Iterable[pa.RecordBatch]]
    ) -> Callable[..., Iterator[pa.RecordBatch]]:
        """`read_split` handing each batch's schema to the preparer before the batch's rows reach it
        (both on the preparation thread), so it knows which columns hold JSON text."""

        def read(*args: Any, **kwargs: Any) -> Iterator[pa.RecordBatch]:
            for batch in read_split(*args, **kwargs):
                self.preparer.note_schema(batch.schema)  # type: ignore[attr-defined]
                yield batch

        return read

    def _admit(self, row: PreparedRow, assembly: SplitAssembly, inflight: Inflight) -> None:
        assert isinstance(row, ScoreRow)  # the score preparer makes every row of a score job
        assembly.add_row(row)
        if row.error is not None:
            for j in range(row.n):
                assembly.put(row.pos, j, score_error_record(row, j, row.error.code, row.error.message))
            return
        key = f"{row.split_index}/{row.pos}"
        if row.rolling:
            self._windows[key] = [None] * len(row.spans)
            for k in range(len(row.spans)):
                if not self._add(f"{key}/w{k}", row, k, assembly, inflight):
                    return
            return
        ids = [f"{key}/{j}" for j in range(len(row.spans))]
        if self._add(ids[0], row, 0, assembly, inflight) and len(ids) > 1:
            self._followers[ids[0]] = [(rid, row, j) for j, rid in enumerate(ids) if j > 0]

    def _add(self, rid: str, row: ScoreRow, k: int, assembly: SplitAssembly, inflight: Inflight) -> bool:
        """Queue span k of the row; on a refusal file the error record (the whole document's, for a
        rolling row, whose other windows are then dropped) and return False."""
        try:
            add_span(self.engine, rid, row.spans[k])
        except ValueError as exc:
            if row.rolling:
                self._drop_document(row, f"{row.split_index}/{row.pos}", inflight)
                assembly.put(row.pos, 0, score_error_record(row, 0, INVALID_REQUEST, str(exc)))
            else:
                assembly.put(row.pos, k, score_error_record(row, k, INVALID_REQUEST, str(exc)))
            return False
        inflight[rid] = (row, k)
        return True

    def _drop_document(self, row: ScoreRow, key: str, inflight: Inflight) -> None:
        self._windows.pop(key, None)
        for k in range(len(row.spans)):
            rid = f"{key}/w{k}"
            if inflight.pop(rid, None) is not None:
                self.engine.abort(rid)

    def _finish(self, out: Any, inflight: Inflight, open_splits: dict[int, SplitAssembly]) -> int:
        entry = inflight.pop(out.request_id, None)
        if entry is None:  # a window of a document already failed
            return 0
        row, k = entry
        assert isinstance(row, ScoreRow)
        assembly = open_splits[row.split_index]
        for rid, follower_row, j in self._followers.pop(out.request_id, []):
            self._add(rid, follower_row, j, assembly, inflight)
        comp = out.outputs[0]
        if comp.finish_reason == "error":
            self._fail(row, k, comp.error or "the engine failed this request", assembly, inflight)
            return 0
        score = span_score(out, row.spans[k])
        if not row.rolling:
            assembly.put(row.pos, k, pair_record(row, k, score))
            return 0
        key = f"{row.split_index}/{row.pos}"
        windows = self._windows[key]
        windows[k] = score
        if all(w is not None for w in windows):
            del self._windows[key]
            assembly.put(row.pos, 0, document_record(row, [w for w in windows if w is not None]))
        return 0

    def _fail(self, row: ScoreRow, k: int, message: str, assembly: SplitAssembly, inflight: Inflight) -> None:
        if row.rolling:
            self._drop_document(row, f"{row.split_index}/{row.pos}", inflight)
            k = 0
        assembly.put(row.pos, k, score_error_record(row, k, ENGINE_ERROR, message))
