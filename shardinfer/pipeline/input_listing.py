"""The input as planned: every file's name, size and version (ETag, else modification time).

Stored in `_job.json` when the job is planned and compared on every later run, resumed or
finished: split `k` means "rows a..b of file f", which is only true while file f is the file that
was planned. A file added, removed or rewritten since is named, and the run refuses (exit 78)
unless the job starts over or runs in `job.incremental` mode (new files only).

A local file's version is its modification time, which a copy or a fresh download changes
without changing a byte: a job resumed on another machine, or on input fetched again, would be
refused. So the stored listing also holds each local file's content digest (sha256, computed once
when the plan is written), and a local file whose time moved but whose size and digest did not is
the same file. An object store's ETag already follows the content; its objects are not read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from shardinfer.redaction import location_identity, redact_url
from shardinfer.storage import RetryPolicy, filesystem, sha256_of, with_retries

_RETRY = RetryPolicy()


def file_version(info: dict[str, Any]) -> str:
    """What changes when a file is rewritten: the ETag on object stores, else the mtime."""
    for key in ("ETag", "etag", "md5Hash", "generation"):
        if info.get(key):
            return f"{key}:{str(info[key]).strip(chr(34))}"
    for key in ("mtime", "LastModified", "last_modified", "created"):
        if info.get(key) is not None:
            return f"{key}:{info[key]}"
    return "unknown"


def snapshot(files: list[str], storage_options: dict[str, Any]) -> list[dict[str, Any]]:
    """[{path, size, version}] for the given input URLs, in their order. Each path is stored in its
    identity form (redaction.location_identity): without credentials, which a rotation changes."""
    out = []
    for url in files:
        fs, path = filesystem(url, storage_options)
        fs.invalidate_cache(path)
        info: dict[str, Any] = with_retries(_RETRY, f"stat {redact_url(url)}", partial(fs.info, path))
        out.append(
            {
                "path": location_identity(url),
                "size": int(info.get("size") or 0),
                "version": file_version(info),
            }
        )
    return out


@dataclass(frozen=True)
class ListingDiff:
    added: list[str]
    removed: list[str]
    changed: list[str]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def describe(self, limit: int = 5) -> str:
        parts = []
        for what, names in (("added", self.added), ("removed", self.removed), ("changed", self.changed)):
            if names:
                more = f" and {len(names) - limit} more" if len(names) > limit else ""
                parts.append(f"{what}: {', '.join(names[:limit])}{more}")
        return "; ".join(parts)


def content_digest(path: str) -> str | None:
    """A local file's sha256, as "sha256:<hex>"; None for a file on another store (never read)."""
    fs, local = filesystem(path, {})
    if not _is_local(fs):
        return None
    with fs.open(local, "rb") as f:
        return "sha256:" + sha256_of(f)


def _is_local(fs: Any) -> bool:
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    return bool(protocols & {"file", "local"})


def with_content_digests(
    listing: list[dict[str, Any]],
    previous: list[dict[str, Any]] | None = None,
    digest: Callable[[str], str | None] = content_digest,
) -> list[dict[str, Any]]:
    """`listing` with each local file's content digest, as stored in `_job.json`. A file that
    `previous` (the stored listing) holds at the same size and version keeps its digest there
    instead of being read again."""
    known = {location_identity(f["path"]): f for f in previous or [] if f.get("digest") is not None}
    out = []
    for entry in listing:
        if entry.get("digest") is not None:
            out.append(entry)
            continue
        before = known.get(location_identity(entry["path"]))
        same = before is not None and (before["size"], before["version"]) == (entry["size"], entry["version"])
        found = before["digest"] if same and before is not None else digest(entry["path"])
        out.append({**entry, "digest": found} if found is not None else entry)
    return out


def diff_listings(
    old: list[dict[str, Any]],
    new: list[dict[str, Any]],
    digest: Callable[[str], str | None] = content_digest,
) -> ListingDiff:
    """What was added, removed and rewritten between the stored listing `old` and `new`. A file
    whose version moved at the same size is read (`digest`) only when `old` holds its digest."""
    # By identity on both sides: a listing stored by an older version may name a URL with its
    # credentials, which are no part of what the file is.
    before = {location_identity(f["path"]): f for f in old}
    after = {location_identity(f["path"]): f for f in new}

    def rewritten(p: str) -> bool:
        was, now = before[p], after[p]
        if was["size"] != now["size"]:
            return True
        if was["version"] == now["version"]:
            return False
        return was.get("digest") is None or digest(now["path"]) != was["digest"]

    changed = [p for p in sorted(set(before) & set(after)) if rewritten(p)]
    return ListingDiff(
        added=sorted(set(after) - set(before)), removed=sorted(set(before) - set(after)), changed=changed
    )
