"""`_runs/{run_id}.json`: each run of a job records itself at the output location.

The record is written when the run starts, rewritten as a heartbeat while it runs, and a last
time with its end, exit code and reason. `shardinfer status` reads the newest one to tell a
running job from a failed, an interrupted (killed: its heartbeat stopped) or a finished one;
`shardinfer history` lists them all. A run id used twice (a scheduler's retry) gets `.2`, `.3`...
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from shardinfer.errors import CorruptOutputError
from shardinfer.storage import create_exclusive, full_url, list_files, put_bytes, read_bytes_or_none
from shardinfer.writers.parts import json_bytes, parse_json

RUNS_DIR = "_runs"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _runs_path(store: Any, name: str = "") -> str:
    return posixpath.join(store.root, RUNS_DIR, name) if name else posixpath.join(store.root, RUNS_DIR)


def create_run_record(store: Any, run_id: str, record: dict[str, Any]) -> str:
    """Create the run's record under a name no earlier run used; returns that name."""
    base = _SAFE.sub("_", run_id).lstrip(".") or "run"
    for n in range(1, 10_000):
        name = f"{base}.json" if n == 1 else f"{base}.{n}.json"
        path = _runs_path(store, name)
        try:
            store._retry(
                f"create {full_url(store.fs, path)}",
                lambda p=path: create_exclusive(store.fs, p, json_bytes(record)),
            )
            return name
        except FileExistsError:
            continue
    raise FileExistsError(f"{full_url(store.fs, _runs_path(store))}: too many runs named {run_id!r}")


def update_run_record(store: Any, name: str, record: dict[str, Any]) -> None:
    path = _runs_path(store, name)
    store._retry(f"write {full_url(store.fs, path)}", lambda: put_bytes(store.fs, path, json_bytes(record)))


def read_run_records(store: Any) -> list[dict[str, Any]]:
    """Every run record, oldest start first; unreadable ones are reported as such, not skipped."""
    directory = _runs_path(store)
    paths = store._retry(f"list {full_url(store.fs, directory)}", lambda: list_files(store.fs, directory))
    records = []
    for path in paths:
        if not path.endswith(".json") or posixpath.basename(path).startswith("."):
            continue
        data = store._retry(
            f"read {full_url(store.fs, path)}", lambda p=path: read_bytes_or_none(store.fs, p)
        )
        if data is None:
            continue
        try:
            record = parse_json(data, full_url(store.fs, path))
        except CorruptOutputError as exc:
            record = {"run_id": posixpath.basename(path), "state": "unreadable", "reason": str(exc)}
        record["record"] = posixpath.basename(path)
        records.append(record)
    return sorted(records, key=lambda r: str(r.get("started", "")))
