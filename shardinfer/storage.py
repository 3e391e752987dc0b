"""fsspec access shared by readers and writers: opening a URL, bounded retries, create-if-absent.

Object stores fail transiently (throttling, 5xx, dropped connections). s3fs and botocore already
retry a few times inside one call; this module adds one outer, bounded layer with exponential
backoff so a job survives a longer blip, and then gives up with a `StorageError` (exit code 75,
"retry later"). Errors that retrying cannot fix (a missing file, a denied
permission, a marker that already exists) are re-raised at once.

Create-if-absent (`create_exclusive`) is the primitive the commit protocol rests on:
  - local disk: the content is written to a private temporary file which is then hard-linked to the
    target; `link(2)` fails with EEXIST when the target exists, so the file appears atomically and
    complete (a crash never leaves an empty marker). Without hard links, `O_EXCL` is used instead.
  - `memory://`: the file object is built first and published with `dict.setdefault` on the
    filesystem's store, which is atomic under the interpreter lock.
  - anything else (s3://): `fs.open(path, "xb")`. s3fs sends `If-None-Match: *` on PutObject and
    CompleteMultipartUpload, and maps the server's 412 to FileExistsError.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, TypeVar

import fsspec
from fsspec import AbstractFileSystem

from shardinfer.errors import ConfigError, StorageError

T = TypeVar("T")


# Errors a retry cannot fix. FileExistsError matters most: it is how a lost commit race surfaces.
_PERMANENT = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)
_TRANSIENT_ERRNOS = {
    errno.EBUSY,  # s3fs: 503 SlowDown / ServiceUnavailable, 409 ConditionalRequestConflict
    errno.EIO,  # s3fs: an S3 error code it does not know (502, 504, ...)
    getattr(errno, "EREMOTEIO", errno.EIO),  # s3fs: 500 InternalError
    errno.EAGAIN,
    errno.ETIMEDOUT,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ECONNREFUSED,
    errno.EPIPE,
    errno.ENETUNREACH,
    errno.EHOSTUNREACH,
}
_TRANSIENT_S3_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "RequestTimeout",
    "InternalError",
    "ServiceUnavailable",
    "ConditionalRequestConflict",
    "500",
    "502",
    "503",
    "504",
}


def _network_error_types() -> tuple[type[BaseException], ...]:
    """Exception types of the HTTP stack under s3fs that mean 'the connection failed'.

    Looked up by name, one at a time, because the set differs between botocore releases, and only
    in modules already imported: an exception of a type whose module was never imported cannot
    exist, and importing botocore and aiohttp here would cost every job their import time.
    """
    found: list[type[BaseException]] = []
    boto = sys.modules.get("botocore.exceptions")
    for name in ("ConnectionError", "HTTPClientError", "IncompleteReadError"):
        kind = getattr(boto, name, None)
        if isinstance(kind, type) and issubclass(kind, BaseException):
            found.append(kind)
    # ResponseParserError: throttled responses can arrive as invalid XML (s3fs retries those too).
    for module, name in (("botocore.parsers", "ResponseParserError"), ("aiohttp", "ClientError")):
        kind = getattr(sys.modules.get(module), name, None)
        if isinstance(kind, type) and issubclass(kind, BaseException):
            found.append(kind)
    return tuple(found)


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: throttling, 5xx, timeouts, dropped or refused connections."""
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    network_errors = _network_error_types()
    if network_errors and isinstance(exc, network_errors):
        return True
    response = getattr(exc, "response", None)  # a botocore ClientError that escaped translation
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", ""))
        return code in _TRANSIENT_S3_CODES
    if isinstance(exc, OSError):
        return exc.errno in _TRANSIENT_ERRNOS
    return False


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a transient storage failure.

    The delay before retry k (1-based) is `min(max_delay, base_delay * 2**(k-1))`, scaled by a random
    factor in [0.5, 1] so that many workers throttled together do not retry in lockstep.
    """

    attempts: int = 6
    base_delay: float = 0.2
    max_delay: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts={self.attempts}: must be at least 1 (1 = no retry)")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError(f"RetryPolicy delays must be >= 0, got {self.base_delay}, {self.max_delay}")

    def delay(self, retry_number: int) -> float:
        raw = min(self.max_delay, self.base_delay * 2 ** (retry_number - 1))
        return raw * (0.5 + 0.5 * random.random())


def with_retries(policy: RetryPolicy, what: str, fn: Callable[[], T]) -> T:
    """Call `fn`, retrying transient failures per `policy`; raise StorageError once they are exhausted.

    `what` names the operation and path for the error message ("write s3://b/out/part-00001-a.parquet").
    """
    for attempt in range(1, policy.attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc):
                raise
            if attempt == policy.attempts:
                raise StorageError(
                    errno.EAGAIN,
                    f"{what}: still failing after {policy.attempts} attempts ({type(exc).__name__}: {exc}); "
                    "the storage service is unavailable or throttling; re-run the job later "
                    "(committed splits are kept)",
                ) from exc
            time.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")  # the loop always returns or raises


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem for `url` and the path within it (protocol stripped).

    A protocol fsspec does not know, a likely typo of one (`s3:/bucket`, which fsspec reads as a
    local folder named `s3:`) and a store whose package is not installed are ConfigErrors naming
    the URL, not a ValueError or ImportError from deep inside fsspec."""
    _check_protocol(url)
    try:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as exc:
        raise ConfigError(f"{url!r}: this store needs a package that is not installed ({exc})") from None
    return fs, path


# Protocols LocalFileSystem strips itself, with one slash as with two (`file:/tmp/x` is /tmp/x).
_LOCAL_PREFIXES = {"file", "local"}


