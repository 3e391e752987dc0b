"""`shardinfer status` and the `--dry-run` report: what a job location holds, read from its markers.

Status trusts `_job.json`, the commit markers and `_SUCCESS`, never a listing of part files
(an uncommitted part may be lying there from a killed attempt).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from shardinfer.errors import EXIT_OK, InputMissing
from shardinfer.jobs.spec import ResolvedSpec
from shardinfer.pipeline.job import OpenedJob, committed_totals, read_success_or_none


def show_status(output: str, storage_options: dict[str, Any], as_json: bool = False) -> int:
    from shardinfer.writers.output_store import OutputStore

    store = OutputStore(output, storage_options)
    job = store.read_job()
    if job is None:
        raise InputMissing(f"{output} holds no job (_job.json is missing): check the output URL")
    committed = store.committed()
    success = read_success_or_none(store)
    totals = committed_totals(store, committed)
    total_splits = len(job.get("splits", []))
    report = {
        "output": output,
        "state": "complete"
        if success is not None
        else ("running or interrupted" if committed else "not started"),
        "splits_committed": len(committed),
        "splits_total": total_splits,
        **totals,
        "fingerprint": job.get("fingerprint", {}).get("hash"),
    }
    if success is not None:
        last = success.get("summary", {})
        for key in ("run_id", "wall_time_s", "output_tokens_per_s", "prefix_cache_hit_rate"):
            if key in last:
                report[key] = last[key]
    if as_json:
        print(json.dumps(report, default=str))
        return EXIT_OK
    print(f"{output}: {report['state']}")
    print(f"  splits     {len(committed)}/{total_splits} committed")
    print(f"  rows       {totals['rows_ok']} ok, {totals['rows_error']} error")
    print(f"  tokens     {totals['prompt_tokens']} in, {totals['completion_tokens']} out")
    if "output_tokens_per_s" in report:
        print(
            f"  last run   {report.get('run_id')}: {report['output_tokens_per_s']} tok/s over "
            f"{report.get('wall_time_s')} s, prefix-cache hit rate {report.get('prefix_cache_hit_rate')}"
        )
    return EXIT_OK


def print_dry_run(job: OpenedJob, spec: ResolvedSpec, num_workers: int, out: Any = None) -> None:
    """The resolved spec (with each value's source), the fingerprint and the split plan."""
    out = out if out is not None else sys.stdout
    cfg = spec.config.to_dict()
    print("# resolved job spec", file=out)
    for section, body in cfg.items():
        print(f"[{section}]", file=out)
        for key, value in body.items():
            source = spec.sources.get(f"{section}.{key}", "default")
            print(f"{key} = {json.dumps(value, default=str)}  # {source}", file=out)
    print("\n# fingerprint", file=out)
    print(json.dumps(job.fingerprint, indent=2, sort_keys=True, default=str), file=out)
    committed = set(job.committed)
    print(
        f"\n# plan: {len(job.splits)} split(s), {num_workers} worker(s), output state: {job.state}", file=out
    )
    for s in job.splits:
        mark = " (committed)" if s.index in committed else ""
        print(f"split {s.index}: {s.path} rows [{s.row_start}, {s.row_end}){mark}", file=out)
