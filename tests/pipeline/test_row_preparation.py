"""RowPreparer: row ids, prompts (text and chat), per-row overrides, seeds, and error codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as RawTokenizer

from shardinfer.engine.seeds import derive_seed
from shardinfer.engine.tokenizer import Tokenizer
from shardinfer.pipeline.config import InputSection
from shardinfer.pipeline.rows import RowPreparer


def _preparer(
    model_dir: Path, max_model_len: int = 64, sampling: dict[str, Any] | None = None, **inp: Any
) -> RowPreparer:
    section = InputSection(path="x", **{"prompt_column": "prompt", **inp})
    return RowPreparer(
        Tokenizer(model_dir), max_model_len, sampling or {"max_tokens": 4}, section, job_seed=42
    )


def test_row_id_prompt_ids_and_seeds(model_dir: Path) -> None:
    raw = RawTokenizer.from_file(str(model_dir / "tokenizer.json"))
    prep = _preparer(model_dir, sampling={"max_tokens": 4, "n": 2, "temperature": 0.7})
    row = prep.prepare(5, 3, 0, {"prompt": "hello world", "__row_index": 17})
    assert row.error is None and row.row_id == "3:17"
    assert row.prompt_ids == raw.encode("hello world").ids
    assert row.seeds == [derive_seed(42, "3:17", 0), derive_seed(42, "3:17", 1)]
    assert [(p.n, p.seed, p.temperature, p.max_tokens) for p in row.params] == [
        (1, row.seeds[0], 0.7, 4),
        (1, row.seeds[1], 0.7, 4),
    ]
    with_id = _preparer(model_dir, id_column="id").prepare(
        0, 0, 0, {"id": 123, "prompt": "x", "__row_index": 0}
    )
    assert with_id.row_id == "123" and with_id.seeds == [derive_seed(42, "123", 0)]


def test_messages_go_through_the_chat_template(model_dir: Path) -> None:
    raw = RawTokenizer.from_file(str(model_dir / "tokenizer.json"))
    prep = _preparer(model_dir, prompt_column="", messages_column="messages")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    expected = raw.encode(
        "<|bos|><|system|>be brief<|end|><|user|>hi there<|end|><|assistant|>", add_special_tokens=False
    ).ids
    as_list = prep.prepare(0, 0, 0, {"messages": messages, "__row_index": 0})
    as_json = prep.prepare(0, 0, 1, {"messages": json.dumps(messages), "__row_index": 1})
    assert as_list.prompt_ids == expected and as_json.prompt_ids == expected


def test_overrides_apply_per_row(model_dir: Path) -> None:
    prep = _preparer(model_dir, override_columns=["max_tokens", "temperature", "seed", "stop", "so_args"])
    row = prep.prepare(
        0,
        0,
        0,
        {
            "prompt": "a",
            "__row_index": 0,
            "max_tokens": 3.0,
            "temperature": None,
            "seed": 9,
            "stop": "fox",
            "so_args": '{"schema_type": "regex", "schema": "[a-z]+"}',
        },
    )
    assert row.error is None
    p = row.params[0]
    assert (p.max_tokens, p.temperature, p.stop, p.so_args) == (
        3,
        1.0,
        ["fox"],
        {"schema_type": "regex", "schema": "[a-z]+"},
    )
    assert p.seed == derive_seed(9, "0:0", 0)  # a row seed replaces job.seed in the derivation


@pytest.mark.parametrize(
    ("row", "code"),
    [
        ({"prompt": None}, "empty_prompt"),
        ({"prompt": ""}, "empty_prompt"),
        ({"prompt": 12}, "invalid_row"),
        ({"prompt": "fox " * 80}, "prompt_too_long"),
        ({"prompt": "a", "temperature": -1.0}, "bad_override"),
        ({"prompt": "a", "temperature": "hot"}, "bad_override"),
        ({"prompt": "a", "max_tokens": 2.5}, "bad_override"),
        ({"prompt": "a", "so_args": "{not json"}, "bad_override"),
        ({"prompt": "a", "so_args": '{"schema_type": "yaml"}'}, "bad_override"),
    ],
)
def test_bad_rows_become_error_codes(model_dir: Path, row: dict[str, Any], code: str) -> None:
    prep = _preparer(model_dir, override_columns=["temperature", "max_tokens", "so_args"])
    prepared = prep.prepare(0, 1, 4, {"__row_index": 4, **row})
    assert prepared.error is not None and prepared.error.code == code
    assert prepared.row_id == "1:4" and prepared.params == []


def test_bad_messages_are_invalid_rows(model_dir: Path) -> None:
    prep = _preparer(model_dir, prompt_column="", messages_column="messages")
    for value in ("not json", json.dumps({"role": "user"}), json.dumps([{"content": "no role"}])):
        prepared = prep.prepare(0, 0, 0, {"messages": value, "__row_index": 0})
        assert prepared.error is not None and prepared.error.code == "invalid_row", value
    for empty in ([], "[]"):  # no message at all: nothing to continue from, as a null prompt
        prepared = prep.prepare(0, 0, 0, {"messages": empty, "__row_index": 0})
        assert prepared.error is not None and prepared.error.code == "empty_prompt", empty


def test_error_records_of_bad_overrides_keep_their_seeds(model_dir: Path) -> None:
    prep = _preparer(model_dir, sampling={"max_tokens": 4, "n": 2}, override_columns=["temperature", "seed"])
    bad = prep.prepare(0, 1, 4, {"prompt": "a", "temperature": "hot", "__row_index": 4})
    assert bad.error is not None and bad.error.code == "bad_override"
    assert bad.seeds == [derive_seed(42, "1:4", 0), derive_seed(42, "1:4", 1)]  # what a good row would get
    own = prep.prepare(0, 1, 5, {"prompt": "a", "temperature": "hot", "seed": 7, "__row_index": 5})
    assert own.seeds == [derive_seed(7, "1:5", 0), derive_seed(7, "1:5", 1)]
    unreadable = prep.prepare(0, 1, 6, {"prompt": "a", "seed": "seven", "__row_index": 6})
    assert unreadable.error is not None and unreadable.seeds == [None, None]  # the seed itself is the problem


def test_attempt_ids_are_file_name_safe_and_unique() -> None:
    import re

    from shardinfer.pipeline.runner import attempt_id

    ids = {attempt_id("scheduled__2024-01-01T00:00:00+00:00") for _ in range(50)}
    assert len(ids) == 50
    for value in [*ids, attempt_id(""), attempt_id("x" * 200)]:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", value), value
    assert next(iter(ids)).startswith("scheduled__2024-01-01T00_00_00_00_00-")


def test_sample_seeds_for_rows_and_for_prompts() -> None:
    import hashlib

    from shardinfer.engine.seeds import sample_seeds

    def by_hand(*parts: object) -> int:  # blake2b-64 of "seed:key:..." as DESIGN.md's hash
        digest = hashlib.blake2b(":".join(str(p) for p in parts).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & (2**63 - 1)

    assert sample_seeds(42, 2, "3:17") == [by_hand(42, "3:17", 0), by_hand(42, "3:17", 1)]
    assert sample_seeds(42, 3) == [42, by_hand(42, "sample", 1), by_hand(42, "sample", 2)]


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("row", "code", "message"),
    [
        ({"prompt": "a", "top_k": 10**12}, "bad_override", "top_k=1000000000000 is above"),
        ({"prompt": "a", "n": 10**9}, "bad_override", "n=1000000000 is above the limit"),
        ({"prompt": "a", "max_tokens": 65}, "bad_override", "max_tokens=65 is above max_model_len=64"),
        ({"prompt": "a", "max_tokens": float("inf")}, "bad_override", "column 'max_tokens'"),
        ({"prompt": "a", "stop": ["x"] * 65}, "bad_override", "stop has 65 strings"),
        ({"prompt": "a", "stop": "y" * 513}, "bad_override", "a stop string has 513 characters"),
        ({"prompt": "a", "stop_token_ids": list(range(1025))}, "bad_override", "stop_token_ids has 1025"),
        (
            {"prompt": "a", "so_args": '{"schema_type": "json", "schema": ' + DEEP + "}"},
            "invalid_schema",
            "nested",
        ),
        (
            {"prompt": "a", "so_args": '{"schema_type": "json", "schema": ' + "[" * 65 + "]" * 65 + "}"},
            "invalid_schema",
            "deeper than the limit of 64",
        ),
        ({"prompt": "a", "__row_error": "line 3: not valid JSON"}, "invalid_row", "line 3: not valid JSON"),
        ({"prompt": [[[["a"]]]] * 2}, "invalid_row", "holds list"),
    ],
)
def test_rows_over_the_limits_or_unreadable_become_error_records(
    model_dir: Path, row: dict[str, Any], code: str, message: str
) -> None:
    overrides = ["top_k", "n", "max_tokens", "stop", "stop_token_ids", "so_args"]
    prep = _preparer(model_dir, sampling={"max_tokens": 4, "n": 2}, override_columns=overrides)
    prepared = prep.prepare(0, 1, 4, {"__row_index": 4, **row})
    assert prepared.error is not None and prepared.error.code == code
    assert message in prepared.error.message
    assert prepared.n == 2 and prepared.params == []  # the job's n, not the row's


def test_a_value_too_deep_for_any_step_is_an_invalid_row(model_dir: Path) -> None:
    prep = _preparer(model_dir, prompt_column="", messages_column="messages", id_column="id")
    deep_messages = prep.prepare(0, 0, 0, {"id": "a", "messages": DEEP, "__row_index": 0})
    deep_list: list[Any] = []
    for _ in range(5000):  # deeper than the interpreter's recursion limit: str() of it fails
        deep_list = [deep_list]
    deep_id = prep.prepare(0, 2, 1, {"id": deep_list, "messages": "[]", "__row_index": 7})
    assert deep_messages.error is not None and deep_messages.error.code == "invalid_row"
    assert deep_id.error is not None and deep_id.error.code == "invalid_row" and deep_id.row_id == "2:7"


def test_job_sampling_over_a_limit_is_a_config_error(model_dir: Path) -> None:
    from shardinfer.errors import ConfigError

    with pytest.raises(ConfigError, match="n=2000 is above the limit of 1024"):
        _preparer(model_dir, sampling={"max_tokens": 4, "n": 2000})
    assert _preparer(model_dir, sampling={"max_tokens": 65}).base.max_tokens == 65  # ends at max_model_len


def test_message_content_null_list_and_parts(model_dir: Path) -> None:
    raw = RawTokenizer.from_file(str(model_dir / "tokenizer.json"))
    prep = _preparer(model_dir, prompt_column="", messages_column="messages")

    def prepared(messages: list[dict[str, Any]]) -> Any:
        return prep.prepare(0, 0, 0, {"messages": json.dumps(messages), "__row_index": 0})

    parts = [{"type": "text", "text": "first"}, "second", {"type": "refusal", "refusal": None}]
    joined = prepared([{"role": "user", "content": parts}])
    expected = raw.encode("<|bos|><|user|>first\nsecond<|end|><|assistant|>", add_special_tokens=False).ids
    assert joined.error is None and joined.prompt_ids == expected
    for bad, why in [
        ([{"role": "user", "content": None}], "has no content"),
        ([{"role": "user"}], "has no content"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "'image_url'"),
        ([{"role": "user", "content": [{"type": "text", "text": 3}]}], "holds int"),
        ([{"role": "user", "content": {"text": "x"}}], "content is dict"),
    ]:
        result = prepared(bad)
        assert result.error is not None and result.error.code == "invalid_row", bad
        assert why in result.error.message, result.error.message
    # A message that carries tool calls may leave its content null; the template decides.
    tool_call = [
        {"role": "user", "content": "call it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "f"}}],
        },
    ]
    with_tools = prepared(tool_call)
    # The template sees the message without its null content (as transformers does): nothing printed.
    none_text = "<|bos|><|user|>call it<|end|><|assistant|><|end|><|assistant|>"
    assert with_tools.error is None
    assert with_tools.prompt_ids == raw.encode(none_text, add_special_tokens=False).ids


@pytest.mark.parametrize(("value", "said"), [(None, "null"), (float("nan"), "NaN")])
def test_a_missing_id_is_an_error_record_under_the_file_row_id(
    model_dir: Path, value: Any, said: str
) -> None:
    # pandas stores a missing value of a numeric column as NaN: as text every such row would share
    # the id "nan" (and its seeds), so it is as missing as a null.
    prep = _preparer(model_dir, id_column="id")
    prepared = prep.prepare(0, 2, 0, {"id": value, "prompt": "x", "__row_index": 9})
    assert prepared.row_id == "2:9"
    assert prepared.error is not None and prepared.error.code == "invalid_row"
    assert f"id_column 'id' is {said} in this row" in prepared.error.message
    assert prep.prepare(0, 2, 1, {"id": 1.5, "prompt": "x", "__row_index": 10}).row_id == "1.5"


def test_messages_text_that_is_not_json_names_the_column_and_the_value(model_dir: Path) -> None:
    prep = _preparer(model_dir, prompt_column="", messages_column="chat")
    prepared = prep.prepare(0, 0, 0, {"chat": "user: hello", "__row_index": 0})
    assert prepared.error is not None and prepared.error.code == "invalid_row"
    assert "messages column 'chat' holds a string that is not JSON" in prepared.error.message
    assert "'user: hello'" in prepared.error.message


def test_messages_stored_as_maps_go_through_the_chat_template(model_dir: Path) -> None:
    import pyarrow as pa

    # Spark often writes chat data as array<map<string, string>>; Arrow hands a map cell to Python
    # as a list of (key, value) tuples.
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    column = pa.array([[list(m.items()) for m in messages]], pa.list_(pa.map_(pa.string(), pa.string())))
    (cell,) = column.to_pylist()
    raw = RawTokenizer.from_file(str(model_dir / "tokenizer.json"))
    expected = raw.encode(
        "<|bos|><|system|>be brief<|end|><|user|>hi there<|end|><|assistant|>", add_special_tokens=False
    ).ids
    prep = _preparer(model_dir, prompt_column="", messages_column="messages")
    prepared = prep.prepare(0, 0, 0, {"messages": cell, "__row_index": 0})
    assert prepared.error is None and prepared.prompt_ids == expected


def test_a_row_asking_for_no_tokens_is_a_bad_override(model_dir: Path) -> None:
    # max_tokens=0 with prompt logprobs is a valid engine request (prompt-only scoring), but a
    # generated row must generate: the row is an error, not a record of empty text.
    prep = _preparer(
        model_dir, sampling={"max_tokens": 4, "prompt_logprobs": 1}, override_columns=["max_tokens"]
    )
    prepared = prep.prepare(0, 1, 4, {"__row_index": 4, "prompt": "a", "max_tokens": 0})
    assert prepared.error is not None and prepared.error.code == "bad_override"
    assert "max_tokens" in prepared.error.message and ">= 1" in prepared.error.message
    assert prep.prepare(0, 1, 5, {"__row_index": 5, "prompt": "a", "max_tokens": 1}).error is None
    # A negative value is told the same, not offered 0 (the engine's prompt-only request).
    negative = prep.prepare(0, 1, 6, {"__row_index": 6, "prompt": "a", "max_tokens": -1})
    assert negative.error is not None and negative.error.code == "bad_override"
    assert "value -1: a row generates at least one token" in negative.error.message
    assert "prompt_logprobs" not in negative.error.message
