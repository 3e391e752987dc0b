"""The output Arrow schema: one row per (input row, sample), success and failure in one shape.

An explicit schema (rather than one inferred from the first batch) keeps every part file of a job
identical even when a part holds only error rows, whose generation columns are all null.
Logprobs are parallel list columns (the CSR layout Arrow list offsets give for free):
`token_ids[i]` was sampled with `token_logprobs[i]`; the optional top-k columns hold, per
generated position, k ids and k logprobs; `prompt_logprobs[0]` is null (the first prompt token
has no context to be predicted from), and the column is filled once per input row, in its record
with sample_index 0 (the samples of a row share its prompt).
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

# Score jobs (job.task = "score"): one row per (input row, continuation); documents scored in
# rolling windows have one row each, continuation_index 0, and the windows they were cut into.
# `token_ids`/`token_logprobs` are the scored tokens; `prompt_tokens` all tokens the engine read.
_WINDOW_TYPE = pa.struct(
    [
        pa.field("first_token", pa.int32()),  # index in the document's tokens of the first scored one
        pa.field("num_tokens", pa.int32()),  # tokens scored in this window
        pa.field("context_tokens", pa.int32()),  # tokens it was conditioned on (the prefix token first)
    ]
)
_SCORE_FIELDS = [
    pa.field("row_id", pa.string(), nullable=False),
    pa.field("continuation_index", pa.int32(), nullable=False),
    pa.field("status", pa.string(), nullable=False),
    pa.field("error_code", pa.string()),
    pa.field("error_message", pa.string()),
    pa.field("logprob_sum", pa.float64()),
    pa.field("is_greedy", pa.bool_()),
    pa.field("num_tokens", pa.int32()),
    pa.field("num_bytes", pa.int32()),
    pa.field("token_ids", pa.list_(pa.int32())),
    pa.field("token_logprobs", pa.list_(pa.float32())),
    pa.field("prompt_tokens", pa.int32()),
    pa.field("windows", pa.list_(_WINDOW_TYPE)),
]
# `shardinfer eval` dumps: one row per (task, document, filter), what the harness logged for it.
_EVAL_SAMPLE_FIELDS = [
    pa.field("row_id", pa.string(), nullable=False),  # "{task}/{doc_id}/{filter}"
    pa.field("task", pa.string(), nullable=False),
    pa.field("doc_id", pa.int64(), nullable=False),
    pa.field("filter", pa.string()),
    pa.field("request_type", pa.string()),
    pa.field("prompt", pa.string()),  # the context the model saw (the document, for rolling tasks)
    pa.field("target", pa.string()),
    pa.field("choices", pa.list_(pa.string())),  # loglikelihood tasks: the continuations scored
    pa.field("loglikelihoods", pa.list_(pa.float64())),  # one per choice (one per document, rolling)
    pa.field("is_greedy", pa.list_(pa.bool_())),
    pa.field("responses", pa.list_(pa.string())),  # generation tasks: the generated texts
    pa.field("filtered_answer", pa.string()),  # after the task's filters (the chosen choice, for MC)
    pa.field("metrics", pa.map_(pa.string(), pa.float64())),  # this sample's scalar metric values
    pa.field("metrics_json", pa.string()),  # every metric value as the harness gave it
    pa.field("doc_json", pa.string()),
]
OUTPUT_KIND_KEY = b"shardinfer.output_kind"

BASE_COLUMNS = tuple(f.name for f in _BASE_FIELDS)
SCORE_COLUMNS = tuple(f.name for f in _SCORE_FIELDS)
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
    return _with_passthrough(fields, passthrough, RESERVED_COLUMNS, None)


def score_output_schema(passthrough: pa.Schema | None = None) -> pa.Schema:
    """The output schema of a score job: the score columns, then passthrough (checked as above)."""
    return _with_passthrough(list(_SCORE_FIELDS), passthrough, frozenset(SCORE_COLUMNS), b"score")


def eval_samples_schema() -> pa.Schema:
    """The schema of an eval dump's parts (`shardinfer eval`)."""
    return _with_passthrough(list(_EVAL_SAMPLE_FIELDS), None, frozenset(), b"eval_samples")


def base_fields_of(schema: pa.Schema) -> list[pa.Field]:
    """The fixed columns a table of this kind (its schema's output-kind metadata) must have."""
    kind = (schema.metadata or {}).get(OUTPUT_KIND_KEY, b"generate")
    return list({b"score": _SCORE_FIELDS, b"eval_samples": _EVAL_SAMPLE_FIELDS}.get(kind, _BASE_FIELDS))


def _with_passthrough(
    fields: list[pa.Field], passthrough: pa.Schema | None, reserved: frozenset[str], kind: bytes | None
) -> pa.Schema:
    if passthrough is not None:
        for f in passthrough:
            if f.name in reserved:
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
    metadata = {SCHEMA_VERSION_KEY: str(OUTPUT_SCHEMA_VERSION).encode()}
    if kind is not None:  # generation tables carry no kind key: it is the default
        metadata[OUTPUT_KIND_KEY] = kind
    return pa.schema(fields, metadata=metadata)
