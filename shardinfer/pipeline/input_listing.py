"""The input as planned: every file's name, size and version (ETag, else modification time).

Stored in `_job.json` when the job is planned and compared on every later run, resumed or
finished: split `k` means "rows a..b of file f", which is only true while file f is the file that
was planned. A file added, removed or rewritten since is named, and the run refuses (exit 78)
unless the job starts over or runs in `job.incremental` mode (new files only).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from shardinfer.redaction import location_identity, redact_url
from shardinfer.storage import RetryPolicy, filesystem, with_retries

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


def diff_listings(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> ListingDiff:
    # By identity on both sides: a listing stored by an older version may name a URL with its
    # credentials, which are no part of what the file is.
    before = {location_identity(f["path"]): f for f in old}
    after = {location_identity(f["path"]): f for f in new}
    changed = [
        p
        for p in sorted(set(before) & set(after))
        if (before[p]["size"], before[p]["version"]) != (after[p]["size"], after[p]["version"])
    ]
    return ListingDiff(
        added=sorted(set(after) - set(before)), removed=sorted(set(before) - set(after)), changed=changed
    )
