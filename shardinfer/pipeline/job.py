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
import contextlib
import fnmatch
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from shardinfer.engine import release
from shardinfer.engine.prompt_checks import LENGTH_FIX
from shardinfer.engine.sampling_params import SamplingParams, default_sampling_params
from shardinfer.errors import (
    INVALID_ROW,
    ConfigError,
    CorruptOutputError,
    FingerprintMismatch,
    InputChanged,
    InputColumnError,
    ModelLoadError,
    Retryable,
    RowError,
    TooManyBadRows,
)
from shardinfer.pipeline.assembly import OutputOptions
from shardinfer.pipeline.config import JobConfig
from shardinfer.pipeline.error_digest import error_digest
from shardinfer.pipeline.fingerprint import (
    compute_fingerprint,
    diff_closest_form,
    span_rule_of,
)
from shardinfer.pipeline.input_listing import diff_listings, snapshot, with_content_digests
from shardinfer.pipeline.output_ids import (
    RepeatedIds,
    check_unique_ids,
    committed_row_ids,
    count_repeated_ids,
)
from shardinfer.pipeline.rows import RowPreparer, is_conversation_text, parse_messages, short_cell
from shardinfer.pipeline.runner import SplitWorker, WorkerResult, WorkerSettings
from shardinfer.pipeline.seams import Engine
from shardinfer.pipeline.timeline import Timeline, open_timeline
from shardinfer.redaction import location_identity, redact_config, with_credentials_of
from shardinfer.splits import ROW_ERROR_COLUMN, ROW_INDEX_COLUMN, Split, plan_from_records
from shardinfer.testing.faults import crash_point
from shardinfer.testing.replay_drafter import install_from_env

if TYPE_CHECKING:
    from shardinfer.pipeline.incremental import Growth
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
    generation: str = ""  # the job generation (see writers.markers); set once planned or read
    input_listing: list[dict[str, Any]] = field(default_factory=list)  # for a new job's _job.json
    notes: list[str] = field(default_factory=list)  # what the run should report (a stale _SUCCESS)
    growth: Growth | None = None  # job.incremental: what this run added to the plan
    extended_record: dict[str, Any] | None = None  # job.incremental: the _job.json to write
    # Committed splits whose input file was rewritten since (job.incremental): never recomputed.
    superseded: set[int] = field(default_factory=set)
    # job.start_over over another job's output: what that job was ("another fingerprint (...)"),
    # whose parts, markers and _SUCCESS the plan's write discards. Empty otherwise.
    discards: str = ""
    # A resumed job keeps the plan in its _job.json: a job.split_rows that differs from the one it
    # was planned with does not apply, which the run and a dry run say. Empty otherwise.
    kept_plan: str = ""
    # A finished job's part files that no marker names (see remove_strays). Empty otherwise.
    strays: list[str] = field(default_factory=list)

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
            used_columns=_used_columns(config),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _used_columns(config: JobConfig) -> tuple[str, ...]:
    """The columns a job reads besides the id, prompt and messages columns: the reader reads a cell
    it cannot decode in any other column as null, without making its row an error record (a
    column missing here would lose values silently: list every column-naming key of `[input]`)."""
    inp = config.input
    named = (inp.context_column, inp.continuations_column, inp.document_column)
    return tuple(c for c in (*named, *inp.override_columns, *inp.passthrough_columns) if c)


def open_store(config: JobConfig) -> OutputStore:
    from shardinfer.writers.output_store import OutputStore

    return OutputStore(config.output.path, dict(config.output.storage_options))


def output_exists(config: JobConfig) -> bool:
    from shardinfer.storage import filesystem

    fs, root = filesystem(config.output.path, dict(config.output.storage_options))
    return bool(fs.exists(root))


