"""The output location and its commit protocol.

    <output>/_job.json                                   fingerprint, generation, split plan (first)
    <output>/part-{split}-{generation}-{attempt}.parquet one attempt at one split's rows
    <output>/_commits/{split}.{generation}.{n}.json      the marker naming the one part that counts
    <output>/_SUCCESS                                    JSON manifest, written last

A split is done when its marker of the current generation exists (see `writers.markers`). The
marker is created only if absent (see `shardinfer.storage.create_exclusive`), after its part file
is fully written, so of two workers racing on one split exactly one wins and the other deletes its
own part. Nothing is renamed, which matters on object stores where a rename is a copy. A crash at
any instant leaves at worst a part file no marker names; `finalize` verifies every committed part,
deletes the rest, then writes `_SUCCESS`. Readers trust markers and `_SUCCESS`, never a listing.

Fencing: a commit first checks that `_job.json` still holds this store's generation, and markers
of any other generation are never counted, so a job started over while an older one still runs
can never bless the older one's rows (`StaleGenerationError` stops the older one).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import posixpath
import socket
import time
import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from shardinfer.errors import (
    ConfigError,
    CorruptOutputError,
    DamagedPartsError,
    ExclusiveCreateUnsupportedError,
    IncompleteOutputError,
    JobFileConflictError,
    StaleGenerationError,
    StorageError,
)
from shardinfer.storage import (
    FileInTheWayError,
    RetryPolicy,
    create_exclusive,
    delete_if_present,
    filesystem,
    full_url,
    is_local,
    is_memory,
    list_file_sizes,
    list_files,
    put_bytes,
    read_bytes_or_none,
    with_retries,
)
from shardinfer.writers.job_file import splits_from_job, utc_now
from shardinfer.writers.manifest import build_success, success_problems
from shardinfer.writers.markers import (
    COMMITS_DIR,
    MarkerName,
    current_markers,
    marker_file_name,
    parse_marker_name,
)
from shardinfer.writers.parts import (
    FIX_JOB_FILE,
    FIX_MARKER,
    FIX_SUCCESS,
    PartInfo,
    cat_many,
    check_attempt,
    encode_part,
    is_part_name,
    json_bytes,
    map_parts,
    parse_json,
    part_name,
)
from shardinfer.writers.schema import output_schema
from shardinfer.writers.verify import part_damage

if TYPE_CHECKING:
    from shardinfer.splits import Split

JOB_FILE = "_job.json"
SUCCESS_FILE = "_SUCCESS"
MARKER_VERSION = 2
# A resubmit of a finished job checks each part's presence and size, not its content (that would
# read the whole output every time): a part changed at the same size is recomputed once it is gone.
_FIX_CHANGED_PART = "delete that part file and run the job again: its split is computed again"
# A temporary file of an interrupted local write is removed at finalize once it is this old: a
# live writer's temporary file exists only for the moments of one write and fsync.
STALE_TEMP_S = 600.0


def _without_trailing_slashes(url: str) -> str:
    """`url` without the slashes that end it, leaving a scheme's `://` whole (`s3://` is not the
    local path `s3:`) and the root of a local disk (`/`) as it is."""
    scheme, sep, rest = url.partition("://")
    if sep and "/" not in scheme:
        return scheme + sep + (rest.rstrip("/") or rest[:1])
    return url.rstrip("/") or url


class OutputStore:
    """All reads and writes of one output location; every storage call is retried per `retries`."""

    def __init__(
        self, url: str, storage_options: dict[str, Any] | None = None, retries: RetryPolicy | None = None
    ) -> None:
        self.url = _without_trailing_slashes(url)
        self.fs, root = filesystem(self.url, storage_options)
        self.root = root.rstrip("/") or root
        if not self.root.strip("/") and not is_local(self.fs):
            # `s3://` names no bucket; stripped of its slashes it would even have become `s3:`,
            # a local folder of that name in the working directory.
            raise ConfigError(
                f"output location {url!r} names no bucket or folder: give one, as in "
                "s3://BUCKET/PREFIX (or memory://NAME, or a local directory)"
            )
        self.retries = retries or RetryPolicy()
        self._generation: str | None = None
        # Split -> marker number to commit under: splits being repaired (their part was damaged).
        self._repairs: dict[int, int] = {}
        self._exclusive_checked = False
        # Nothing is created here: `status`, `validate` and a refused submit only read, and must
        # leave no folder behind. Directories appear with the first file written in them (local
        # writes create their parent directory; object stores have none).

    # --- paths -----------------------------------------------------------------------------------
    def _path(self, *names: str) -> str:
        return posixpath.join(self.root, *names)

    def _retry(self, what: str, fn: Any) -> Any:
        try:
            return with_retries(self.retries, what, fn)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                # The disk may be freed (or the quota raised) and the job rerun: retryable, exit 75.
                raise StorageError(
                    exc.errno,
                    f"{what}: no space left on the device or quota exceeded ({exc}); free space under "
                    f"{self.url} and run the job again (committed splits are kept)",
                ) from exc
            if isinstance(exc, FileInTheWayError):
                raise ConfigError(
                    f"{what}: {exc.strerror}; the output location {self.url} cannot hold its files "
                    "there: move that file away, or set output.path to another folder"
                ) from exc
            if is_local(self.fs) and (isinstance(exc, PermissionError) or exc.errno == errno.EROFS):
                # A folder's permissions or a read-only mount: no credential of an object store is
                # involved, and no retry helps; a person fixes the folder or picks another.
                raise ConfigError(
                    f"{what}: {exc.strerror or exc}: this user cannot read and write the output "
                    f"location {self.url}; fix the permissions of that folder (or its mount), or set "
                    "output.path to a folder this user can write (committed splits are kept)"
                ) from exc
            raise

    def _read_json(self, path: str, fix: str) -> dict[str, Any] | None:
        """The JSON record at `path` (None if absent); `fix` is what the error of an unreadable one
        tells the user to do."""
        data = self._retry(f"read {full_url(self.fs, path)}", lambda: read_bytes_or_none(self.fs, path))
        return None if data is None else parse_json(data, full_url(self.fs, path), fix)

    def _delete(self, path: str) -> None:
        self._retry(f"delete {full_url(self.fs, path)}", lambda: delete_if_present(self.fs, path))

    # --- _job.json and the generation ------------------------------------------------------------
    def read_job(self) -> dict[str, Any] | None:
        return self._read_json(self._path(JOB_FILE), FIX_JOB_FILE)

    @property
    def generation(self) -> str:
        """The job generation this store writes and counts (from `_job.json` unless set)."""
        if self._generation is None:
            job = self.read_job()
            if job is None or not job.get("generation"):
                raise IncompleteOutputError(
                    f"{self.url} has no {JOB_FILE} with a job generation; the job must be planned first"
                )
            self._generation = str(job["generation"])
        return self._generation

    def use_generation(self, generation: str) -> None:
        self._generation = generation

    def write_job(self, job: dict[str, Any]) -> dict[str, Any]:
        """Create `_job.json` if absent; returns the record in force. The same content again is a
        no-op; other content raises (the caller decides first whether to join an existing job)."""
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
        self._generation = job.get("generation")
        return job

    def create_or_read_job(self, job: dict[str, Any]) -> dict[str, Any]:
        """Create `_job.json` if absent, else return the one that won (two submits planning at once)."""
        path = self._path(JOB_FILE)
        try:
            self._retry(
                f"create {full_url(self.fs, path)}", lambda: create_exclusive(self.fs, path, json_bytes(job))
            )
            return job
        except FileExistsError:
            existing = self.read_job()
            if existing is None:  # deleted between our create and our read: try once more
                return self.write_job(job)
            return existing

    def replace_job(self, job: dict[str, Any]) -> None:
        """Overwrite `_job.json` (a start-over): from this instant the old generation is fenced off."""
        path = self._path(JOB_FILE)
        self._retry(f"write {full_url(self.fs, path)}", lambda: put_bytes(self.fs, path, json_bytes(job)))
        self._generation = job.get("generation")

    def check_fence(self) -> None:
        """Raise StaleGenerationError unless `_job.json` still holds this store's generation."""
        job = self.read_job()
        current = job.get("generation") if job else None
        if current != self.generation:
            raise StaleGenerationError(
                f"{self.url} now belongs to another generation of the job ({current or 'no _job.json'}; "
                f"this run's is {self.generation}): it was started over or cleared while this run was "
                "working, so this run stops and none of its work will count; if that was not intended, "
                "check which job owns the output location"
            )

    # --- parts and commits -----------------------------------------------------------------------
    def write_part(self, split: Split, attempt: str, table: pa.Table, metadata: dict[str, str]) -> PartInfo:
        """Write the split's rows as a part file of this generation (uncommitted until `commit`)."""
        check_attempt(attempt)
        name = part_name(split.name, self.generation, attempt)
        path = self._path(name)
        meta = {**metadata, "shardinfer.generation": self.generation}
        data = encode_part(table, split.name, attempt, meta)
        self._retry(f"write {full_url(self.fs, path)}", lambda: put_bytes(self.fs, path, data))
        return PartInfo(
            split_index=split.index,
            attempt=attempt,
            name=name,
            path=full_url(self.fs, path),
            rows=table.num_rows,
            bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            md5=hashlib.md5(data, usedforsecurity=False).hexdigest(),
        )

    def commit(self, split: Split, part: PartInfo) -> bool:
        """Create the split's marker naming `part`, only if absent. True if this call won the split.

        Refused (StaleGenerationError) when `_job.json` no longer holds this generation. On a lost
        race the marker names another attempt's part; ours is deleted and False returned. The marker
        is read back after every create: if a first try reached the store and only its response was
        lost, the marker names our part and we did win; if a store ignored the create-if-absent
        condition and another writer overwrote the marker, it names theirs and we lost.
        """
        if part.split_index != split.index:
            raise ValueError(f"part {part.name} belongs to split {part.split_index}, not {split.index}")
        self.check_fence()
        self.check_exclusive_create()
        number = self._repairs.get(split.index, 0)
        marker = {
            "marker_version": MARKER_VERSION,
            "generation": self.generation,
            "marker_number": number,
            "split": split.index,
            "split_name": split.name,
            "part": part.name,
            "rows": part.rows,
            "bytes": part.bytes,
            "sha256": part.sha256,
            "md5": part.md5,
            "attempt": part.attempt,
            "committed_at": utc_now(),
            "writer": f"{socket.gethostname()}:{os.getpid()}",
        }
        path = self._path(COMMITS_DIR, marker_file_name(split.index, self.generation, number))
        # FileExistsError (a lost race, or our own first try whose response was lost) is settled by
        # the read-back below, as is a store that ignored the condition and let a writer overwrite.
        try:
            self._retry(
                f"commit {full_url(self.fs, path)}",
                lambda: create_exclusive(self.fs, path, json_bytes(marker)),
            )
        except FileExistsError:
            pass
        except OSError:
            # A start-over clearing the location under us shows up as a missing file or directory:
            # the fence names that plainly (exit 78); only a store fault of our own is raised as is.
            self.check_fence()
            raise
        existing = self._read_json(path, FIX_MARKER)
        if existing is not None and existing.get("part") == part.name:
            if existing.get("sha256") != part.sha256:
                # Two workers used one attempt name: the part file now holds whichever wrote last.
                raise CorruptOutputError(
                    f"{full_url(self.fs, path)} names {part.name}, but with another sha256: two "
                    f"attempts at split {split.index} used the attempt name {part.attempt!r}; attempt "
                    "names must be unique (e.g. a random hex string); delete the marker to redo the split"
                )
            self._repairs.pop(split.index, None)
            return True
        self._delete(self._path(part.name))
        return False

    def check_exclusive_create(self) -> None:
        """Once per store object: prove that this store refuses a second create-if-absent.

        An S3-compatible service (or an s3fs release) that ignores `If-None-Match: *` lets a second
        commit overwrite the first marker, and both committers believe they won. Local disk and
        memory:// are exclusive by construction; anything else is probed with a scratch object in
        `_commits/` (three requests) before the first commit.
        """
        if self._exclusive_checked or is_local(self.fs) or is_memory(self.fs):
            return
        path = self._path(COMMITS_DIR, f".probe-{uuid.uuid4().hex}")
        what = f"probe {full_url(self.fs, path)}"
        with contextlib.suppress(FileExistsError):  # a fresh random name: only our own lost response
            self._retry(what, lambda: create_exclusive(self.fs, path, b"first"))
        try:
            self._retry(what, lambda: create_exclusive(self.fs, path, b"second"))
        except FileExistsError:
            self._exclusive_checked = True
            return
        finally:
            self._delete(path)
        raise ExclusiveCreateUnsupportedError(
            f"{self.url}: the store overwrote an object that was created only-if-absent (it ignores "
            "If-None-Match: *), so two workers could both commit one split. Use a store that honours "
            "conditional writes (AWS S3 does) and s3fs >= 2025.7.0, or write the output to another store"
        )

    def _marker_names(self) -> list[MarkerName]:
        """Every marker in `_commits/` (any generation), from one listing; other names are skipped."""
        directory = self._path(COMMITS_DIR)
        paths = self._retry(f"list {full_url(self.fs, directory)}", lambda: list_files(self.fs, directory))
        names = [parse_marker_name(posixpath.basename(p)) for p in paths]
        return [n for n in names if n is not None]

    def committed_indexes(self) -> set[int]:
        """Split indexes with a marker of this generation, from one listing of `_commits/` (no marker
        is read: a marker appears atomically and complete). Splits being repaired are left out."""
        found = current_markers(self._marker_names(), self.generation)
        return {i for i in found if i not in self._repairs}

    def committed(self) -> dict[int, dict[str, Any]]:
        """Split index -> marker of this generation (the highest marker number), for every split."""
        found = current_markers(self._marker_names(), self.generation)
        paths = {i: self._path(COMMITS_DIR, m.file_name) for i, m in found.items()}
        directory = self._path(COMMITS_DIR)
        # One batched fetch: s3fs runs the GETs concurrently, which matters when resuming 10^4 splits.
        contents = self._retry(
            f"read markers in {full_url(self.fs, directory)}", lambda: cat_many(self.fs, list(paths.values()))
        )
        markers: dict[int, dict[str, Any]] = {}
        for index, path in paths.items():
            data = contents.get(path)
            if data is None:
                continue  # deleted since the listing (a concurrent start-over)
            marker = parse_json(data, full_url(self.fs, path), FIX_MARKER)
            if marker.get("split") != index or "part" not in marker:
                raise CorruptOutputError(
                    f"{full_url(self.fs, path)} is not a commit marker for split {index}: {marker}; "
                    "delete it to redo that split"
                )
            marker["marker_file"] = posixpath.basename(path)
            markers[index] = marker
        return markers

    def damaged_parts(self, markers: dict[int, dict[str, Any]] | None = None) -> dict[int, str]:
        """Split -> why its committed part does not match its marker (see writers.verify)."""
        markers = self.committed() if markers is None else markers

        def check(marker: dict[str, Any]) -> str | None:
            path = self._path(marker["part"])
            reason: str | None = self._retry(
                f"verify {full_url(self.fs, path)}", lambda: part_damage(self.fs, path, marker)
            )
            return reason

        reasons = map_parts(check, list(markers.values()))
        return {
            index: f"{marker['part']}: {reason}"
            for (index, marker), reason in zip(markers.items(), reasons, strict=True)
            if reason is not None
        }

    def listed_damage(
        self, markers: dict[int, dict[str, Any]], sizes: dict[str, int] | None = None
    ) -> dict[int, str]:
        """Split -> why, for committed parts that are missing or not of the size their marker
        records, from one listing of the location (a few requests for any number of parts; no part
        is opened). The cheap check: a part replaced by one of the same size passes it, and is
        caught only by `damaged_parts`, which reads or HEADs every part. `sizes` (from
        `listing_sizes`) saves listing again."""
        sizes = self.listing_sizes() if sizes is None else sizes
        damaged: dict[int, str] = {}
        for index, marker in markers.items():
            size, want = sizes.get(marker["part"]), marker.get("bytes")
            if size is None:
                damaged[index] = f"{marker['part']}: its part file is missing"
            elif want is not None and size != int(want):
                damaged[index] = (
                    f"{marker['part']}: its part file has {size} bytes, the marker records {want} "
                    "(truncated or replaced)"
                )
        return damaged

    def stray_parts(self, markers: dict[int, dict[str, Any]], sizes: dict[str, int]) -> list[str]:
        """Names of the part files in the listing `sizes` that no marker of `markers` names, sorted:
        what `finalize` deletes, and a finished job's leftovers (an attempt killed between its part
        and its marker after `finalize` ran), which a dataset reader of the folder would count as rows."""
        named = {m["part"] for m in markers.values()}
        return sorted(n for n in sizes if is_part_name(n) and n not in named)

    def delete_parts(self, names: list[str]) -> None:
        for name in names:
            self._delete(self._path(name))

    def plan_repairs(self, damaged: dict[int, str], markers: dict[int, dict[str, Any]]) -> None:
        """Make the damaged splits uncommitted for this store's workers: the next commit of each
        goes under the next marker number, created only if absent like the first.

        `_SUCCESS` is deleted first: it lists the damaged parts, and from here until `finalize`
        writes it again the output is not complete (a repair killed half-way must not leave a
        `_SUCCESS` that a reader would trust)."""
        if damaged:
            self.delete_success()
        for index in damaged:
            self._repairs[index] = int(markers[index].get("marker_number", 0)) + 1

    def read_part_metadata(self, part: str) -> dict[bytes, bytes]:
        """The Parquet key-value metadata of the part file named `part` (one footer read, no data pages)."""
        path = self._path(part)

        def footer() -> dict[bytes, bytes]:
            with self.fs.open(path, "rb") as f:
                return dict(pq.read_metadata(f).metadata or {})

        meta: dict[bytes, bytes] = self._retry(f"read footer of {full_url(self.fs, path)}", footer)
        return meta

    def read_part_columns(self, part: str, columns: list[str]) -> pa.Table:
        """The named columns of the part file `part` (those it has; Parquet reads only their pages)."""
        path = self._path(part)

        def read() -> pa.Table:
            with self.fs.open(path, "rb") as f:
                parquet = pq.ParquetFile(f)
                present = [c for c in columns if c in parquet.schema_arrow.names]
                return parquet.read(columns=present)

        table: pa.Table = self._retry(f"read {full_url(self.fs, path)}", read)
        return table

    # --- finishing and reading back --------------------------------------------------------------
    def finalize(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Verify every committed part, delete what no current marker names, write `_SUCCESS`.

        Deleting unnamed parts is only safe once every split has a marker: a worker still writing an
        attempt for a committed split will lose its commit and needs no part file. Parts and markers
        of other generations are deleted too: they belong to a job this location no longer holds.
        """
        self.check_fence()
        job = self.read_job()
        assert job is not None  # check_fence read it
        plan = splits_from_job(job)
        markers = self.committed()
        missing = [s.index for s in plan if s.index not in markers]
        if missing:
            raise IncompleteOutputError(
                f"{self.url}: {len(missing)} of {len(plan)} splits are not committed (first: {missing[:10]}); "
                "run the job again to finish them"
            )
        damaged = self.damaged_parts(markers)
        if damaged:
            raise DamagedPartsError(
                f"{self.url}: {len(damaged)} committed part(s) do not match their markers: "
                + "; ".join(f"split {i}: {why}" for i, why in sorted(damaged.items()))
                + "; run the job again to recompute them",
                damaged,
            )
        keep_markers = {m["marker_file"] for m in markers.values()}
        orphans = self.stray_parts(markers, self.listing_sizes())
        self.delete_parts(orphans)
        for marker_name in self._marker_names():
            if marker_name.file_name not in keep_markers:
                self._delete(self._path(COMMITS_DIR, marker_name.file_name))
        self._remove_stale_temporaries()
        success = build_success(job, markers, orphans, summary)
        path = self._path(SUCCESS_FILE)
        self._retry(f"write {full_url(self.fs, path)}", lambda: put_bytes(self.fs, path, json_bytes(success)))
        return success

    def _remove_stale_temporaries(self) -> None:
        """Temporary files of interrupted local writes (`.tmp-*`), once old enough to be nobody's."""
        if not is_local(self.fs):
            return
        now = time.time()
        for directory in (self.root, self._path(COMMITS_DIR)):
            if not os.path.isdir(directory):
                continue  # `_commits/` appears with the first marker
            for entry in os.scandir(directory):
                if entry.name.startswith(".tmp-") and entry.is_file():
                    try:
                        if now - entry.stat().st_mtime > STALE_TEMP_S:
                            os.unlink(entry.path)
                    except FileNotFoundError:
                        continue  # its writer just moved or removed it

    def _listing(self) -> list[str]:
        return list(self._retry(f"list {self.url}", lambda: list_files(self.fs, self.root)))

    def listing_sizes(self) -> dict[str, int]:
        """File name -> size of every file directly under the location, fresh from the store."""

        found: dict[str, int] = self._retry(f"list {self.url}", lambda: list_file_sizes(self.fs, self.root))
        return {posixpath.basename(path): size for path, size in found.items()}

    def location_problem(self) -> str | None:
        """Why nothing at this URL can be an output location (it does not exist, or it is a file),
        or None. For read-only commands, which must say so rather than create anything."""
        if self._retry(f"check {self.url}", lambda: self.fs.isfile(self.root)):
            return "it is a file, not an output location (a directory or prefix)"
        if not self._retry(f"check {self.url}", lambda: self.fs.exists(self.root)):
            return "nothing is there, no job output at that location (it does not exist)"
        return None

    def foreign_entries(self) -> list[str]:
        """Names of the visible files and folders directly under the location that this protocol
        did not write (its own names are part files, or start with `_` or `.`): a dataset reader of
        the folder would read them beside the job's rows."""
        self.fs.invalidate_cache(self.root)

        def entries() -> list[str]:
            try:
                return [posixpath.basename(str(e).rstrip("/")) for e in self.fs.ls(self.root, detail=False)]
            except FileNotFoundError:
                return []

        names: list[str] = self._retry(f"list {self.url}", entries)
        return sorted(n for n in names if n and not n.startswith(("_", ".")) and not is_part_name(n))

    def has_protocol_files(self) -> bool:
        """True when the location holds markers, parts or `_SUCCESS` (whatever `_job.json` says)."""
        if self._marker_names():
            return True
        return any(is_part_name(n := posixpath.basename(p)) or n == SUCCESS_FILE for p in self._listing())

    def delete_success(self) -> None:
        self._delete(self._path(SUCCESS_FILE))

    def read_success(self) -> dict[str, Any] | None:
        return self._read_json(self._path(SUCCESS_FILE), FIX_SUCCESS)

    def success_problems(
        self, success: dict[str, Any], markers: dict[int, dict[str, Any]] | None = None
    ) -> list[str]:
        """What is wrong between `_SUCCESS`, `_job.json` and the markers (empty when they agree);
        `markers` (from `committed`) saves reading them again."""
        job = self.read_job()
        if job is None:
            return [f"{JOB_FILE} is missing"]
        if success.get("generation") != job.get("generation"):
            return [
                f"_SUCCESS belongs to job generation {success.get('generation')!r}, but {JOB_FILE} holds "
                f"{job.get('generation')!r} (the job was started over since)"
            ]
        self.use_generation(str(job.get("generation")))
        markers = self.committed() if markers is None else markers
        return success_problems(success, markers, len(job.get("splits", [])))

    def read_committed_table(self, verify: bool = True) -> pa.Table:
        """The committed parts concatenated in split order. With `verify`, `_SUCCESS` (when present)
        must agree with the markers, and each part's hash and row count with its marker."""
        if verify:
            success = self.read_success()
            if success is not None:
                problems = self.success_problems(success)
                if problems:
                    raise CorruptOutputError(
                        f"{self.url}: _SUCCESS does not match the commit markers: {'; '.join(problems)}; "
                        "run the job again to repair the output"
                    )
        tables = []
        for marker in self.committed().values():
            path = self._path(marker["part"])
            data = self._retry(
                f"read {full_url(self.fs, path)}", lambda p=path: read_bytes_or_none(self.fs, p)
            )
            if data is None:
                raise CorruptOutputError(
                    f"{self.url}: the marker of split {marker['split']} names {marker['part']}, which is "
                    "missing; run the job again to recompute that split"
                )
            if verify and hashlib.sha256(data).hexdigest() != marker["sha256"]:
                raise CorruptOutputError(
                    f"{full_url(self.fs, path)} does not match the sha256 its commit marker records; the "
                    f"file was changed after commit; {_FIX_CHANGED_PART}"
                )
            table = pq.read_table(io.BytesIO(data))
            if verify and table.num_rows != marker["rows"]:
                raise CorruptOutputError(
                    f"{full_url(self.fs, path)} has {table.num_rows} rows, marker says {marker['rows']}; "
                    f"{_FIX_CHANGED_PART}"
                )
            tables.append(table)
        if not tables:
            return output_schema().empty_table()
        return pa.concat_tables(tables)

    def clear(self, keep_job: bool = False) -> None:
        """Delete everything this protocol wrote, for a start-over. `_SUCCESS` goes first (nobody may
        trust a half-cleared output), then markers and parts; `_job.json` last, or not at all with
        `keep_job` (a start-over has already written the new generation's there)."""
        # A `.tmp-*` file in `_commits/` is a marker another run is creating right now: deleting it
        # would fail that run with a missing file instead of the fence's clear refusal. Old ones are
        # left to `_remove_stale_temporaries`.
        directory = self._path(COMMITS_DIR)
        listed = self._retry(f"list {full_url(self.fs, directory)}", lambda: list_files(self.fs, directory))
        commits = [p for p in listed if not posixpath.basename(p).startswith(".tmp-")]
        for path in [self._path(SUCCESS_FILE), *commits]:
            self._delete(path)
        for path in self._listing():
            if is_part_name(posixpath.basename(path)):
                self._delete(path)
        if not keep_job:
            self._delete(self._path(JOB_FILE))
