"""Turning `input.path` (a file, a directory or a glob, on any fsspec filesystem) into a sorted file list.

The order is the sort order of the full paths, never the order a store happens to list them in:
a split's `file_index` and the derived row ids (`"{file_index}:{row_index}"`) depend on it.
Files whose name starts with `_` or `.` (`_SUCCESS`, `.crc`, temporary files), and everything under
a folder so named (`_temporary/`, `.spark-staging/`), are skipped, as Spark and Hive do: in a
directory, and among the matches of a glob (`dir/**/*.parquet` must not read a failed writer's
`_temporary/` copies of the same rows). A glob keeps such a name only where it asks for it itself,
with a segment that starts with the same character (`dir/_part*.parquet`).
"""

from __future__ import annotations

import fnmatch
import posixpath

from fsspec import AbstractFileSystem

from shardinfer.errors import ConfigError, InputMissingError, InputSchemaError
from shardinfer.readers.spec import InputSpec
from shardinfer.storage import RetryPolicy, filesystem, full_url, with_retries

PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")

_RETRY = RetryPolicy()


def _strip_compression(name: str) -> str:
    for suffix in COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def without_query(path: str) -> str:
    """An http(s) URL without its query: a signed URL (`...data.jsonl?X-Amz-Signature=...`) ends in
    its signature, and its `?` starts that query, not a glob."""
    if path.lower().startswith(("http://", "https://")):
        return path.split("?", 1)[0]
    return path


def format_of(path: str) -> str | None:
    """'parquet' or 'jsonl' by extension (a JSONL file may also end in .gz/.bz2/.xz/.zst), else None."""
    name = without_query(path).lower()
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if _strip_compression(name).endswith(JSONL_SUFFIXES):
        return "jsonl"
    return None


def resolve_format(path: str, declared: str) -> str:
    """The format to read `path` with: the declared one, or (for "auto") the one its extension implies."""
    if declared != "auto":
        return declared
    detected = format_of(path)
    if detected is None:
        raise InputSchemaError(
            f"cannot tell the format of {path!r} from its extension; name it *.parquet or *.jsonl, "
            'or set input.format = "parquet" | "jsonl"'
        )
    return detected


def is_compressed(path: str) -> bool:
    return without_query(path).lower().endswith(COMPRESSION_SUFFIXES)


def _has_glob(path: str) -> bool:
    return any(ch in without_query(path) for ch in "*?[")


def _visible(path: str) -> bool:
    return not posixpath.basename(path).startswith(("_", "."))


def _glob_root(pattern: str) -> str:
    """The leading segments of a glob that hold no wildcard: what every match starts with."""
    segments = pattern.split("/")
    for i, segment in enumerate(segments):
        if _has_glob(segment):
            return "/".join(segments[:i])
    return pattern


def _glob_keeps(path: str, pattern: str) -> bool:
    """Whether a match of `pattern` is free of hidden names below the glob's root, except those
    the pattern names itself with a segment starting `_` or `.`."""
    root = _glob_root(pattern)
    asked = [s for s in pattern[len(root) :].split("/") if s.startswith(("_", "."))]
    below = path[len(root) :] if path.startswith(root) else path
    return all(
        _visible(part) or any(fnmatch.fnmatchcase(part, segment) for segment in asked)
        for part in below.strip("/").split("/")
    )


def _is_pattern(fs: AbstractFileSystem, path: str, spec: InputSpec) -> bool:
    """Whether `path` is a glob: it has a wildcard character and names nothing as it is written
    (a folder may be called `run[2]`, which as a pattern would match `run2` instead)."""
    if not _has_glob(path):
        return False
    return not with_retries(_RETRY, f"stat {spec.path}", lambda: fs.exists(path))


def _files_under(
    fs: AbstractFileSystem, path: str, spec: InputSpec, pattern: bool
) -> tuple[list[str], list[str]]:
    """(the input's files, directories a glob matched instead of files)."""
    if pattern:
        found = with_retries(_RETRY, f"list {spec.path}", lambda: fs.glob(path, detail=True))
        kept = {p: info for p, info in found.items() if _glob_keeps(p, path)}
        files = [p for p, info in kept.items() if info.get("type") == "file"]
        return files, [p for p, info in kept.items() if info.get("type") == "directory"]
    if with_retries(_RETRY, f"stat {spec.path}", lambda: fs.isdir(path)):
        found = with_retries(_RETRY, f"list {spec.path}", lambda: fs.find(path))
        root = path.rstrip("/") + "/"
        # Skip hidden names at every level below the given directory (e.g. `_temporary/`).
        return [p for p in found if all(_visible(part) for part in p[len(root) :].split("/"))], []
    if with_retries(_RETRY, f"stat {spec.path}", lambda: fs.isfile(path)):
        return [path], []
    raise InputMissingError(
        f"input.path {spec.path!r} does not exist; check the path (and the storage credentials "
        "or endpoint for object stores)"
    )


def _nothing_matched(spec: InputSpec, candidates: list[str], directories: list[str]) -> InputMissingError:
    what = spec.format if spec.format != "auto" else "Parquet or JSONL"
    if not candidates and directories:
        # A glob such as `prompts/ds=*` names folders; their files are one more level down.
        shown = ", ".join(sorted(directories)[:5])
        return InputMissingError(
            f"input.path {spec.path!r} matches only directories ({shown}), no {what} file; to read the "
            "files inside them, end the glob with '/*.parquet' (or '/**/*.parquet' for every level below)"
        )
    seen = ", ".join(sorted(candidates)[:5]) or "no files at all"
    return InputMissingError(
        f"input.path {spec.path!r} matches no {what} file (found: {seen}); check the path, the glob or input.format"
    )


def list_input_files(spec: InputSpec) -> list[str]:
    """The input files as full fsspec URLs, sorted; InputMissingError when nothing matches."""
    fs, path = filesystem(spec.path, spec.storage_options)
    fs.invalidate_cache()  # a listing cached earlier in this process may predate new files
    pattern = _is_pattern(fs, path, spec)
    candidates, directories = _files_under(fs, path, spec, pattern)
    explicit_file = not pattern and candidates == [path]
    if explicit_file:
        chosen = candidates
    elif spec.format == "auto":
        chosen = [p for p in candidates if format_of(p) is not None]
        formats = sorted({format_of(p) for p in chosen}, key=str)
        if len(formats) > 1:  # the spec's to fix (input.path or input.format), not the data's
            raise ConfigError(
                f"input.path {spec.path!r} holds both Parquet and JSONL files; point it at one format "
                "(a glob such as '*.parquet') or set input.format"
            )
    else:
        # A glob names its files itself; a directory is filtered by the declared format's extensions.
        chosen = candidates if pattern else [p for p in candidates if format_of(p) == spec.format]
    if not chosen:
        raise _nothing_matched(spec, candidates, directories)
    return [full_url(fs, p) for p in sorted(chosen)]