def open_job(config: JobConfig, *, plan: bool = True) -> OpenedJob:
    """Decide what this run has to do; reads only (safe for --dry-run and `validate`).

    With `plan` (the driver, `validate`, `--dry-run`) the input listing is compared with the one
    the job was planned on; workers (`plan=False`) trust the driver's check.
    """
    from shardinfer.writers.schema import OUTPUT_SCHEMA_VERSION

    sampling = resolve_sampling(config)
    fingerprint = compute_fingerprint(config, sampling.to_json_dict(), OUTPUT_SCHEMA_VERSION)
    spec = input_spec_of(config)
    check_output_location(config)
    store = open_store(config) if output_exists(config) else None
    existing = store.read_job() if store is not None else None
    if store is not None and existing is None and not config.job.start_over and store.has_protocol_files():
        raise _damaged(config, "holds commit markers or part files but no _job.json")
    if store is not None and existing is None:
        check_no_foreign_files(config, store)
    if existing is not None and not existing.get("generation") and not config.job.start_over:
        raise _damaged(config, "has a _job.json without a job generation (written by an older version)")
    drifted = existing is not None and existing.get("fingerprint", {}).get("hash") != fingerprint["hash"]
    forms = [fingerprint]  # this spec's fingerprint in every form a version of ours stored
    if drifted and existing is not None:
        # A job planned by an older version stored its fingerprint in an older form: the same spec
        # still resumes it, under the fingerprint it was planned with.
        for legacy in _older_fingerprints(config, sampling):
            if legacy["hash"] == existing.get("fingerprint", {}).get("hash"):
                fingerprint, drifted = legacy, False
                break
            forms.append(legacy)
    input_diff = None
    current: list[dict[str, Any]] = []
    if existing is not None and not drifted and plan:
        current = listing_of(config, spec)
        input_diff = diff_listings(existing.get("input_listing", []), current)
    # start_over only ever discards another fingerprint's output (or another input's): a retry of
    # the same command (same flags) then resumes the new job instead of throwing it away again.
    discard = config.job.start_over and (drifted or bool(input_diff))
    discarded = ""
    if discard and existing is not None:
        discarded = (
            f"another fingerprint (changed: {_changes(existing.get('fingerprint', {}), *forms)})"
            if drifted
            else f"another input listing ({input_diff.describe() if input_diff else ''})"
        )
    if store is not None and existing is not None and existing.get("generation") and not discard:
        old = existing.get("fingerprint", {})
        if drifted:
            raise FingerprintMismatch(
                f"{config.output.path} holds a job with another fingerprint; resuming would mix two datasets. "
                f"Changed: {_changes(old, *forms)}. Write to a new output path, restore "
                "the old settings, or pass --conf job.start_over=true to discard the old output."
            )
        if input_diff and not config.job.incremental:
            raise InputChanged(
                f"the input of the job at {config.output.path} changed since it was planned "
                f"({input_diff.describe()}); its rows would no longer match the committed ones. Restore "
                "the input, write to a new output path, pass --conf job.start_over=true to redo the "
                "job, or --conf job.incremental=true to plan added files (and the rows with new ids of "
                "rewritten ones) as new splits"
            )
        stored = usable_plan(plan_from_records(existing["splits"]), config)
        store.use_generation(str(existing["generation"]))
        job = OpenedJob(
            config, spec, sampling, fingerprint, store, stored, "resume", None, store.committed_indexes()
        )
        job.generation = str(existing["generation"])
        job.superseded = {int(i) for i in existing.get("superseded_splits", [])}
        if input_diff:
            from shardinfer.pipeline.incremental import extend_plan

            job.growth = extend_plan(job, existing, input_diff, current)  # new splits of this split_rows
            return job
        success = read_success_or_none(store)
        if success is not None and success_hash(success) == fingerprint["hash"]:
            # How deep a resubmit looks before trusting `_SUCCESS`: one listing gives every part's
            # existence and size (a few requests whatever the number of parts: an object store
            # lists 1000 keys per request), which finds a deleted or truncated part. Opening each
            # part, for its footer or its hash (writers.verify), would cost a request per part, or
            # a read of the whole output, on every resubmit of a finished job; so a part replaced
            # by another of the very same size is not caught here (finalize's hash check is what
            # guards a run that writes).
            markers = store.committed()
            problems = store.success_problems(success, markers)
            sizes = {} if problems else store.listing_sizes()
            damaged = {} if problems else store.listed_damage(markers, sizes)
            if problems:
                job.notes.append("_SUCCESS does not match the commit markers: " + "; ".join(problems))
            elif damaged:
                # Not done: the run's repair step (repair_damaged) verifies every part, deletes
                # `_SUCCESS`, computes the damaged splits again and commits them under their next
                # marker number; finalize then writes a `_SUCCESS` that lists the new parts.
                job.notes.append(
                    "_SUCCESS cannot be trusted: committed part(s) were damaged after it was written: "
                    + "; ".join(f"split {i}: {why}" for i, why in sorted(damaged.items()))
                )
            else:
                job.state, job.success = "done", success
                job.strays = store.stray_parts(markers, sizes)
        if job.state != "done":  # a finished job runs nothing: no plan to speak of
            job.kept_plan = _kept_plan(existing, config)
        return job
    splits: list[Split] = []
    listing: list[dict[str, Any]] = []
    if plan:
        from shardinfer.readers.splits import plan_splits

        listing = listing_of(config, spec)
        try:
            splits = plan_splits(spec, config.job.split_rows)
        except InputColumnError as exc:
            # A column the spec names but the input lacks is the spec's mistake (78), not bad data (65).
            raise ConfigError(str(exc)) from exc
        if not splits:
            # Files were found (no files at all is InputMissingError, 66), but none holds a row:
            # rerunning cannot help, the spec points at the wrong input.
            raise ConfigError(
                f"input.path={config.input.path!r} names {len(listing)} file(s) but not one row to process "
                "(empty files); point input.path at the input that holds the rows"
            )
    job = OpenedJob(config, spec, sampling, fingerprint, store, splits, "new")
    job.input_listing = listing
    job.discards = discarded
    if splits:
        check_columns(config, job.input_schema)
        check_messages_sample(config, spec, splits[0])
        check_prompt_sample(config, spec, splits[0])
    return job


