"""The output location and its commit protocol.

    <output>/_job.json                      run id, fingerprint, split plan (written once, first)
    <output>/part-{split}-{attempt}.parquet one attempt at one split's rows (many may exist)
    <output>/_commits/{split}.json          the marker naming the one part that counts
    <output>/_SUCCESS                       JSON manifest, written last

A split is done when its marker exists. The marker is created only if absent (see
`shardinfer.storage.create_exclusive`), after its part file is fully written, so of two workers
racing on one split exactly one wins and the other deletes its own part. Nothing is renamed, which
matters on object stores where a rename is a copy. A crash at any instant leaves at worst a part
file no marker names; `finalize` deletes such orphans once every split is committed, then writes
`_SUCCESS`. Readers of the output trust markers and `_SUCCESS`, never a listing of part files.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import re
import socket
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from shardinfer.errors import CorruptOutputError, IncompleteOutputError, JobFileConflictError
from shardinfer.storage import (
    RetryPolicy,
    create_exclusive,
    delete_if_present,
    filesystem,
    full_url,
    is_local,
    list_files,
    put_bytes,
    read_bytes_or_none,
    with_retries,
)
from shardinfer.writers.job_file import splits_from_job, utc_now
from shardinfer.writers.parts import (
    PartInfo,
    cat_many,
    check_attempt,
    encode_part,
    is_part_name,
    json_bytes,
    parse_json,
    part_name,
)
from shardinfer.writers.schema import OUTPUT_SCHEMA_VERSION, output_schema

if TYPE_CHECKING:
    from shardinfer.splits import Split

JOB_FILE = "_job.json"
SUCCESS_FILE = "_SUCCESS"
COMMITS_DIR = "_commits"
MARKER_VERSION = 1
_MARKER_NAME = re.compile(r"^(\d+)\.json$")


class OutputStore:
    """All reads and writes of one output location; every storage call is retried per `retries`."""

    def __init__(
        self, url: str, storage_options: dict[str, Any] | None = None, retries: RetryPolicy | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self.fs, root = filesystem(self.url, storage_options)
        self.root = root.rstrip("/")
        self.retries = retries or RetryPolicy()
        if is_local(self.fs):
            os.makedirs(os.path.join(self.root, COMMITS_DIR), exist_ok=True)

    # --- paths -----------------------------------------------------------------------------------
    def _path(self, *names: str) -> str:
        return posixpath.join(self.root, *names)

    def _marker_path(self, split_name: str) -> str:
        return self._path(COMMITS_DIR, f"{split_name}.json")

    def _retry(self, what: str, fn: Any) -> Any:
        return with_retries(self.retries, what, fn)

    def _read_json(self, path: str) -> dict[str, Any] | None:
        data = self._retry(f"read {full_url(self.fs, path)}", lambda: read_bytes_or_none(self.fs, path))
        return None if data is None else parse_json(data, full_url(self.fs, path))

    # --- _job.json -------------------------------------------------------------------------------
    def read_job(self) -> dict[str, Any] | None:
        return self._read_json(self._path(JOB_FILE))

    def write_job(self, job: dict[str, Any]) -> None:
        """Create `_job.json` once. Writing the same content again is a no-op; different content raises."""
        path = self._path(JOB_FILE)
        try:
            self._retry(
                f"create {full_url(self.fs, path)}", lambda: create_exclusive(self.fs, path, json_bytes(job))
            )
        except FileExistsError:
            existing = self.read_job()
            if existing != json.loads(json_bytes(job)):
                raise JobFileConflictError(
                    f"{full_url(self.fs, path)} already exists for run {existing and existing.get('run_id')!r}; "
                    "resume that job, or start over (which clears the output location)"
                ) from None

    # --- parts and commits -----------------------------------------------------------------------
    def write_part(self, split: Split, attempt: str, table: pa.Table, metadata: dict[str, str]) -> PartInfo:
        """Write the split's rows as `part-{split.name}-{attempt}.parquet` (uncommitted until `commit`)."""
        check_attempt(attempt)
        name = part_name(split.name, attempt)
        path = self._path(name)
        data = encode_part(table, split.name, attempt, metadata)
        self._retry(f"write {full_url(self.fs, path)}", lambda: put_bytes(self.fs, path, data))
        return PartInfo(
            split_index=split.index,
            attempt=attempt,
            name=name,
            path=full_url(self.fs, path),
            rows=table.num_rows,
            bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
        )

    def commit(self, split: Split, part: PartInfo) -> bool:
        """Create the split's marker naming `part`, only if absent. True if this call won the split.

        On a lost race the marker names another attempt's part; ours is deleted and False returned.
        A FileExistsError is never retried, but it is checked: if a first try reached the store and
        only its response was lost, the marker found names our own part and we did win.
        """
        if part.split_index != split.index:
            raise ValueError(f"part {part.name} belongs to split {part.split_index}, not {split.index}")
        marker = {
            "marker_version": MARKER_VERSION,
            "split": split.index,
            "split_name": split.name,
            "part": part.name,
            "rows": part.rows,
            "bytes": part.bytes,
            "sha256": part.sha256,
            "attempt": part.attempt,
            "committed_at": utc_now(),
            "writer": f"{socket.gethostname()}:{os.getpid()}",
        }
        path = self._marker_path(split.name)
        try:
            self._retry(
                f"commit {full_url(self.fs, path)}",
                lambda: create_exclusive(self.fs, path, json_bytes(marker)),
            )
            return True
        except FileExistsError:
            existing = self._read_json(path)
            if existing is not None and existing.get("part") == part.name:
                if existing.get("sha256") != part.sha256:
                    # Two workers used one attempt name: the part file now holds whichever wrote last.
                    raise CorruptOutputError(
                        f"{full_url(self.fs, path)} names {part.name}, but with another sha256: two "
                        f"attempts at split {split.index} used the attempt name {part.attempt!r}; attempt "
                        "names must be unique (e.g. a random hex string); delete the marker to redo the split"
                    ) from None
                return True
            self._retry(f"delete {part.path}", lambda: delete_if_present(self.fs, self._path(part.name)))
            return False

    def _marker_paths(self) -> list[tuple[int, str]]:
        """(split index, marker path) in listing order, from one listing of `_commits/`.

        Names that are not `{split}.json` (crash leftovers such as temporary files) are skipped.
        """
        directory = self._path(COMMITS_DIR)
        names = self._retry(f"list {full_url(self.fs, directory)}", lambda: list_files(self.fs, directory))
        found = []
        for path in names:
            m = _MARKER_NAME.match(posixpath.basename(path))
            if m:
                found.append((int(m.group(1)), path))
        return found

    def committed_indexes(self) -> set[int]:
        """Split indexes with a marker, from one listing of `_commits/` (no marker is read).

        A marker appears atomically and complete, so its name alone says the split is done; reading
        every marker (as `committed()` does) would cost one GET per split.
        """
        return {index for index, _ in self._marker_paths()}

    def committed(self) -> dict[int, dict[str, Any]]:
        """Split index -> marker, for every split committed so far."""
        directory = self._path(COMMITS_DIR)
        found = self._marker_paths()
        paths = [path for _, path in found]
        # One batched fetch: s3fs runs the GETs concurrently, which matters when resuming 10^4 splits.
        contents = self._retry(
            f"read markers in {full_url(self.fs, directory)}", lambda: cat_many(self.fs, paths)
        )
        markers: dict[int, dict[str, Any]] = {}
        for index, path in found:
            data = contents.get(path)
            if data is None:
                continue  # deleted since the listing (a concurrent start-over)
            marker = parse_json(data, full_url(self.fs, path))
            if marker.get("split") != index or "part" not in marker:
                raise CorruptOutputError(
                    f"{full_url(self.fs, path)} is not a commit marker for split {index}: {marker}; "
                    "delete it to redo that split"
                )
            markers[index] = marker
        return dict(sorted(markers.items()))

    def read_part_metadata(self, part: str) -> dict[bytes, bytes]:
        """The Parquet key-value metadata of the part file named `part` (one footer read, no data pages)."""
        path = self._path(part)

        def footer() -> dict[bytes, bytes]:
            with self.fs.open(path, "rb") as f:
                return dict(pq.read_metadata(f).metadata or {})

        meta: dict[bytes, bytes] = self._retry(f"read footer of {full_url(self.fs, path)}", footer)
        return meta

    # --- finishing and reading back --------------------------------------------------------------
    def finalize(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Delete orphan parts and write `_SUCCESS`; every split of the plan must be committed.

        Deleting parts no marker names is only safe once every split has a marker: a worker still
        writing an attempt for a committed split will lose its commit and needs no part file.
        """
        job = self.read_job()
        if job is None:
            raise IncompleteOutputError(f"{self.url} has no {JOB_FILE}; nothing to finalize")
        plan = splits_from_job(job)
        markers = self.committed()
        missing = [s.index for s in plan if s.index not in markers]
        if missing:
            raise IncompleteOutputError(
                f"{self.url}: {len(missing)} of {len(plan)} splits are not committed (first: {missing[:10]}); "
                "run the job again to finish them"
            )
        referenced = {m["part"] for m in markers.values()}
        orphans = [
            p
            for p in self._listing()
            if is_part_name(name := posixpath.basename(p)) and name not in referenced
        ]
        for path in orphans:
            self._retry(f"delete {full_url(self.fs, path)}", lambda p=path: delete_if_present(self.fs, p))
        files = [
            {"split": i, "path": m["part"], "rows": m["rows"], "bytes": m["bytes"], "sha256": m["sha256"]}
            for i, m in markers.items()
        ]
        commit_times = sorted(m.get("committed_at", "") for m in markers.values())
        success = {
            "committer": "shardinfer",
            "marker_version": MARKER_VERSION,
            "output_schema_version": OUTPUT_SCHEMA_VERSION,
            "run_id": job.get("run_id"),
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
            "orphans_deleted": sorted(posixpath.basename(p) for p in orphans),
            "summary": summary,
        }
        path = self._path(SUCCESS_FILE)
        self._retry(f"write {full_url(self.fs, path)}", lambda: put_bytes(self.fs, path, json_bytes(success)))
        return success

    def _listing(self) -> list[str]:
        return list(self._retry(f"list {self.url}", lambda: list_files(self.fs, self.root)))

    def read_success(self) -> dict[str, Any] | None:
        return self._read_json(self._path(SUCCESS_FILE))

    def read_committed_table(self, verify: bool = True) -> pa.Table:
        """The committed parts concatenated in split order; with `verify`, each part's hash and row
        count are checked against its marker."""
        tables = []
        for marker in self.committed().values():
            path = self._path(marker["part"])
            data = self._retry(
                f"read {full_url(self.fs, path)}", lambda p=path: read_bytes_or_none(self.fs, p)
            )
            if data is None:
                raise CorruptOutputError(
                    f"{self.url}: the marker of split {marker['split']} names {marker['part']}, which is "
                    f"missing; delete _commits/{marker['split_name']}.json and re-run the job to redo it"
                )
            if verify and hashlib.sha256(data).hexdigest() != marker["sha256"]:
                raise CorruptOutputError(
                    f"{full_url(self.fs, path)} does not match the sha256 its commit marker records; the "
                    "file was changed after commit; delete its marker and re-run to redo the split"
                )
            table = pq.read_table(io.BytesIO(data))
            if verify and table.num_rows != marker["rows"]:
                raise CorruptOutputError(
                    f"{full_url(self.fs, path)} has {table.num_rows} rows, marker says {marker['rows']}"
                )
            tables.append(table)
        if not tables:
            return output_schema().empty_table()
        return pa.concat_tables(tables)

    def clear(self) -> None:
        """Delete everything this protocol wrote, for a start-over. `_SUCCESS` goes first (nobody may
        trust a half-cleared output), `_job.json` last (a crash midway still blocks a silent resume)."""
        for path in [self._path(SUCCESS_FILE), *list_files(self.fs, self._path(COMMITS_DIR))]:
            self._retry(f"delete {full_url(self.fs, path)}", lambda p=path: delete_if_present(self.fs, p))
        for path in self._listing():
            if is_part_name(posixpath.basename(path)):
                self._retry(f"delete {full_url(self.fs, path)}", lambda p=path: delete_if_present(self.fs, p))
        job = self._path(JOB_FILE)
        self._retry(f"delete {full_url(self.fs, job)}", lambda: delete_if_present(self.fs, job))
