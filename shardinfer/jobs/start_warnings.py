"""What a submit warns of before it runs, and its dry run with it: a job that will run as asked,
but most likely not as meant (a location a rerun will not find again, a second run beside a live
one, ids that will not join back to the input, samples that cannot differ).

Each is a warning, never a refusal: the job may be meant so (a scheduler's retry after a run that
died, its heartbeat not stale yet, must still run), and the fix is the user's to choose.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from shardinfer.jobs.spec import RUN_DATE, ResolvedSpec, is_dashed_date
from shardinfer.pipeline.job import OpenedJob

# A warning: its message, and the fields a --log-format json record carries beside it.
StartWarning = tuple[str, dict[str, Any]]


def start_warnings(spec: ResolvedSpec, job: OpenedJob) -> list[StartWarning]:
    """Every warning of a job about to run (a finished job runs nothing: none)."""
    if job.state == "done":
        return []
    found: list[StartWarning] = [
        (run_date_in_paths(spec), {}),
        (undashed_ds(spec), {}),
        *other_live_runs(job),
        (other_numerics_revisions(job), {}),
    ]
    found += [(float_ids(job), {}), (identical_samples(spec, job), {})]
    return [(message, fields) for message, fields in found if message]


def run_date_in_paths(spec: ResolvedSpec) -> str:
    """output.path holds {ds} and no job.ds was given: the run fills it with today's date, so the
    same command rerun after midnight UTC (a retry of a run interrupted before it) writes to a new
    location instead of resuming this one."""
    config = spec.config
    if spec.sources.get("job.ds") != RUN_DATE or "{ds}" not in spec.written_paths.get("output.path", ""):
        return ""
    ds = config.job.ds
    return (
        f"output.path holds {{ds}}, and no job.ds was given: this run fills it with today's date (UTC), {ds}, "
        f"and writes to {config.output.path}; rerunning the same command after midnight UTC would start "
        f"again in a new location rather than resume this one; to resume it, rerun with --conf job.ds={ds}"
    )


def undashed_ds(spec: ResolvedSpec) -> str:
    """job.ds is a date written another way than YYYY-MM-DD (Airflow's {{ ds_nodash }}, most often)
    and fills {ds} in a path as written: the same date given with dashes, as the docs write it,
    names another location. Taken as given, so a job planned with it still resumes."""
    ds = spec.config.job.ds
    paths = [key for key in ("input.path", "output.path") if "{ds}" in spec.written_paths.get(key, "")]
    if is_dashed_date(ds) or not paths:
        return ""
    import datetime

    dashed = datetime.date.fromisoformat(ds).isoformat()
    scheduler = " (Airflow's {{ ds }}, not {{ ds_nodash }})" if ds.isdigit() else ""
    return (
        f"job.ds={ds!r} is not written YYYY-MM-DD: {{ds}} in {' and '.join(paths)} is filled with it as written, "
        f"so a run given the same date as --conf job.ds={dashed}{scheduler} would use another location; "
        "keep giving it one way"
    )


def other_live_runs(job: OpenedJob) -> list[StartWarning]:
    """Runs that `status` calls running at this job's output: this run would compute the same
    uncommitted splits beside them. The output stays right (each split is committed once), the
    cost is doubled; a run that died recently still looks alive until its heartbeat goes stale."""
    if job.state != "resume" or job.store_ is None:
        return []
    from shardinfer.jobs.run_record import STALE_AFTER_S
    from shardinfer.jobs.status import live_runs

    try:
        live = live_runs(job.store_, job.generation)
    except Exception:  # records that cannot be read must not stop the run they only warn about
        return []
    return [
        (
            f"another run, {run.get('run_id')}, is running at this output (its last heartbeat {age:.0f} s ago, "
            f"from host {run.get('host')}): this run would compute the same uncommitted splits beside it, at "
            "twice the cost (each split is still committed once); stop one of them, or go on if that run is "
            f"dead (`shardinfer status` calls it interrupted once its heartbeat is {STALE_AFTER_S:.0f} s old)",
            {"other_run_id": run.get("run_id"), "heartbeat_age_s": round(age, 1)},
        )
        for run, age in live
    ]


def other_numerics_revisions(job: OpenedJob) -> str:
    """Earlier runs of this job ran a shardinfer whose kernels compute differently (another
    engine.release.NUMERICS_REVISION): the splits they committed keep their bits, and the ones this run
    writes may differ from what those runs would have written. Runs of versions that recorded no
    revision are not counted: what they computed with is not known."""
    if job.state != "resume" or job.store_ is None or not job.committed:
        return ""
    from shardinfer.engine.release import NUMERICS_REVISION, VERSION  # read at call time: tests set it
    from shardinfer.writers.run_records import read_run_records

    try:
        runs = read_run_records(job.store_)
    except Exception:  # records that cannot be read must not stop the run they only warn about
        return ""
    others = sorted(
        {
            (int(run["numerics_revision"]), str(run.get("version", "?")))
            for run in runs
            if isinstance(run.get("numerics_revision"), int) and run["numerics_revision"] != NUMERICS_REVISION
        }
    )
    if not others:
        return ""
    earlier = ", ".join(f"revision {revision} (shardinfer {version})" for revision, version in others)
    return (
        f"{len(job.committed)} split(s) are already committed, and earlier runs of this job computed with numerics "
        f"{earlier}; this shardinfer {VERSION} computes with revision {NUMERICS_REVISION}, so the splits it "
        "writes may differ in bits from what those runs would have written (the job summary counts parts by "
        "revision); to keep one revision's bits, finish the job with the version that started it, or rerun it "
        "whole with --conf job.start_over=true"
    )


def float_ids(job: OpenedJob) -> str:
    """input.id_column of floats (pandas stores an integer column with nulls as float64): a row id
    is the value's text, "101.0", which joins neither the input's integer ids nor the same ids read
    from JSONL ("101"). Ids keep that form: a job in flight would otherwise mix both."""
    from shardinfer.pipeline.job import sql_name

    column = job.config.input.id_column
    if not column or not job.splits:
        return ""
    schema = job.input_schema  # after input.query: a query that casts the column ends the warning
    if column not in schema.names or not pa.types.is_floating(schema.field(column).type):
        return ""
    name = sql_name(column)
    query = f"SELECT * REPLACE (CAST({name} AS BIGINT) AS {name}) FROM input"
    own = " (or cast the column in your own input.query)" if job.config.input.query else ""
    return (
        f"input.id_column={column!r} is a column of {schema.field(column).type}: each row_id is written as "
        'the float\'s text ("101.0", not "101"), which will not join with integer ids; if the ids are whole '
        f"numbers, cast them with input.query = {json.dumps(query, ensure_ascii=False)}{own}"
        + _another_job(job)
    )


def identical_samples(spec: ResolvedSpec, job: OpenedJob) -> str:
    """n samples per row at temperature 0 are n copies of one greedy text: n times the cost for
    one answer. The temperature may come from the checkpoint (generation_config.json's
    do_sample = false), which the spec never shows."""
    from shardinfer.engine.sampling_params import GREEDY_BELOW
    from shardinfer.jobs.status import sampling_in_use

    sampling = job.sampling
    if job.config.job.task != "generate" or sampling.n < 2 or sampling.temperature >= GREEDY_BELOW:
        return ""
    source = sampling_in_use(job, spec)[1]["temperature"]
    per_row = (
        " (rows whose temperature column is set sample at their own)"
        if "temperature" in job.config.input.override_columns
        else ""
    )
    return (
        f"sampling.temperature={sampling.temperature:g} ({source}) with sampling.n={sampling.n}: greedy sampling "
        f"gives n identical samples, so each row's {sampling.n} samples will be the same text{per_row}; set "
        "temperature > 0 (e.g. --conf sampling.temperature=0.7) for distinct samples, or n = 1 for one"
        + _another_job(job)
    )


def _another_job(job: OpenedJob) -> str:
    """A fix that changes the fingerprint makes another job, which a started job's output refuses."""
    if job.state != "resume":
        return ""
    return " (that is another job: give it a new output.path, or --conf job.start_over=true)"