def _older_fingerprints(config: JobConfig, sampling: SamplingParams) -> Iterator[dict[str, Any]]:
    """The job's fingerprint in the forms older versions stored: the input path as written (before
    local paths were made absolute), for a model on object storage weights by size alone (before
    their listed checksums were read) and, for a score job, no span rule (before spans could hold
    max_model_len + 1 tokens: such a job keeps its shorter spans, run_worker). Computed only when
    the stored one differs."""
    from shardinfer.pipeline.scoring import SAMPLED_TOKEN_RULE, SPAN_RULE
    from shardinfer.writers.schema import OUTPUT_SCHEMA_VERSION

    remote_model = "://" in config.model.path and not config.model.path.startswith("file://")
    rules = (SPAN_RULE, SAMPLED_TOKEN_RULE) if config.job.task == "score" else (SPAN_RULE,)
    for span_rule in rules:
        for absolute_input, remote_checksums in ((True, True), (False, True), (True, False), (False, False)):
            current = absolute_input and remote_checksums and span_rule == SPAN_RULE
            if not current and (remote_checksums or remote_model):
                yield compute_fingerprint(
                    config,
                    sampling.to_json_dict(),
                    OUTPUT_SCHEMA_VERSION,
                    absolute_input=absolute_input,
                    remote_checksums=remote_checksums,
                    span_rule=span_rule,
                )


def remove_strays(job: OpenedJob) -> list[str]:
    """Delete the part files of a finished job that no marker names; returns their names.

    `finalize` deletes such parts, but a joined run killed after writing a part and before its
    marker, once the other run had finalized, leaves one behind: a dataset reader of the folder
    (which lists files, not markers) would read its rows twice. Only a submit calls this (`open_job`
    itself must only read). Every writer of parts into a finished job (a repair, job.incremental)
    deletes `_SUCCESS` first, and a finalize writes another one: the very `_SUCCESS` read before the
    listing, still there after it, means no listed part can be such a writer's."""
    if job.state != "done" or not job.strays or read_success_or_none(job.store) != job.success:
        return []
    removed, job.strays = job.strays, []
    job.store.delete_parts(removed)
    return removed


def check_no_foreign_files(config: JobConfig, store: OutputStore) -> None:
    """A new job's location must hold nothing but what this protocol writes: readers of the output
    folder (pyarrow.dataset, DuckDB, Spark) read every visible file in it, so another program's
    data would mix in foreign rows, and a README or a spec would make them fail."""
    own = _timeline_name_in_output(config)
    foreign = [n for n in store.foreign_entries() if n != own]
    if foreign:
        shown = ", ".join(repr(n) for n in foreign[:3]) + (
            f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        )
        raise ConfigError(
            f"output.path={config.output.path!r} already holds files that are not this job's output ({shown}): "
            "readers of the output folder would read them as rows; choose an empty output path, or move them away"
        )


def _timeline_name_in_output(config: JobConfig) -> str:
    """The file name of job.timeline_path when it lies directly in a local output folder (a run
    that stopped before writing its plan may have left it there: it is this job's own), else ""."""
    import os

    timeline, output = config.job.timeline_path, config.output.path
    if not timeline or "://" in output:
        return ""
    inside = os.path.dirname(os.path.abspath(timeline)) == os.path.abspath(output)
    return os.path.basename(timeline) if inside else ""


def _kept_plan(existing: dict[str, Any], config: JobConfig) -> str:
    """Why this run's job.split_rows does not apply, when it differs from the planned job's."""
    planned = (existing.get("config") or {}).get("job", {}).get("split_rows")
    if not isinstance(planned, int) or planned == config.job.split_rows:
        return ""
    return (
        f"job.split_rows={config.job.split_rows} does not apply: the job at {config.output.path} was planned "
        f"with {planned} rows per split, and a resumed job keeps its plan (the rows are the same either way); "
        f"write to a new output path to plan with {config.job.split_rows}"
    )


def _changes(old: dict[str, Any], *forms: dict[str, Any]) -> str:
    """The fingerprint components that differ, as `name: old -> new` joined for a message, against
    the closest of the new fingerprint's forms (today's and `_older_fingerprints`)."""
    return "; ".join(diff_closest_form(old, list(forms))) or "fingerprint format"


def _damaged(config: JobConfig, what: str) -> Exception:
    return CorruptOutputError(
        f"output location {config.output.path} {what}: it is damaged (or another program's), and "
        "adopting its markers could bless rows of another job. Write to a new output path, or pass "
        "--conf job.start_over=true to clear it and start the job again"
    )


def listing_of(config: JobConfig, spec: Any) -> list[dict[str, Any]]:
    from shardinfer.readers.listing import list_input_files

    return snapshot(list_input_files(spec), dict(config.input.storage_options))


def check_output_location(config: JobConfig) -> None:
    """The output must be a directory or prefix (not a file), in a bucket that exists, and not
    inside the input (the next run would read it back as input)."""
    from shardinfer.storage import filesystem

    out_fs, out_root = filesystem(config.output.path, dict(config.output.storage_options))
    if out_fs.isfile(out_root):
        raise ConfigError(
            f"output.path={config.output.path!r} is a file, not a directory or prefix; write the output "
            "to a new location"
        )
    protocols = {out_fs.protocol} if isinstance(out_fs.protocol, str) else set(out_fs.protocol)
    if protocols & {"s3", "s3a"}:
        check_bucket(config, out_fs, out_root.split("/", 1)[0])
    in_fs, in_path = filesystem(config.input.path, dict(config.input.storage_options))
    if type(out_fs) is not type(in_fs):
        return
    out = out_root.rstrip("/")
    sample_part = f"{out}/part-00000-x.parquet"  # what the output's files look like to a listing
    if any(ch in in_path for ch in "*?["):
        inside = fnmatch.fnmatchcase(sample_part, in_path)
    else:
        base = in_path.rstrip("/")
        inside = (out == base or out.startswith(base + "/")) and not in_fs.isfile(in_path)
    if inside:
        raise ConfigError(
            f"output.path={config.output.path!r} lies inside input.path={config.input.path!r}: the next run "
            "would read the output back as input; write the output somewhere outside the input"
        )


