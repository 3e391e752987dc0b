"""The output Arrow schema: one row per (input row, sample), success and failure in one shape.

An explicit schema (rather than one inferred from the first batch) keeps every part file of a job
identical even when a part holds only error rows, whose generation columns are all null.
Logprobs are parallel list columns (the CSR layout Arrow list offsets give for free):
`token_ids[i]` was sampled with `token_logprobs[i]`; the optional top-k columns hold, per
generated position, k ids and k logprobs; `prompt_logprobs[0]` is null (the first prompt token
has no context to be predicted from).
"""

from __future__ import annotations

import pyarrow as pa

OUTPUT_SCHEMA_VERSION = 1
SCHEMA_VERSION_KEY = b"shardinfer.output_schema_version"

_BASE_FIELDS = [
    pa.field("row_id", pa.string(), nullable=False),
    pa.field("sample_index", pa.int32(), nullable=False),
    pa.field("status", pa.string(), nullable=False),
    pa.field("error_code", pa.string()),
    pa.field("error_message", pa.string()),
    pa.field("text", pa.string()),
    pa.field("token_ids", pa.list_(pa.int32())),
    pa.field("token_logprobs", pa.list_(pa.float32())),
    pa.field("finish_reason", pa.string()),
    pa.field("prompt_tokens", pa.int32()),
    pa.field("completion_tokens", pa.int32()),
    pa.field("seed", pa.int64()),
]
_TOP_FIELDS = [
    pa.field("top_token_ids", pa.list_(pa.list_(pa.int32()))),
    pa.field("top_logprobs", pa.list_(pa.list_(pa.float32()))),
]
_PROMPT_FIELD = pa.field("prompt_logprobs", pa.list_(pa.float32()))

BASE_COLUMNS = tuple(f.name for f in _BASE_FIELDS)
OPTIONAL_COLUMNS = tuple(f.name for f in [*_TOP_FIELDS, _PROMPT_FIELD])
RESERVED_COLUMNS = frozenset(BASE_COLUMNS + OPTIONAL_COLUMNS)


def output_schema(
    passthrough: pa.Schema | None = None, top_logprobs: bool = False, prompt_logprobs: bool = False
) -> pa.Schema:
    """The output schema: the fixed columns, the optional logprob columns asked for, then passthrough.

    `passthrough` holds the input columns copied to the output by name; one that collides with an
    output column (or starts with `__`, the reader's private prefix) is refused.
    """
    fields = list(_BASE_FIELDS)
    if top_logprobs:
        fields += _TOP_FIELDS
    if prompt_logprobs:
        fields.append(_PROMPT_FIELD)
    if passthrough is not None:
        for f in passthrough:
            if f.name in RESERVED_COLUMNS:
                raise ValueError(
                    f"input column {f.name!r} has the name of an output column; rename it in input.query "
                    f"(e.g. SELECT {f.name} AS input_{f.name}, ...) or leave it out of the passthrough columns"
                )
            if f.name.startswith("__"):
                raise ValueError(
                    f"input column {f.name!r}: names starting with '__' are internal to the reader and "
                    "are not passed through; rename the column"
                )
        if len(set(passthrough.names)) != len(passthrough.names):
            raise ValueError(f"passthrough columns {passthrough.names} repeat a name; each must be unique")
        fields += list(passthrough)
    return pa.schema(fields, metadata={SCHEMA_VERSION_KEY: str(OUTPUT_SCHEMA_VERSION).encode()})
