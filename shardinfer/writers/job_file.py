"""`_job.json`: the record a job leaves at its output location before it writes anything else.

It pins what a resumed run must agree with: the fingerprint (model, tokenizer, template, sampling
defaults, numerics, output schema version) and the split plan. A resumed run reads the plan from
here and never lists the input again, so the split indexes named by commit markers keep meaning
the same rows.
"""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any

from shardinfer.readers.spec import Split
from shardinfer.writers.schema import OUTPUT_SCHEMA_VERSION

JOB_FILE_VERSION = 1
_MISSING = object()


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def make_job_record(
    run_id: str,
    fingerprint: dict[str, Any],
    splits: list[Split],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `_job.json` content; `extra` (input spec, job spec, ...) is stored under its own keys."""
    record: dict[str, Any] = {
        "job_file_version": JOB_FILE_VERSION,
        "output_schema_version": OUTPUT_SCHEMA_VERSION,
        "run_id": run_id,
        "created": utc_now(),
        "fingerprint": fingerprint,
        "splits": [s.to_dict() for s in splits],
        "total_input_rows": sum(s.num_rows for s in splits),
    }
    for key, value in (extra or {}).items():
        if key in record:
            raise ValueError(f"extra key {key!r} would overwrite a _job.json field; choose another name")
        record[key] = value
    return record


def splits_from_job(job: dict[str, Any]) -> list[Split]:
    """The split plan stored in a `_job.json` record, checked to be numbered 0..n-1."""
    splits = [Split.from_dict(d) for d in job.get("splits", [])]
    for expected, split in enumerate(splits):
        if split.index != expected:
            raise ValueError(
                f"_job.json split plan is damaged: position {expected} holds split {split.index}; "
                "restore the file or start the job over"
            )
    return splits


def diff_fingerprints(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Dotted names of the keys whose values differ (added or removed keys count), sorted.

    Nested dicts are compared key by key so the message can say `sampling.temperature` rather than
    just `sampling`. Both sides are first put through JSON, as the stored one was, so a tuple and
    the list it was saved as compare equal.
    """
    return _diff(_as_json(old), _as_json(new), "")


def _as_json(value: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(json.dumps(value, sort_keys=True, default=str)))


def _diff(old: dict[str, Any], new: dict[str, Any], _prefix: str) -> list[str]:
    changed: list[str] = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key, _MISSING), new.get(key, _MISSING)
        name = f"{_prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            changed += _diff(a, b, f"{name}.")
        elif a != b or (a is _MISSING) != (b is _MISSING):
            changed.append(name)
    return changed