def check_bucket(config: JobConfig, fs: Any, bucket: str) -> None:
    """The output's bucket must exist and let these credentials list it.

    One listing request of at most one key, retried like every storage call: the store's answer
    tells a missing bucket (FileNotFoundError) and refused credentials (PermissionError), both for a
    person to fix (78), from an outage or throttling, which only ends as StorageError (75, retry
    later) once the retries are spent. An `exists` probe would answer False for all of them."""
    from shardinfer.storage import RetryPolicy, with_retries

    try:
        with_retries(
            RetryPolicy(),
            f"list bucket {bucket!r}",
            lambda: fs.call_s3("list_objects_v2", Bucket=bucket, MaxKeys=1),
        )
    except FileNotFoundError:
        raise ConfigError(
            f"output.path={config.output.path!r}: bucket {bucket!r} does not exist (or these credentials "
            "cannot see it); create the bucket or fix the path, endpoint or credentials"
        ) from None
    except PermissionError:
        raise ConfigError(
            f"output.path={config.output.path!r}: the object store refused these credentials access "
            f"to bucket {bucket!r}; check output.storage_options (or the environment's credentials), "
            "their permissions on the bucket, and the endpoint"
        ) from None


def stored_plan(splits: list[Split]) -> list[Split]:
    """The split plan as `_job.json` stores it: each path in its identity form, without
    credentials (a rotated password or a presigned URL signed again names the same file)."""
    import dataclasses

    return [dataclasses.replace(s, path=location_identity(s.path)) for s in splits]


def usable_plan(splits: list[Split], config: JobConfig) -> list[Split]:
    """A stored split plan with the credentials of the configured `input.path` put back, so the
    readers can open its files (they live in memory only, never in `_job.json`)."""
    import dataclasses

    return [dataclasses.replace(s, path=with_credentials_of(s.path, config.input.path)) for s in splits]


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
    check_prompt_types(config, schema)


def check_prompt_types(config: JobConfig, schema: pa.Schema) -> None:
    """A prompt column must hold text, a messages column lists of messages (or their JSON text):
    a column of another type would make every row an error record, so it is the spec's mistake."""
    inp = config.input
    for key, column, kinds in (
        ("prompt_column", inp.prompt_column, "strings"),
        ("messages_column", inp.messages_column, "lists of {role, content} messages, or their JSON text"),
    ):
        if not column or column not in schema.names:
            continue
        kind = schema.field(column).type
        text = pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)
        listed = key == "messages_column" and (pa.types.is_list(kind) or pa.types.is_large_list(kind))
        if not (text or listed):
            raise ConfigError(
                f"input.{key}={column!r} is a column of {kind}; it must hold {kinds}: "
                + _column_type_fix(key, column, kind)
            )


# How much of the input the messages and prompt checks read (one column or the other, never both):
# the first rows of the first split, of which a few non-null values are parsed. Enough to tell a
# column of plain text from one of messages; a few bad rows among good ones must not refuse the job
# (they become error records, as any bad row does).
_SAMPLE_ROWS = 64
_SAMPLE_VALUES = 8
_NOT_JSON = "text that is not JSON"  # the reason that makes the error suggest input.prompt_column


def check_messages_sample(config: JobConfig, spec: InputSpec, first: Split) -> None:
    """A messages column whose first values are none of them chat messages (plain prompt text, most
    often) would make every row an error record once the model is loaded: refuse the spec instead,
    naming a value. Reads the first rows of the first split only, through the query if there is one."""
    column = config.input.messages_column
    if not column:
        return
    values = _first_values(spec, first, column)
    if not values or any(_could_be_messages(v, column) for v in values):
        # Only nulls to judge by, or one value that is messages: the column holds them, and the
        # values that are not are those rows' problem (error records, as for any bad row).
        return
    value = values[0]
    reason = _not_messages_reason(value, column)
    fix = (
        f"for plain prompt text, set input.prompt_column={column!r} in place of input.messages_column; "
        if reason == _NOT_JSON
        else ""
    )
    raise ConfigError(
        f"input.messages_column={column!r} holds no chat messages: none of the first {len(values)} value(s) "
        f"of {first.path} is a list of {{role, content}} objects or its JSON text (the first: "
        f"{short_cell(value)}, {reason}); {fix}for chat data, write each row's "
        """messages as a JSON list, e.g. '[{"role": "user", "content": "What is 2+2?"}]'"""
    )


