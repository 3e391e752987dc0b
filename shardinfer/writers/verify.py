"""Checking a committed part against its marker before `_SUCCESS` blesses it.

The marker records the part's size, sha256 and md5 as written. What each store checks:

    local disk   size from stat, then the file read back and its sha256 compared
    s3://        size and ETag from one HEAD; an ETag equal to the marker's md5 (a plain
                 single-part upload) proves the content; any other ETag (a multipart upload's,
                 with a '-', or one of an object encrypted with SSE-KMS or SSE-C, which is not
                 an MD5 of the content) proves nothing, so the part is read back and its
                 sha256 compared
    anything     the file read back: size and sha256 compared
    else

A part that fails is *damaged*; the reason says how (missing, size, content), for the message
and for the run record.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from fsspec import AbstractFileSystem

from shardinfer.storage import is_local

_CHUNK = 1 << 22


def _protocols(fs: AbstractFileSystem) -> set[str]:
    proto = fs.protocol
    return {proto} if isinstance(proto, str) else set(proto)


def part_damage(fs: AbstractFileSystem, path: str, marker: dict[str, Any]) -> str | None:
    """Why the part at `path` does not match `marker`, or None when it does."""
    want_bytes = int(marker.get("bytes", -1))
    if is_local(fs):
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            return "its part file is missing"
        if size != want_bytes:
            return f"its part file has {size} bytes, the marker records {want_bytes} (truncated or replaced)"
        return _read_back(fs, path, marker)
    if _protocols(fs) & {"s3", "s3a"}:
        fs.invalidate_cache(path)
        try:
            info = fs.info(path)
        except FileNotFoundError:
            return "its part file is missing"
        if int(info.get("size", -1)) != want_bytes:
            return (
                f"its part file has {info.get('size')} bytes, the marker records {want_bytes} "
                "(truncated or replaced)"
            )
        if _etag_is_marker_md5(info, marker):
            return None
        # Any other ETag proves nothing either way: a multipart upload's is not a content hash, and
        # neither is that of an object encrypted with SSE-KMS or SSE-C (a bucket's default
        # encryption), which would otherwise fail every part of a correct job on every run.
    return _read_back(fs, path, marker)


def _etag_is_marker_md5(info: dict[str, Any], marker: dict[str, Any]) -> bool:
    """True when the object's ETag equals the MD5 the marker recorded: the content is the committed
    one (an MD5 collision would take a deliberate forgery). False says nothing about the content."""
    etag = str(info.get("ETag", "")).strip('"').lower()
    md5 = str(marker.get("md5") or "").lower()
    return bool(md5) and etag == md5


def _read_back(fs: AbstractFileSystem, path: str, marker: dict[str, Any]) -> str | None:
    """Size and sha256 of the part read back in chunks: memory stays bounded by one chunk."""
    digest = hashlib.sha256()
    size = 0
    try:
        with fs.open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
    except FileNotFoundError:
        return "its part file is missing"
    if size != int(marker.get("bytes", -1)):
        return f"its part file has {size} bytes, the marker records {marker.get('bytes')} (truncated or replaced)"
    if digest.hexdigest() != marker.get("sha256"):
        return "its part file's sha256 differs from what was committed (replaced)"
    return None
