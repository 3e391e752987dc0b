"""`_job.json`: the record a job leaves at its output location before it writes anything else.

It pins what a resumed run must agree with: the fingerprint (model, tokenizer, template, sampling
defaults, numerics, output schema version), the job generation (see `writers.markers`) and the
split plan. A resumed run reads the plan from
here and never lists the input again, so the split indexes named by commit markers keep meaning
the same rows.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from shardinfer.splits import Split, plan_from_records, plan_to_records
from shardinfer.writers.markers import check_generation, new_generation
from shardinfer.writers.schema import OUTPUT_SCHEMA_VERSION

JOB_FILE_VERSION = 2


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def make_job_record(
    run_id: str,
    fingerprint: dict[str, Any],
    splits: list[Split],
    extra: dict[str, Any] | None = None,
    generation: str | None = None,
) -> dict[str, Any]:
    """The `_job.json` content; `extra` (input spec, job spec, ...) is stored under its own keys.

    `generation` defaults to a fresh one: each planning of a job is its own generation.
    """
    if generation is None:
        generation = new_generation(str(fingerprint.get("hash", "")))
    record: dict[str, Any] = {
        "job_file_version": JOB_FILE_VERSION,
        "output_schema_version": OUTPUT_SCHEMA_VERSION,
        "run_id": run_id,
        "generation": check_generation(generation),
        "created": utc_now(),
        "fingerprint": fingerprint,
        "splits": plan_to_records(splits),
        "total_input_rows": sum(s.num_rows for s in splits),
    }
    for key, value in (extra or {}).items():
        if key in record:
            raise ValueError(f"extra key {key!r} would overwrite a _job.json field; choose another name")
        record[key] = value
    return record


def splits_from_job(job: dict[str, Any]) -> list[Split]:
    """The split plan stored in a `_job.json` record, checked to be numbered 0..n-1."""
    return plan_from_records(job.get("splits", []))