def check_prompt_sample(config: JobConfig, spec: InputSpec, first: Split) -> None:
    """A prompt column whose first values are every one a chat conversation as JSON text (chat data
    named as input.prompt_column) would send each row's raw JSON to the model, without the chat
    template: every record "ok", every text worthless. Refuse the spec instead, naming a value.
    Only when all of them are: JSON among plain prompts is those prompts' own text."""
    column = config.input.prompt_column
    if not column:
        return
    values = _first_values(spec, first, column)
    if not values or not all(is_conversation_text(v) for v in values):
        return
    # The way to send such text on purpose: a prompt that is more than the bare conversation (the
    # check reads the values after the query, so the framed text passes it).
    name = sql_name(column)
    query = f"SELECT * REPLACE ('Chat as JSON: ' || {name} AS {name}) FROM input"
    raise ConfigError(
        f"input.prompt_column={column!r} holds chat conversations: each of the first {len(values)} value(s) "
        f"of {first.path} is the JSON text of a list of {{role, content}} messages (the first: "
        f"{short_cell(values[0])}), and a prompt column's text goes to the model as written, without the "
        f"chat template; set input.messages_column={column!r} in place of input.prompt_column to render "
        "them with the model's chat template; to send the JSON text itself, put words of your own around it "
        f"in input.query, e.g. input.query = {json.dumps(query, ensure_ascii=False)}"
    )


def _could_be_messages(value: Any, column: str) -> bool:
    """Whether a cell is chat messages, or close enough that its failure is the row's own (an
    empty list; a value nested too deeply to judge)."""
    try:
        parse_messages(value, column)
    except RowError as err:
        return err.error_code != INVALID_ROW
    except RecursionError:
        return True
    return True


def _not_messages_reason(value: Any, column: str) -> str:
    """Why a cell is not messages, in a few words: text that is no JSON said plainly, else the
    row error's own reason."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return _NOT_JSON
    try:
        parse_messages(value, column)
    except RowError as err:
        return err.message.removeprefix(f"messages column {column!r}: ")
    return "not messages"


def _first_values(spec: InputSpec, first: Split, column: str) -> list[Any]:
    """Up to _SAMPLE_VALUES non-null values of `column` among the first _SAMPLE_ROWS rows of the split
    (rows the reader could not decode are left out: they are error records whatever they hold)."""
    from shardinfer.readers.splits import read_split

    head = replace(first, row_end=min(first.row_end, first.row_start + _SAMPLE_ROWS))
    values: list[Any] = []
    for batch in read_split(head, spec, batch_rows=_SAMPLE_ROWS):
        cells = batch.column(column).to_pylist()  # that column only: the row's others are not judged
        unreadable = (
            batch.column(ROW_ERROR_COLUMN).to_pylist() if ROW_ERROR_COLUMN in batch.schema.names else []
        )
        for i, value in enumerate(cells):
            if value is None or (unreadable and unreadable[i] is not None):
                continue
            values.append(value)
            if len(values) == _SAMPLE_VALUES:
                return values
    return values


def _column_type_fix(key: str, column: str, kind: pa.DataType) -> str:
    """What to do about a prompt or messages column of the wrong type. Bytes are usually text that
    a writer stored untyped (Spark without spark.sql.parquet.binaryAsString): a query decodes it.
    Lists under a prompt column are most often chat messages, which messages_column renders."""
    if key == "prompt_column" and (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        return (
            f"if it holds chat messages ({{role, content}} lists), set input.messages_column={column!r} in place "
            "of input.prompt_column; else point input.prompt_column at a text column"
        )
    if not (
        pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind)
    ):
        return f"point input.{key} at such a column"
    plain = column.isidentifier() and column.isascii()
    name = sql_name(column)
    query = f"SELECT * REPLACE (decode({name}) AS {name}) FROM input"
    # As a TOML line: a quoted SQL name holds double quotes, which a literal (single-quoted) string keeps.
    setting = f'"{query}"' if plain else f"'{query}'"
    return f"if it holds UTF-8 text, decode it with input.query = {setting}, or point input.{key} at a text column"


def sql_name(column: str) -> str:
    """A column name as DuckDB SQL reads it: as written when it is a plain name, else quoted."""
    if column.isidentifier() and column.isascii():
        return column
    return '"' + column.replace('"', '""') + '"'


def write_plan(job: OpenedJob, run_id: str) -> None:
    """Store `_job.json` for a new job. A start-over writes the new generation over the old job
    file first, which fences off the old generation's workers, and only then clears the rest.
    Two submits planning at once: the first `_job.json` wins and a loser of the same fingerprint
    joins it (its plan and generation); another fingerprint is refused."""
    if job.extended_record is not None:
        # `_SUCCESS` first: from here until finalize the output is not complete.
        job.store.delete_success()
        job.store.replace_job(job.extended_record)
        return
    if job.state != "new":
        return
    from shardinfer.writers.job_file import make_job_record

    config = redact_config(job.config.to_dict())  # credentials are never written to the output
    config["job"]["run_id"] = ""  # a run id names one attempt, not the job
    record = make_job_record(
        run_id,
        job.fingerprint,
        stored_plan(job.splits),
        {
            "job_format_version": JOB_FORMAT_VERSION,
            "config": config,
            "input_listing": with_content_digests(job.input_listing),
        },
    )
    if job.config.job.start_over and output_exists(job.config):
        job.store.replace_job(record)
        job.store.clear(keep_job=True)
        in_force = record
    else:
        in_force = job.store.create_or_read_job(record)
    if in_force.get("fingerprint", {}).get("hash") != job.fingerprint["hash"]:
        raise FingerprintMismatch(
            f"{job.config.output.path} was just planned by another job with another fingerprint "
            f"(changed: {_changes(in_force.get('fingerprint', {}), job.fingerprint)}); write to a new output path"
        )
    job.splits = usable_plan(plan_from_records(in_force["splits"]), job.config)
    job.generation = str(in_force["generation"])
    job.store.use_generation(job.generation)
    if in_force is not record:
        job.state = "resume"
        job.committed = job.store.committed_indexes()


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
            {
                "path": cfg.model.path,
                "dtype": cfg.model.dtype,
                "device": cfg.model.device,
                "quantization": cfg.model.quantization or None,
            }
        ),
        # What decides the numbers: dtype, batch invariance, weight quantisation, KV cache dtype.
        "shardinfer.numerics": json.dumps(job.fingerprint.get("engine.numerics"), sort_keys=True),
        # Which arithmetic the kernels computed this part with, and the version that ran them.
        "shardinfer.numerics_revision": str(release.NUMERICS_REVISION),
        "shardinfer.version": release.VERSION,
        "shardinfer.sampling": json.dumps(job.sampling.to_json_dict(), sort_keys=True),
        "shardinfer.engine": json.dumps(cfg.engine, sort_keys=True, default=str),
        "shardinfer.job_seed": str(cfg.job.seed),
    }


def build_engine(config: JobConfig) -> Engine:
    from shardinfer.engine.engines import make_engine
    from shardinfer.engine.llm_engine import LLMEngine

    engine_args = dict(config.engine)
    if config.model.quantization:
        engine_args["quantization"] = config.model.quantization
    try:
        engine = make_engine(
            config.model.path, device=config.model.device, dtype=config.model.dtype, **engine_args
        )
        if isinstance(engine, LLMEngine):
            install_from_env(engine)  # benchmarks only (its ENV): outputs recorded, or replayed as drafts
    except TypeError as exc:
        raise ConfigError(f"[engine] has an argument the engine does not take: {exc}") from None
    except ModelLoadError as exc:  # the folder is what to fix (a missing tokenizer.json, truncated weights)
        raise _unloadable(config, str(exc)) from None
    except ValueError as exc:
        # The engine's constructor refuses what this model cannot do with these settings (a
        # max_model_len past the model's positions, MTP on a model without an MTP layer, a
        # checkpoint it cannot read): the spec or the model must change, not the run.
        raise ConfigError(
            f"the engine cannot run model.path={config.model.path!r} with this spec: {exc} (fix [engine] or "
            "[model] in the job file, or pass --conf)"
        ) from None
    try:
        check_kv_room(engine, config)
        check_model_serves_spec(engine, config)
    except ConfigError:
        with contextlib.suppress(
            Exception
        ):  # its memory (and an expert-parallel engine's ranks) goes back now
            getattr(engine, "close", lambda: None)()
        raise
    return engine


def check_sampling_lengths(config: JobConfig, max_model_len: int) -> None:
    """[sampling] max_tokens and min_tokens as the spec writes them (a checkpoint's default may
    exceed max_model_len: generation just ends there) must fit max_model_len, and so must a score
    job's job.rolling_window_tokens (the rule ScorePreparer applies to the built engine)."""
    from shardinfer.pipeline.row_limits import over_max_model_len
    from shardinfer.pipeline.scoring import rolling_window_refusal

    for name in ("max_tokens", "min_tokens"):
        value = config.sampling.get(name)
        if isinstance(value, int) and value > max_model_len:
            raise ConfigError(f"sampling.{over_max_model_len(name, value, max_model_len)}")
    if config.job.task == "score":
        refusal = rolling_window_refusal(config.job.rolling_window_tokens, max_model_len)
        if refusal is not None:
            raise ConfigError(refusal)


