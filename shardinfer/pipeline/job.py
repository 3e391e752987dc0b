"""A job's lifecycle around the workers: open or resume the output location, run, finalize.

    open_job      resolve sampling, fingerprint the job, read `_job.json` / `_SUCCESS`:
                  new job -> plan splits; same fingerprint -> reuse the stored plan;
                  other fingerprint -> FingerprintMismatch naming what changed (exit 78).
    write_plan    store `_job.json` once (only for a new job).
    run_worker    one engine, the splits in `order`, exactly-once commits (see runner.py).
    finalize_job  totals from the commit markers, the error-fraction check, `_SUCCESS`.

Workers of one job coordinate only through the output store: a split is done when its marker
exists, whoever wrote it.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from shardinfer.engine.sampling_params import SamplingParams, default_sampling_params
from shardinfer.errors import (
    ConfigError,
    CorruptOutputError,
    FingerprintMismatch,
    InputColumnError,
    InputMissing,
    Retryable,
    TooManyBadRows,
)
from shardinfer.pipeline.assembly import OutputOptions
from shardinfer.pipeline.config import JobConfig
from shardinfer.pipeline.fingerprint import compute_fingerprint, diff_fingerprint_parts
from shardinfer.pipeline.rows import RowPreparer
from shardinfer.pipeline.runner import SplitWorker, WorkerResult, WorkerSettings
from shardinfer.pipeline.seams import Engine
from shardinfer.pipeline.timeline import open_timeline
from shardinfer.splits import ROW_INDEX_COLUMN, Split, plan_from_records
from shardinfer.testing.faults import crash_point

if TYPE_CHECKING:
    from shardinfer.readers.spec import InputSpec
    from shardinfer.writers.output_store import OutputStore

JOB_FORMAT_VERSION = 1


@dataclass
class OpenedJob:
    config: JobConfig
    input_spec: InputSpec
    sampling: SamplingParams
    fingerprint: dict[str, Any]
    store_: OutputStore | None  # None until the location exists (reading must not create it)
    splits: list[Split]  # in plan order
    state: str  # "new" | "resume" | "done"
    success: dict[str, Any] | None = None
    committed: set[int] = field(default_factory=set)  # split indexes with a marker when opened
    # The schema of the batches the readers yield: read once per job (planning reads it anyway)
    # and handed to worker processes, which then never open an input file just to learn it.
    input_schema_: pa.Schema | None = None

    @property
    def input_schema(self) -> pa.Schema:
        if self.input_schema_ is None:
            from shardinfer.readers.splits import read_schema

            self.input_schema_ = read_schema(self.input_spec, self.splits[0].path)
        return self.input_schema_

    @property
    def store(self) -> OutputStore:
        if self.store_ is None:
            self.store_ = open_store(self.config)
        return self.store_

    @property
    def output_options(self) -> OutputOptions:
        return OutputOptions(
            top_logprobs=bool(self.sampling.logprobs),
            prompt_logprobs=self.sampling.prompt_logprobs is not None,
        )


def resolve_sampling(config: JobConfig) -> SamplingParams:
    """[sampling] over the checkpoint's generation_config.json, as the Python API resolves them."""
    try:
        return default_sampling_params(config.model.path, **config.sampling)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[sampling] is invalid: {exc}") from None


