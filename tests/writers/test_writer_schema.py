"""The output schema: fixed columns and types in order, optional logprob columns, passthrough rules."""

from __future__ import annotations

import pyarrow as pa
import pytest

from shardinfer.writers.schema import OUTPUT_SCHEMA_VERSION, output_schema

# The contract, written out by hand from the design (not derived from the code under test).
EXPECTED_BASE = [
    ("row_id", pa.string()),
    ("sample_index", pa.int32()),
    ("status", pa.string()),
    ("error_code", pa.string()),
    ("error_message", pa.string()),
    ("text", pa.string()),
    ("token_ids", pa.list_(pa.int32())),
    ("token_logprobs", pa.list_(pa.float32())),
    ("finish_reason", pa.string()),
    ("prompt_tokens", pa.int32()),
    ("completion_tokens", pa.int32()),
    ("seed", pa.int64()),
]


def test_base_columns_in_order() -> None:
    schema = output_schema()
    assert [(f.name, f.type) for f in schema] == EXPECTED_BASE
    assert [f.name for f in schema if not f.nullable] == ["row_id", "sample_index", "status"]
    assert schema.metadata == {b"shardinfer.output_schema_version": str(OUTPUT_SCHEMA_VERSION).encode()}


def test_optional_columns_then_passthrough() -> None:
    passthrough = pa.schema([("id", pa.string()), ("lang", pa.dictionary(pa.int8(), pa.string()))])
    schema = output_schema(passthrough, top_logprobs=True, prompt_logprobs=True)
    assert [(f.name, f.type) for f in schema] == [
        *EXPECTED_BASE,
        ("top_token_ids", pa.list_(pa.list_(pa.int32()))),
        ("top_logprobs", pa.list_(pa.list_(pa.float32()))),
        ("prompt_logprobs", pa.list_(pa.float32())),
        ("id", pa.string()),
        ("lang", pa.dictionary(pa.int8(), pa.string())),
    ]
    assert output_schema(top_logprobs=False, prompt_logprobs=True).names[-1] == "prompt_logprobs"


@pytest.mark.parametrize("name", ["text", "seed", "row_id", "top_logprobs", "prompt_logprobs", "__row_index"])
def test_colliding_passthrough_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=f"input column '{name}'") as info:
        output_schema(pa.schema([(name, pa.string())]))
    assert "rename" in str(info.value)