def check_spec_fits_model(config: JobConfig) -> None:
    """check_sampling_lengths against the max_model_len a local model's config.json (and
    engine.max_model_len) gives, without loading the model: said by `validate`, and by `submit`
    (and `--dry-run`) before the plan is written. A model on object storage is checked once its
    engine is built (check_model_serves_spec)."""
    limit = model_length_limit(config)
    if limit is not None:
        check_sampling_lengths(config, limit)


def model_length_limit(config: JobConfig) -> int | None:
    """The max_model_len an engine would take for this spec, read from a local model's config
    without loading it (None for a model on object storage: known once it is fetched)."""
    from shardinfer.engine.models.config import ModelConfig, model_directory

    if "://" in str(config.model.path):
        return None
    asked = config.engine.get("max_model_len")
    try:
        positions = ModelConfig.from_dir(model_directory(config.model.path)).max_position_embeddings
    except (OSError, ValueError):
        return None  # the engine's build names what is wrong with the folder
    return min(int(asked), positions) if isinstance(asked, int) and asked > 0 else positions


def check_model_serves_spec(engine: Engine, config: JobConfig) -> None:
    """What the spec asks of every row that this model cannot give (no chat template for a messages
    column, a [sampling] max_tokens or a job.rolling_window_tokens past max_model_len, a [sampling]
    schema that does not compile)
    fails the job once, before any split, not as one error record per row."""
    tokenizer = engine.tokenizer
    if config.input.messages_column and getattr(tokenizer, "chat_template", "") is None:
        raise _no_chat_template(config)
    check_sampling_lengths(config, engine.max_model_len)
    schema = config.sampling.get("structured_output", config.sampling.get("so_args"))
    compiler = getattr(engine, "grammar_compiler", None)
    if schema is not None and compiler is not None:
        try:
            compiler().compile(schema)
        except ValueError as exc:
            raise ConfigError(f"sampling.structured_output: {exc}") from None


