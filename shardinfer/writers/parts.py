"""File formats of the output location: part files (Parquet) and the small JSON records.

Kept apart from `output_store` so the protocol there reads as a protocol: this module knows how
bytes look, that one knows when they are written.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem

from shardinfer.errors import CorruptOutputError
from shardinfer.redaction import redact_strings, redact_text
from shardinfer.writers.schema import OUTPUT_SCHEMA_VERSION, SCHEMA_VERSION_KEY, base_fields_of

_ATTEMPT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PART_NAME = re.compile(r"^part-.*\.parquet$")
# Output parts are read back by people and dataset viewers: modest row groups and a page index.
ROW_GROUP_ROWS = 4096

# Part files checked or read at once by map_parts. Each check is a short chain of requests (a HEAD,
# a footer's range reads) that object storage answers after a round trip, so a job of many splits
# finishes and reports in a fraction of the serial time; a local part's read-back holds one chunk.
PART_READ_CONCURRENCY = 16

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")


@dataclass(frozen=True)
class PartInfo:
    """One written part file: what its commit marker will record."""

    split_index: int
    attempt: str
    name: str  # file name relative to the output location
    path: str  # full URL
    rows: int
    bytes: int
    sha256: str
    md5: str = ""  # what an S3 single-part upload's ETag is, so finalize can verify with a HEAD

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_attempt(attempt: str) -> None:
    if not _ATTEMPT.match(attempt):
        raise ValueError(
            f"attempt={attempt!r}: use 1-64 characters of letters, digits, '.', '_' or '-' "
            "(e.g. a random hex string), unique per attempt"
        )


def part_name(split_name: str, generation: str, attempt: str) -> str:
    return f"part-{split_name}-{generation}-{attempt}.parquet"


def is_part_name(name: str) -> bool:
    return bool(_PART_NAME.match(name))


def check_base_columns(table: pa.Table) -> None:
    """The fixed output columns must be there with their exact types (passthrough is free)."""
    for field in base_fields_of(table.schema):  # a score job's table has the score columns
        name = field.name
        index = table.schema.get_field_index(name)
        if index < 0:
            raise ValueError(
                f"output table lacks column {name!r}; build it with writers.schema.output_schema(...)"
            )
        want = field.type
        if table.schema.field(index).type != want:
            raise ValueError(
                f"output column {name!r} has type {table.schema.field(index).type}, expected {want}"
            )


def encode_part(table: pa.Table, split_name: str, attempt: str, metadata: dict[str, str]) -> bytes:
    """The Parquet bytes of one part, with the job's key-value metadata and our own keys.

    The metadata and the error messages are ours, and may quote a URL or a library's message:
    they are redacted here (redaction.redact_text); model output and passthrough columns are data.
    """
    check_base_columns(table)
    table = _redacted_error_messages(table)
    kv = dict(table.schema.metadata or {})
    kv.update({k.encode(): redact_text(str(v)).encode() for k, v in metadata.items()})
    kv[SCHEMA_VERSION_KEY] = str(OUTPUT_SCHEMA_VERSION).encode()
    kv[b"shardinfer.split"] = split_name.encode()
    kv[b"shardinfer.attempt"] = attempt.encode()
    buffer = io.BytesIO()
    pq.write_table(
        table.replace_schema_metadata(kv),
        buffer,
        compression="zstd",
        row_group_size=ROW_GROUP_ROWS,
        write_page_index=True,
    )
    return buffer.getvalue()


def _redacted_error_messages(table: pa.Table) -> pa.Table:
    index = table.schema.get_field_index("error_message")
    if index < 0:
        return table
    column = table.column(index)
    if column.null_count == len(column):
        return table
    messages = column.to_pylist()
    redacted = [redact_text(m) if m else m for m in messages]
    if redacted == messages:
        return table
    return table.set_column(index, table.schema.field(index), pa.array(redacted, pa.string()))


def json_bytes(value: dict[str, Any]) -> bytes:
    """A JSON record of the output location (`_job.json`, markers, `_SUCCESS`, run records), every
    string in it redacted: an error reason or a URL never carries a credential into the output."""
    return (json.dumps(redact_strings(value), indent=1, sort_keys=True) + "\n").encode()


# What to do about an unreadable record, by its kind: each says a step that works (a start-over
# of the same job keeps its markers, so it cannot be the fix for a damaged one).
FIX_MARKER = "delete it and run the job again: its split is computed again"
FIX_JOB_FILE = (
    "the job cannot be resumed from it: delete it and run the job again with --conf "
    "job.start_over=true (which clears the location's markers and parts), or write to a new output path"
)
FIX_SUCCESS = "delete it and run the job again: the run checks the committed parts and writes it anew"
FIX_RECORD = "delete it"


def parse_json(data: bytes, url: str, fix: str = FIX_RECORD) -> dict[str, Any]:
    """The JSON object in `data`, read from `url`; CorruptOutputError naming `url` and `fix` if it
    is not one (this program writes these records whole, so another program or a person did)."""
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise CorruptOutputError(
            f"{url} is not valid JSON ({exc}); it was not written by this program's commit protocol; {fix}"
        ) from exc
    if not isinstance(value, dict):
        raise CorruptOutputError(
            f"{url} holds a JSON {type(value).__name__}, not an object; it was not written by this "
            f"program's commit protocol; {fix}"
        )
    return value


def cat_many(fs: AbstractFileSystem, paths: list[str]) -> dict[str, bytes]:
    """Contents of many small files; missing ones are left out, other errors raised (to be retried)."""
    if not paths:
        return {}
    fetched = fs.cat(paths, on_error="return")
    out: dict[str, bytes] = {}
    for path, value in fetched.items():
        if isinstance(value, FileNotFoundError):
            continue
        if isinstance(value, BaseException):
            raise value
        out[fs._strip_protocol(path)] = bytes(value)
    return out


def map_parts(fn: Callable[[_Item], _Result], items: Sequence[_Item]) -> list[_Result]:
    """`fn` over `items` (one part file each) on up to PART_READ_CONCURRENCY threads, results in
    the items' order. The first failure in that order is raised once no call runs: the calls
    started by then end first, and those not started are dropped."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(min(PART_READ_CONCURRENCY, len(items)), thread_name_prefix="part-read") as pool:
        return list(pool.map(fn, items))
