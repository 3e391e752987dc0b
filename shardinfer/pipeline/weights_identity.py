"""Identifying weight files by their content, cheaply.

Hashing multi-GB safetensors on every start is too slow, and a name plus a size says nothing
about the values (a file rewritten in place at the same size, another directory with the same
names and sizes). So each file is identified by:

    "stat"   (default)  its size, the sha256 of its safetensors header (names, dtypes, shapes,
                        offsets) and its modification time: any rewrite changes the time
    "sha256"            its size and the sha256 of its whole content, computed once and cached
                        (keyed by path, size and modification time) in the user's cache directory

"sha256" is what to use when the same weights are copied to several places (a copy changes the
modification time, so under "stat" a copied model counts as another model).

Which files are the weights is the loader's rule (`shardinfer.engine.models.checkpoint_layout`);
`checkpoint_file_names` applies it with the job's errors.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import struct
import uuid
from collections.abc import Collection
from pathlib import Path

from shardinfer.engine.models.checkpoint_layout import LayoutError, weight_file_names
from shardinfer.errors import ConfigError
from shardinfer.storage import sha256_of

VERIFY_MODES = ("stat", "sha256")
_HEADER_LIMIT = 100 * 1024 * 1024  # safetensors refuses larger headers too


# Weight formats the engine never loads (pickles, other frameworks): never worth copying.
UNLOADED_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx")


def checkpoint_file_names(names: Collection[str], index_text: bytes | None, where: str) -> list[str]:
    """The weight files the loader reads from a folder holding `names` (file names, no folders), in
    its order (checkpoint_layout); a ConfigError naming `where` (the model.path as given) when the
    index is not one, names absent shards, or there are no weights."""
    try:
        return weight_file_names(names, index_text)
    except LayoutError as exc:
        raise ConfigError(f"model.path={where!r}: {exc}") from None


def listed_checksum(info: dict[str, object]) -> str:
    """What an object-store listing says of a file's content ("" when it says nothing): S3's ETag
    (a rewrite at the same size gets a new one), else the store's MD5, else its modification time."""
    checksum = (
        info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("md5") or info.get("mtime")
    )
    return str(checksum) if checksum is not None else ""


def remote_weight_identity(size: int, checksum: str) -> int | dict[str, object]:
    """A weight file on object storage as the fingerprint holds it: its size and its listed
    checksum; its size alone where the store lists none, the form every remote weight had before
    checksums were read (`checksums=False` computes that form, to resume jobs planned with it)."""
    return {"size": size, "checksum": checksum} if checksum else size


def check_verify_mode(mode: str) -> None:
    if mode not in VERIFY_MODES:
        raise ConfigError(f"model.verify_weights={mode!r}: use one of {', '.join(VERIFY_MODES)}")


def weight_identity(path: Path, mode: str) -> str:
    check_verify_mode(mode)
    stat = path.stat()
    if mode == "sha256":
        return f"{stat.st_size} bytes, sha256 {_cached_sha256(path, stat.st_size, stat.st_mtime_ns)}"
    modified = _dt.datetime.fromtimestamp(stat.st_mtime_ns / 1e9, _dt.UTC).isoformat()
    return f"{stat.st_size} bytes, header {_header_sha256(path)[:16]}, modified {modified}"


def _header_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        prefix = f.read(8)
        digest.update(prefix)
        if len(prefix) == 8:
            (length,) = struct.unpack("<Q", prefix)
            digest.update(f.read(min(length, _HEADER_LIMIT)))
    return digest.hexdigest()


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shardinfer" / "weights-sha256.json"


def _cached_sha256(path: Path, size: int, mtime_ns: int) -> str:
    key = f"{path.resolve()}|{size}|{mtime_ns}"
    cache_path = _cache_file()
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    if isinstance(cache, dict) and isinstance(cache.get(key), str):
        return str(cache[key])
    with path.open("rb") as f:
        value = sha256_of(f)
    cache = cache if isinstance(cache, dict) else {}
    cache[key] = value
    try:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_path.with_name(f".tmp-{uuid.uuid4().hex}")
        tmp.write_text(json.dumps(cache, sort_keys=True))
        os.replace(tmp, cache_path)
    except OSError:
        pass  # a read-only cache directory costs a re-hash next time, nothing else
    return value