def _unloadable(config: JobConfig, why: str) -> ConfigError:
    return ConfigError(
        f"cannot load the model at model.path={config.model.path!r}: {why} (fix the model folder at "
        "model.path, or point model.path at another)"
    )


def _no_chat_template(config: JobConfig) -> ConfigError:
    return ConfigError(
        f"input.messages_column={config.input.messages_column!r} is rendered by the model's chat template, and "
        f"model.path={config.model.path!r} has no default one (no chat_template in tokenizer_config.json, no "
        "chat_template.jinja, no additional_chat_templates/default.jinja; a job renders the default template, "
        "never a named one such as tool_use): give the model a default chat template, or use "
        "input.prompt_column with plain prompts"
    )


def check_model_files(job: OpenedJob) -> None:
    """What the model folder lacks for this job, read from the fingerprint (which hashed its files):
    a tokenizer.json (every prompt is tokenized), a chat template for a messages column. Said by
    `validate`, and by `submit` before it writes the plan, not after an engine build (or a copy of
    the model from object storage, on every worker) has failed on it."""
    config = job.config
    if job.fingerprint.get("tokenizer.sha256") is None:
        raise _unloadable(
            config,
            f"no tokenizer.json in {config.model.path!r}: shardinfer reads tokenizers in the `tokenizers` JSON "
            "format (save one with tokenizer.save_pretrained)",
        )
    if config.input.messages_column and job.fingerprint.get("tokenizer.chat_template_sha256") is None:
        raise _no_chat_template(config)


def check_kv_room(engine: Engine, config: JobConfig) -> None:
    """Refuse an engine whose KV cache caps max_model_len below what the spec asks for.

    The LLM API runs such an engine with the shorter limit (and logs it). A job must not: the cut
    would depend on this machine's memory, which no fingerprint holds, so a resume on another
    machine could commit rows cut at another length under the same fingerprint."""
    asked = getattr(engine, "max_model_len_asked", None)
    if asked is None or engine.max_model_len >= asked:
        return
    source = (
        "engine.max_model_len"
        if config.engine.get("max_model_len") is not None
        else "the model's max_position_embeddings, as engine.max_model_len is unset"
    )
    raise ConfigError(
        f"the KV cache holds {engine.max_model_len} tokens of one sequence, less than max_model_len={asked} "
        f"({source}): rows would be cut at a length set by this machine's memory, not by the job. Set "
        f"engine.max_model_len={engine.max_model_len} or lower (it is part of the fingerprint), or give the KV "
        "cache more room (engine.num_kv_blocks, kv_cache_memory_bytes or gpu_memory_utilization)"
    )


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


def build_engine_marked(cfg: JobConfig, timeline: Timeline | None) -> Engine:
    """build_engine, with the build's start and end (and the engine's start-up phases) marked on
    the job's timeline when it keeps one."""
    if timeline is not None:
        timeline.mark("engine_build_start")
    engine = build_engine(cfg)
    if timeline is not None:
        timeline.mark("engine_ready", phases=dict(getattr(engine, "startup_phases", {}) or {}))
    return engine


