"""`_SUCCESS`: the manifest written last, and the check of a manifest against the markers.

`_SUCCESS` lists every committed file with its marker, rows, bytes and sha256. A reader (or
`shardinfer status`) compares it with the markers of the job's generation: a marker deleted or
replaced after `_SUCCESS`, or a `_SUCCESS` of an earlier generation, is reported, never
silently read as complete.
"""

from __future__ import annotations

from typing import Any

from shardinfer.writers.job_file import utc_now
from shardinfer.writers.schema import OUTPUT_SCHEMA_VERSION

SUCCESS_VERSION = 2


def build_success(
    job: dict[str, Any], markers: dict[int, dict[str, Any]], orphans: list[str], summary: dict[str, Any]
) -> dict[str, Any]:
    files = [
        {
            "split": i,
            "path": m["part"],
            "marker": m["marker_file"],
            "rows": m["rows"],
            "bytes": m["bytes"],
            "sha256": m["sha256"],
        }
        for i, m in sorted(markers.items())
    ]
    commit_times = sorted(m.get("committed_at", "") for m in markers.values())
    return {
        "committer": "shardinfer",
        "success_version": SUCCESS_VERSION,
        "output_schema_version": OUTPUT_SCHEMA_VERSION,
        "run_id": job.get("run_id"),
        "generation": job.get("generation"),
        "fingerprint": job.get("fingerprint"),
        "files": files,
        "totals": {
            "splits": len(files),
            "rows": sum(f["rows"] for f in files),
            "bytes": sum(f["bytes"] for f in files),
        },
        "timings": {
            "job_created": job.get("created"),
            "first_commit": commit_times[0] if commit_times else None,
            "last_commit": commit_times[-1] if commit_times else None,
            "finalized": utc_now(),
        },
        "orphans_deleted": orphans,
        "summary": summary,
    }


def success_problems(success: dict[str, Any], markers: dict[int, dict[str, Any]], planned: int) -> list[str]:
    """Each way `_SUCCESS` and the current markers disagree, as a sentence naming the split."""
    problems: list[str] = []
    listed = {int(f["split"]): f for f in success.get("files", []) if isinstance(f, dict) and "split" in f}
    for index in sorted(set(listed) | set(markers)):
        entry, marker = listed.get(index), markers.get(index)
        if entry is None:
            problems.append(f"split {index} is committed but not listed in _SUCCESS")
        elif marker is None:
            problems.append(f"split {index} is listed in _SUCCESS but its commit marker is missing")
        elif entry.get("path") != marker.get("part") or entry.get("sha256") != marker.get("sha256"):
            problems.append(
                f"split {index}: _SUCCESS lists {entry.get('path')} but its marker names {marker.get('part')}"
            )
    if len(listed) != planned:
        problems.append(f"_SUCCESS lists {len(listed)} splits, the plan has {planned}")
    return problems