def input_spec_of(config: JobConfig) -> InputSpec:
    from shardinfer.readers.spec import InputSpec

    inp = config.input
    try:
        return InputSpec(
            path=inp.path,
            format=inp.format,
            query=inp.query or None,
            id_column=inp.id_column or None,
            prompt_column=inp.prompt_column or None,
            messages_column=inp.messages_column or None,
            storage_options=dict(inp.storage_options),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def open_store(config: JobConfig) -> OutputStore:
    from shardinfer.writers.output_store import OutputStore

    return OutputStore(config.output.path, dict(config.output.storage_options))


def output_exists(config: JobConfig) -> bool:
    from shardinfer.storage import filesystem

    fs, root = filesystem(config.output.path, dict(config.output.storage_options))
    return bool(fs.exists(root))


def open_job(config: JobConfig, *, plan: bool = True) -> OpenedJob:
    """Decide what this run has to do; reads only (safe for --dry-run and `validate`)."""
    from shardinfer.writers.schema import OUTPUT_SCHEMA_VERSION

    sampling = resolve_sampling(config)
    fingerprint = compute_fingerprint(config, sampling.to_json_dict(), OUTPUT_SCHEMA_VERSION)
    spec = input_spec_of(config)
    store = open_store(config) if output_exists(config) else None
    existing = store.read_job() if store is not None else None
    drifted = existing is not None and existing.get("fingerprint", {}).get("hash") != fingerprint["hash"]
    # start_over only ever discards another fingerprint's output: a retry of the same command
    # (same flags) then resumes the new job instead of throwing its progress away again.
    if store is not None and existing is not None and not (drifted and config.job.start_over):
        old = existing.get("fingerprint", {})
        if drifted:
            changes = diff_fingerprint_parts(old, fingerprint)
            raise FingerprintMismatch(
                f"{config.output.path} holds a job with another fingerprint; resuming would mix two datasets. "
                f"Changed: {'; '.join(changes) or 'fingerprint format'}. Write to a new output path, restore "
                "the old settings, or pass --conf job.start_over=true to discard the old output."
            )
        stored = plan_from_records(existing["splits"])
        success = read_success_or_none(store)
        state = "done" if success is not None and success_hash(success) == fingerprint["hash"] else "resume"
        return OpenedJob(
            config, spec, sampling, fingerprint, store, stored, state, success, store.committed_indexes()
        )
    splits: list[Split] = []
    if plan:
        from shardinfer.readers.splits import plan_splits

        try:
            splits = plan_splits(spec, config.job.split_rows)
        except InputColumnError as exc:
            # A column the spec names but the input lacks is the spec's mistake (78), not bad data (65).
            raise ConfigError(str(exc)) from None
        if not splits:
            raise InputMissing(f"input.path={config.input.path!r} has no rows to process")
    job = OpenedJob(config, spec, sampling, fingerprint, store, splits, "new")
    if splits:
        check_columns(config, job.input_schema)
    return job


def read_success_or_none(store: OutputStore) -> dict[str, Any] | None:
    """`_SUCCESS`, or None when absent or unreadable: a kill while it was being written leaves a
    truncated file, and the cure is to finalize again (every split is committed), not to fail."""
    try:
        success = store.read_success()
    except CorruptOutputError:
        return None
    return dict(success) if success is not None else None


def success_hash(success: dict[str, Any]) -> str | None:
    fp = success.get("fingerprint")
    return fp.get("hash") if isinstance(fp, dict) else fp


def schema_to_text(schema: pa.Schema) -> str:
    """An Arrow schema as text for a JSON message (Arrow IPC bytes, base64): how a job hands its
    input schema to worker processes."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_from_text(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def check_columns(config: JobConfig, schema: pa.Schema) -> None:
    """Score, override and passthrough columns must exist (the readers check id/prompt/messages)."""
    import difflib

    names = [n for n in schema.names if n != ROW_INDEX_COLUMN]
    inp = config.input
    named = [(k, getattr(inp, k)) for k in ("context_column", "continuations_column", "document_column")]
    named += [(k, col) for k in ("override_columns", "passthrough_columns") for col in getattr(inp, k)]
    for key, col in named:
        if col and col not in names:
            near = difflib.get_close_matches(col, names, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(
                f"input.{key} names column {col!r}, which the input does not have{hint}; available: {names}"
            )


def write_plan(job: OpenedJob, run_id: str) -> None:
    """Store `_job.json` for a new job (after clearing another fingerprint's output on start_over)."""
    if job.state != "new":
        return
    from shardinfer.writers.job_file import make_job_record

    if job.config.job.start_over and output_exists(job.config):
        job.store.clear()
    config = job.config.to_dict()
    config["job"]["run_id"] = ""  # a run id names one attempt, not the job
    job.store.write_job(
        make_job_record(
            run_id, job.fingerprint, job.splits, {"job_format_version": JOB_FORMAT_VERSION, "config": config}
        )
    )


def output_schema_of(job: OpenedJob) -> pa.Schema:
    from shardinfer.writers.schema import output_schema

    schema = job.input_schema
    passthrough = pa.schema([schema.field(c) for c in job.config.input.passthrough_columns])
    opts = job.output_options
    try:
        if job.config.job.task == "score":
            from shardinfer.writers.schema import score_output_schema

            return score_output_schema(passthrough)
        return output_schema(passthrough, opts.top_logprobs, opts.prompt_logprobs)
    except ValueError as exc:
        raise ConfigError(f"input.passthrough_columns: {exc}") from None


def parquet_metadata(job: OpenedJob, run_id: str) -> dict[str, str]:
    """Model, sampling and engine metadata stored once per file, not per row."""
    cfg = job.config
    return {
        "shardinfer.fingerprint": job.fingerprint["hash"],
        "shardinfer.run_id": run_id,
        "shardinfer.model": json.dumps(
            {"path": cfg.model.path, "dtype": cfg.model.dtype, "device": cfg.model.device}
        ),
        "shardinfer.sampling": json.dumps(job.sampling.to_json_dict(), sort_keys=True),
        "shardinfer.engine": json.dumps(cfg.engine, sort_keys=True, default=str),
        "shardinfer.job_seed": str(cfg.job.seed),
    }


def build_engine(config: JobConfig) -> Engine:
    from shardinfer.engine.llm_engine import LLMEngine

    try:
        return LLMEngine(
            config.model.path, device=config.model.device, dtype=config.model.dtype, **config.engine
        )
    except TypeError as exc:
        raise ConfigError(f"[engine] has an argument the engine does not take: {exc}") from None


def splits_in_flight(config: JobConfig, samples_per_row: int) -> int:
    """job.max_splits_in_flight, or for 0 enough splits to keep max_inflight_requests requests
    admitted: a split stays open until its slowest row is done, so the engine's queue is refilled
    only from the splits opened after it. The window stays bounded (about max_inflight_requests
    plus two splits' requests); it just no longer drains while one long row finishes."""
    job = config.job
    if job.max_splits_in_flight:
        return job.max_splits_in_flight
    per_split = max(1, job.split_rows * max(1, samples_per_row))
    return max(2, -(-job.max_inflight_requests // per_split) + 1)


def run_worker(
    job: OpenedJob,
    order: Iterable[Split],
    stop: threading.Event,
    run_id: str,
    emit: Callable[[dict[str, Any]], None] = lambda e: None,
    engine: Engine | None = None,
) -> WorkerResult:
    """Process the uncommitted splits of `order` (a list, or splits pulled from the driver's
    scheduler) with one engine; raises Interrupted on stop."""
    cfg = job.config
    timeline = open_timeline(cfg.job.timeline_path)
    if timeline is not None:
        timeline.mark("engine_build_start")
    engine = engine if engine is not None else build_engine(cfg)
    if timeline is not None:
        timeline.mark("engine_ready", phases=dict(getattr(engine, "startup_phases", {}) or {}))
    preparer: Any
    worker_class: type[SplitWorker] = SplitWorker
    if cfg.job.task == "score":
        from shardinfer.pipeline.score_rows import ScorePreparer
        from shardinfer.pipeline.score_worker import ScoreWorker

        try:
            preparer = ScorePreparer(
                engine.tokenizer, engine.max_model_len, cfg.input, cfg.job.rolling_window_tokens
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        worker_class = ScoreWorker
    else:
        preparer = RowPreparer(engine.tokenizer, engine.max_model_len, job.sampling, cfg.input, cfg.job.seed)
    settings = WorkerSettings(
        max_inflight_requests=cfg.job.max_inflight_requests,
        max_splits_in_flight=splits_in_flight(cfg, job.sampling.n),
        batch_rows=cfg.job.batch_rows,
        run_id=run_id,
    )
    worker = worker_class(
        engine=engine,
        preparer=preparer,
        store=job.store,
        input_spec=job.input_spec,
        schema=output_schema_of(job),
        metadata=parquet_metadata(job, run_id),
        options=job.output_options,
        settings=settings,
        stop=stop,
        emit=emit,
        timeline=timeline,
    )
    return worker.run(order)


def committed_totals(store: OutputStore, committed: dict[int, dict[str, Any]]) -> dict[str, int]:
    """Sum the per-split stats (assembly.split_stats) each committed part carries in its footer.

    Commit markers record rows, bytes and hash only, so the counts come from the parts' Parquet
    key-value metadata: one footer read per split, no data pages.
    """
    totals = {
        "records": 0,
        "rows_ok": 0,
        "rows_error": 0,
        "rows_cut_by_max_tokens": 0,  # absent from parts written before it was counted: 0
        "prompt_tokens": 0,
        "completion_tokens": 0,
    }
    for marker in committed.values():
        stats = split_stats_of(store, marker)
        for key in totals:
            totals[key] += int(stats.get(key, 0))
    return totals


def split_stats_of(store: OutputStore, marker: dict[str, Any]) -> dict[str, Any]:
    raw = store.read_part_metadata(marker["part"]).get(b"shardinfer.split_stats")
    return dict(json.loads(raw)) if raw else {"records": marker.get("rows", 0)}


def finalize_job(job: OpenedJob, run_id: str, run_summary: dict[str, Any]) -> dict[str, Any]:
    """Check completeness and the error budget, then write `_SUCCESS`; returns the summary."""
    committed = job.store.committed()
    missing = [s.index for s in job.splits if s.index not in committed]
    if missing:
        raise Retryable(
            f"{len(missing)} split(s) still uncommitted (first: {missing[:5]}); rerun to finish them"
        )
    totals = committed_totals(job.store, committed)
    summary = {
        "run_id": run_id,
        "fingerprint": job.fingerprint["hash"],
        "splits": len(job.splits),
        **totals,
        **run_summary,
    }
    fraction = totals["rows_error"] / totals["records"] if totals["records"] else 0.0
    summary["error_fraction"] = fraction
    if fraction > job.config.job.max_error_fraction:
        raise TooManyBadRows(
            f"{totals['rows_error']} of {totals['records']} output records are errors ({fraction:.1%}), above "
            f"job.max_error_fraction={job.config.job.max_error_fraction}; see the error_code/error_message "
            "columns, fix the input, or raise job.max_error_fraction"
        )
    crash_point("before_success")
    return dict(job.store.finalize(summary))