def run_worker(
    job: OpenedJob,
    order: Iterable[Split],
    stop: threading.Event,
    run_id: str,
    emit: Callable[[dict[str, Any]], None] = lambda e: None,
    engine: Engine | None = None,
    timeline: Timeline | None = None,
) -> WorkerResult:
    """Process the uncommitted splits of `order` (a list, or splits pulled from the driver's
    scheduler) with one engine (built here unless given, with the timeline its build was marked
    on); raises Interrupted on stop."""
    cfg = job.config
    if job.generation:
        job.store.use_generation(job.generation)
    if timeline is None:
        timeline = open_timeline(cfg.job.timeline_path)
    if engine is None:
        engine = build_engine_marked(cfg, timeline)
    preparer: Any
    worker_class: type[SplitWorker] = SplitWorker
    if cfg.job.task == "score":
        from shardinfer.pipeline.score_rows import ScorePreparer
        from shardinfer.pipeline.score_worker import ScoreWorker

        try:
            preparer = ScorePreparer(
                engine.tokenizer,
                engine.max_model_len,
                cfg.input,
                cfg.job.rolling_window_tokens,
                span_rule_of(job.fingerprint),  # a job planned with shorter spans keeps them
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        worker_class = ScoreWorker
    else:
        preparer = RowPreparer(
            engine.tokenizer,
            engine.max_model_len,
            job.sampling,
            cfg.input,
            cfg.job.seed,
            getattr(engine, "length_fix", LENGTH_FIX),
        )
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


def repair_damaged(
    job: OpenedJob,
    stop: threading.Event,
    run_id: str,
    emit: Callable[[dict[str, Any]], None] = lambda e: None,
    engine: Any = None,
    on_result: Callable[[WorkerResult], None] = lambda r: None,
) -> dict[int, str]:
    """Check every committed part against its marker; compute the damaged splits again.

    A part deleted, truncated or replaced after its commit is recomputed (sampling is
    deterministic: the same bits) and committed under the split's next marker number, created
    only if absent, so concurrent repairers still have one winner. Returns split -> what was wrong;
    `on_result` gets the recomputation's worker result (its commits and engine statistics are
    this run's work, which the run's summary counts).
    """
    markers = job.store.committed()
    damaged: dict[int, str] = job.store.damaged_parts(markers)
    if not damaged:
        return {}
    lost = sorted(set(damaged) & job.superseded)
    if lost:
        raise CorruptOutputError(
            f"{job.config.output.path}: committed part(s) of split(s) {lost} are damaged "
            f"({'; '.join(damaged[i] for i in lost[:3])}), and their input file was rewritten since they "
            "were computed (job.incremental), so their rows cannot be computed again; restore the part "
            "files from a copy, or pass --conf job.start_over=true to redo the job"
        )
    emit({"event": "repair", "splits": sorted(damaged), "reasons": damaged})
    job.store.plan_repairs(damaged, markers)
    on_result(run_worker(job, [s for s in job.splits if s.index in damaged], stop, run_id, emit, engine))
    return damaged


def committed_totals(
    store: OutputStore, committed: dict[int, dict[str, Any]], revisions: Counter[str] | None = None
) -> dict[str, int]:
    """Sum the per-split stats (assembly.split_stats) each committed part carries in its footer;
    `revisions`, when given, counts the parts by the numerics revision they were written under.

    Commit markers record rows, bytes and hash only, so the counts come from the parts' Parquet
    key-value metadata: one footer read per split, no data pages, several splits' at once.
    """
    from shardinfer.writers.parts import map_parts

    totals = dict.fromkeys(SPLIT_TOTALS, 0)
    for counts, revision in map_parts(lambda marker: part_totals(store, marker), list(committed.values())):
        for key, value in counts.items():
            totals[key] += value
        if revisions is not None:
            revisions[revision] += 1
    return totals


# The counts a part's footer carries (assembly.split_stats); rows_cut_by_max_tokens and
# rows_empty_text are absent from parts written before they were counted, and count 0 there.
SPLIT_TOTALS = (
    "records",
    "rows_ok",
    "rows_error",
    "rows_cut_by_max_tokens",
    "rows_empty_text",
    "prompt_tokens",
    "completion_tokens",
)


def part_totals(store: OutputStore, marker: dict[str, Any]) -> tuple[dict[str, int], str]:
    """One committed part's counts and the numerics revision it was written under, from its footer
    (its marker's row count where the footer has none)."""
    footer = store.read_part_metadata(marker["part"])
    raw = footer.get(b"shardinfer.split_stats")
    stats = dict(json.loads(raw)) if raw else {"records": marker.get("rows", 0)}
    return {key: int(stats.get(key, 0)) for key in SPLIT_TOTALS}, part_numerics_revision(footer)


def part_numerics_revision(footer: dict[bytes, bytes]) -> str:
    """The numerics revision a part was written under (engine.release), or "unrecorded"
    for a part of a version before parts recorded it."""
    return footer.get(b"shardinfer.numerics_revision", b"unrecorded").decode()


def finalize_job(job: OpenedJob, run_id: str, run_summary: dict[str, Any]) -> dict[str, Any]:
    """Check completeness and the error budget, then write `_SUCCESS`; returns the summary."""
    committed = job.store.committed()
    missing = [s.index for s in job.splits if s.index not in committed]
    if missing:
        raise Retryable(
            f"{len(missing)} split(s) still uncommitted (first: {missing[:5]}); rerun to finish them"
        )
    revisions: Counter[str] = Counter()
    totals = committed_totals(job.store, committed, revisions)
    summary = {
        "run_id": run_id,
        "fingerprint": job.fingerprint["hash"],
        "numerics": job.fingerprint.get("engine.numerics"),
        # Parts by the revision of the kernels' arithmetic that wrote them: more than one when runs
        # of versions that compute differently each committed splits (engine.release).
        "numerics_revisions": dict(sorted(revisions.items())),
        "task": job.config.job.task,
        "splits": len(job.splits),
        **totals,
        **run_summary,
    }
    # Without an id column, ids are "file:row": unique by construction, nothing to read back.
    repeated = (
        count_repeated_ids(committed_row_ids(job.store, committed))
        if job.config.input.id_column
        else RepeatedIds(0, None)
    )
    summary["duplicate_row_ids"] = repeated.repeats
    summary["prompts_as_written"] = bool(job.config.input.prompt_column)  # no chat template: see progress.py
    check_unique_ids(repeated, job.config.job.unique_ids)
    fraction = totals["rows_error"] / totals["records"] if totals["records"] else 0.0
    summary["error_fraction"] = fraction
    if fraction > job.config.job.max_error_fraction:
        digest = error_digest(job.store, committed)
        raise TooManyBadRows(
            f"{totals['rows_error']} of {totals['records']} output records are errors ({fraction:.1%}), above "
            f"job.max_error_fraction={job.config.job.max_error_fraction}"
            + (f" ({digest})" if digest else "")
            + "; see the error_code/error_message columns, fix the input or the job spec, or raise "
            "job.max_error_fraction"
        )
    crash_point("before_success")
    return dict(job.store.finalize(summary))
