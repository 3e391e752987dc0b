"""Inputs that real data sometimes holds and well-behaved writers never produce, for tests.

Parquet writers do not check that a string column is UTF-8, so files with invalid bytes exist in
the wild (written from C, from a binary column cast without checks); pyarrow only builds them
when asked through the raw buffers, as here.
"""

from __future__ import annotations

import pyarrow as pa


def raw_string_array(values: list[bytes | None]) -> pa.Array:
    """A string array holding exactly these bytes (invalid UTF-8 included; None is null)."""
    offsets = [0]
    for value in values:
        offsets.append(offsets[-1] + len(value or b""))
    validity = pa.array([v is not None for v in values], type=pa.bool_())
    return pa.Array.from_buffers(
        pa.string(),
        len(values),
        [
            validity.buffers()[1],
            pa.array(offsets, type=pa.int32()).buffers()[1],
            pa.py_buffer(b"".join(v or b"" for v in values)),
        ],
    )


def deeply_nested_json(depth: int) -> str:
    """A JSON array nested `depth` levels: past the interpreter's recursion limit for large depths."""
    return "[" * depth + "]" * depth