def _check_protocol(url: str) -> None:
    if "::" in url:
        return  # a chained URL (`simplecache::s3://...`): fsspec resolves each link itself
    known = set(fsspec.available_protocols())
    scheme, sep, rest = url.partition("://")
    if sep and "/" not in scheme:
        if scheme not in known:
            hint = f"; protocols are lower case: {scheme.lower()}://{rest}" if scheme.lower() in known else ""
            raise ConfigError(
                f"{url!r}: unknown storage protocol {scheme!r}{hint} (s3://, file://, memory://, "
                "http(s):// and the other fsspec protocols are understood)"
            )
        return
    first = url.split("/", 1)[0]
    if first.endswith(":") and first[:-1] in known - _LOCAL_PREFIXES:
        fixed = f"{first[:-1]}://{url[len(first) :].lstrip('/')}"
        raise ConfigError(
            f"{url!r} would be a local path under a folder named {first!r}: did you mean {fixed!r}? "
            f"(for a local folder of that name, write ./{url})"
        )


def is_local(fs: AbstractFileSystem) -> bool:
    return "file" in _protocols(fs)


def is_memory(fs: AbstractFileSystem) -> bool:
    return "memory" in _protocols(fs)


def _protocols(fs: AbstractFileSystem) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def full_url(fs: AbstractFileSystem, path: str) -> str:
    """A URL that `filesystem()` maps back to `path` on `fs` (local paths stay plain paths, with `..`
    resolved: `in/../x` and `x` name one file, in a listing as in a fingerprint)."""
    if is_local(fs):
        return os.path.normpath(path)
    return str(fs.unstrip_protocol(path))


def put_bytes(fs: AbstractFileSystem, path: str, data: bytes) -> None:
    """Write (or overwrite) a whole file so that readers see the old content or the new, never a part.

    On local disk: a fsynced temporary file renamed over the target (a kill mid-write leaves no
    truncated `_SUCCESS`). On object stores a PUT is already all-or-nothing; memory:// publishes a
    complete file object.
    """
    if is_local(fs):
        tmp = _write_temp(path, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return
    fs.pipe_file(path, data)


class FileInTheWayError(NotADirectoryError):
    """A local write needs a folder where a file is (the folder itself, or one above it)."""


def _make_folder(directory: str) -> None:
    try:
        os.makedirs(directory, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        # Never a FileExistsError: to a create-if-absent caller that means "someone created this
        # name first" (a lost commit race), not "a file stands where the folder must be".
        raise FileInTheWayError(
            errno.ENOTDIR, f"{directory} (or a folder above it) is a file, not a folder", directory
        ) from exc


def _write_temp(path: str, data: bytes) -> str:
    """A fsynced private temporary file holding `data`, next to local `path` (its directory is
    created); the caller moves or links it into place. A failed write leaves no temporary file."""
    directory = os.path.dirname(path) or "."
    _make_folder(directory)
    tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return tmp


def create_exclusive(fs: AbstractFileSystem, path: str, data: bytes) -> None:
    """Create `path` holding `data` only if it does not exist; raise FileExistsError if it does."""
    if is_local(fs):
        _create_exclusive_local(path, data)
    elif is_memory(fs):
        _create_exclusive_memory(fs, path, data)
    else:
        with fs.open(path, "xb") as f:
            f.write(data)


def _create_exclusive_local(path: str, data: bytes) -> None:
    directory = os.path.dirname(path) or "."
    tmp = _write_temp(path, data)
    try:
        os.link(tmp, path)  # atomic, fails with EEXIST; the marker is never seen half written
    except OSError as exc:  # FileExistsError (EEXIST) is not in the list below: re-raised as is
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
            raise
        # No hard links here (some network or FUSE filesystems): O_EXCL still decides the race.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    finally:
        os.unlink(tmp)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the new directory entry durable, not just the bytes
    finally:
        os.close(dir_fd)


def _create_exclusive_memory(fs: AbstractFileSystem, path: str, data: bytes) -> None:
    from fsspec.implementations.memory import MemoryFile

    key = fs._strip_protocol(path)
    f = MemoryFile(fs, key, data)
    # fsspec's own "xb" checks then writes (and publishes an empty file first); setdefault is one
    # atomic step, so of two racing threads exactly one publishes its object.
    if fs.store.setdefault(key, f) is not f:  # type: ignore[attr-defined]
        raise FileExistsError(path)


def delete_if_present(fs: AbstractFileSystem, path: str) -> bool:
    """Delete one file; False (not an error) if it was already gone, so deletes can be retried."""
    try:
        fs.rm_file(path)
    except FileNotFoundError:
        return False
    return True


def read_bytes_or_none(fs: AbstractFileSystem, path: str) -> bytes | None:
    try:
        return bytes(fs.cat_file(path))
    except FileNotFoundError:
        return None


def list_files(fs: AbstractFileSystem, directory: str) -> list[str]:
    """Names (paths) of the files directly under `directory`, fresh from the store (no listing cache)."""
    return sorted(list_file_sizes(fs, directory))


def list_file_sizes(fs: AbstractFileSystem, directory: str) -> dict[str, int]:
    """Path -> size in bytes of each file directly under `directory`, from one fresh listing."""
    fs.invalidate_cache(directory)
    try:
        entries = fs.ls(directory, detail=True)
    except FileNotFoundError:
        return {}
    return {e["name"]: int(e.get("size") or 0) for e in entries if e.get("type") == "file"}


def sha256_of(f: IO[bytes]) -> str:
    """The hex sha256 of what is left to read in the open binary file `f`, read in chunks."""
    digest = hashlib.sha256()
    while chunk := f.read(16 << 20):
        digest.update(chunk)
    return digest.hexdigest()
