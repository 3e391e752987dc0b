"""`model.path` as an object-storage URL: each machine copies the model once into a local cache.

A cluster then needs no shared file system. Only the files the job reads are copied (the
checkpoint the loader reads, not a stray *.safetensors or pickle beside it; see remote_listing).
The cache entry's name is a hash of those files' names, sizes and checksums (S3 ETags, or what
the filesystem reports), so a model replaced under the same URL gets a new entry instead of mixing
old and new files. A copy is made in a temporary folder beside the entry, each file's size
checked against the listing and its SHA-256 recorded in a manifest, and only then renamed into
place: a half-copied model is never used. Before each use the entry's files are checked against
the manifest's sizes (and, with `verify="full"`, its hashes), and a damaged entry is copied again.

Several workers on one machine may ask at once: a lock file lets one copy while the others wait.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from shardinfer.engine.chat_template import ADDITIONAL_TEMPLATES_DIR
from shardinfer.engine.models.checkpoint_layout import INDEX_FILE
from shardinfer.errors import ConfigError
from shardinfer.pipeline.weights_identity import (
    UNLOADED_WEIGHT_SUFFIXES,
    checkpoint_file_names,
    listed_checksum,
)
from shardinfer.redaction import redact_url
from shardinfer.storage import sha256_of

MANIFEST = ".shardinfer-model.json"
DEFAULT_CACHE = "~/.cache/shardinfer/models"


def is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def local_model_path(
    path: str, storage_options: dict[str, Any] | None = None, cache_dir: str = "", verify: str = "size"
) -> str:
    """A local directory holding the model at `path`: `path` itself when it is local."""
    if path.startswith("file://"):
        path = path.removeprefix("file://")
    if not is_url(path):
        return path
    from shardinfer.storage import filesystem

    fs, root = filesystem(path, storage_options or {})
    listing = remote_listing(fs, root, path)
    key = hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()[:24]
    cache = Path(os.path.expanduser(cache_dir or os.environ.get("SHARDINFER_MODEL_CACHE", DEFAULT_CACHE)))
    cache.mkdir(parents=True, exist_ok=True)
    entry = cache / key
    with open(cache / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one copier per machine; the others find it done
        if entry.is_dir() and verify_entry(entry, listing, full=verify == "full"):
            return str(entry)
        if entry.exists():
            shutil.rmtree(entry)
        _copy(fs, root, path, listing, entry)
    return str(entry)


def remote_listing(fs: Any, root: str, url: str) -> dict[str, dict[str, Any]]:
    """name -> {size, checksum} of the files the job reads from the model folder: the weight files
    the loader reads (as the fingerprint chooses them), every other file but weights in formats
    never loaded, and the named chat templates under additional_chat_templates/. A stray
    consolidated.safetensors or pytorch_model.bin beside the checkpoint is neither copied nor part
    of the cache entry's name."""
    files, folders = _entries(fs, root, url)
    if "config.json" not in files:
        raise ConfigError(
            f"model.path={url!r} holds no Hugging Face model (no config.json); found {sorted(files)[:10]}"
        )
    index = fs.cat_file(f"{root.rstrip('/')}/{INDEX_FILE}") if INDEX_FILE in files else None
    weights = set(checkpoint_file_names(files, index, url))
    chosen = {
        name: info
        for name, info in files.items()
        if name in weights or not name.endswith((".safetensors", *UNLOADED_WEIGHT_SUFFIXES))
    }
    if ADDITIONAL_TEMPLATES_DIR in folders:
        templates, _ = _entries(fs, f"{root.rstrip('/')}/{ADDITIONAL_TEMPLATES_DIR}", url)
        for name, info in templates.items():
            if name.endswith(".jinja"):  # what transformers reads from that folder
                chosen[f"{ADDITIONAL_TEMPLATES_DIR}/{name}"] = info
    return chosen


def _entries(fs: Any, folder: str, url: str) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """(name -> {size, checksum} of the files directly in `folder`, names of its sub-folders)."""
    try:
        infos = fs.ls(folder, detail=True)
    except FileNotFoundError:
        raise ConfigError(f"model.path={url!r} does not exist; give the URL of a model folder") from None
    files, folders = {}, set()
    for info in infos:
        name = str(info["name"]).rstrip("/").rsplit("/", 1)[-1]
        if info.get("type") == "directory":
            folders.add(name)
        if info.get("type") != "file":
            continue
        files[name] = {"size": int(info["size"]), "checksum": listed_checksum(info)}
    return files, folders


def verify_entry(entry: Path, listing: dict[str, dict[str, Any]], full: bool = False) -> bool:
    """True when every listed file is there with its size (and, if `full`, its recorded hash)."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if set(manifest.get("files", {})) != set(listing):
        return False
    for name, want in listing.items():
        local = entry / name
        if not local.is_file() or local.stat().st_size != want["size"]:
            return False
        if full and _sha256(local) != manifest["files"][name]["sha256"]:
            return False
    return True


def _copy(fs: Any, root: str, url: str, listing: dict[str, dict[str, Any]], entry: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        recorded = {}
        for name, want in sorted(listing.items()):
            digest = hashlib.sha256()
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)  # additional_chat_templates/
            with fs.open(f"{root.rstrip('/')}/{name}", "rb") as src, open(tmp / name, "wb") as dst:
                while chunk := src.read(16 << 20):
                    digest.update(chunk)
                    dst.write(chunk)
            size = (tmp / name).stat().st_size
            if size != want["size"]:
                raise ConfigError(
                    f"model.path={url!r}: {name} copied as {size} bytes, listed as {want['size']}; "
                    "the model changed while it was being copied, rerun"
                )
            recorded[name] = {**want, "sha256": digest.hexdigest()}
        (tmp / MANIFEST).write_text(
            json.dumps({"source": redact_url(url), "files": recorded}, sort_keys=True)
        )
        os.replace(tmp, entry)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return sha256_of(f)


def with_local_model(config: Any, cache_dir: str = "") -> Any:
    """A copy of a JobConfig whose model.path is a local directory (copied first if it is a URL)."""
    import dataclasses

    local = local_model_path(config.model.path, dict(config.model.storage_options), cache_dir)
    if local == config.model.path:
        return config
    return dataclasses.replace(config, model=dataclasses.replace(config.model, path=local))
