"""Structured-output forms: JSON with free or compact whitespace, vLLM's choice, the structured_output name."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from tokenizers import Tokenizer

from shardinfer import SamplingParams
from shardinfer.engine.structured import GrammarError, StructuredOutputCompiler, canonical_schema

OBJ = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _blank_tokens(hf_tokenizer: Tokenizer) -> list[int]:
    """Ids of tokens whose text is only whitespace (" ", "\\n", "  ", ...)."""
    ids = [
        i for i in range(hf_tokenizer.get_vocab_size()) if (t := hf_tokenizer.decode([i])) and not t.strip()
    ]
    assert ids, "the test tokenizer has whitespace tokens"
    return ids


@pytest.mark.parametrize("schema", [{}, OBJ])
def test_json_allows_whitespace_by_default_and_compact_on_request(
    schema: dict, compiler: StructuredOutputCompiler, hf_tokenizer: Tokenizer
) -> None:
    blanks = _blank_tokens(hf_tokenizer)
    brace = hf_tokenizer.token_to_id("{")
    allowed = {}
    for whitespace in ("flexible", "compact", None):
        so = {"schema_type": "json", "schema": schema}
        if whitespace is not None:
            so["whitespace"] = whitespace
        m = compiler.matcher(so)
        m.accept(brace)  # inside an object: whitespace is legal JSON here
        mask = m.allowed_mask()
        allowed[whitespace] = any(bool(mask[t]) for t in blanks)
    assert allowed == {"flexible": True, None: True, "compact": False}


def test_whitespace_flexible_json_accepts_pretty_printed_text(
    compiler: StructuredOutputCompiler, hf_tokenizer: Tokenizer, eos_id: int
) -> None:
    text = json.dumps({"a": 7}, indent=2)
    m = compiler.matcher({"schema_type": "json", "schema": OBJ})
    ids = hf_tokenizer.encode(text).ids
    for t in ids:
        m.accept(t)
    assert m.can_finish()
    compact = compiler.matcher({"schema_type": "json", "schema": OBJ, "whitespace": "compact"})
    assert compact.validate(ids) < len(ids)


def test_compact_is_written_into_the_canonical_schema() -> None:
    kind, text = canonical_schema({"schema_type": "json", "schema": OBJ, "whitespace": "compact"})
    assert kind == "json" and json.loads(text) == {**OBJ, "x-guidance": {"whitespace_flexible": False}}
    assert canonical_schema({"schema_type": "json", "schema": OBJ}) == (
        "json",
        json.dumps(OBJ, separators=(",", ":")),
    )


def test_choice_gives_exactly_one_of_the_choices(
    compiler: StructuredOutputCompiler, random_walk: Callable, decode: Callable
) -> None:
    choices = ["red", "green", "blue sky"]
    seen = set()
    for seed in range(12):
        m = compiler.matcher({"schema_type": "choice", "choices": choices})
        seen.add(decode(random_walk(m, seed)))
    assert seen == set(choices)


@pytest.mark.parametrize(
    ("so", "fragment"),
    [
        ({"schema_type": "choice", "choices": []}, "non-empty list"),
        ({"schema_type": "choice", "choices": ["a", 1]}, "non-empty list"),
        ({"schema_type": "choice"}, "non-empty list"),
        ({"schema_type": "choice", "choices": ["a"], "schema": ["b"]}, "once"),
        ({"schema_type": "regex", "schema": "a+", "whitespace": "compact"}, "json"),
        ({"schema_type": "json", "whitespace": "tight"}, "'tight'"),
        ({"schema_type": "json", "choices": ["a"]}, 'schema_type "choice"'),
        (
            {
                "schema_type": "json",
                "schema": {"x-guidance": {"whitespace_flexible": True}},
                "whitespace": "compact",
            },
            "contradicts",
        ),
    ],
)
def test_bad_forms_are_refused(so: dict, fragment: str, compiler: StructuredOutputCompiler) -> None:
    with pytest.raises(GrammarError, match=fragment):
        compiler.compile(so)


def test_structured_output_and_its_old_name_so_args() -> None:
    so = {"schema_type": "choice", "choices": ["yes", "no"]}
    new, old = SamplingParams(structured_output=so), SamplingParams(so_args=so)
    assert new == old and new.so_args == so and old.structured_output == so
    assert old.to_json_dict() == new.to_json_dict() and "so_args" not in new.to_json_dict()
    changed = old.replace(structured_output={"schema_type": "regex", "schema": "a"})
    assert changed.structured_output == changed.so_args == {"schema_type": "regex", "schema": "a"}
    assert old.replace(so_args=None).structured_output is None
    with pytest.raises(ValueError, match="both structured_output and so_args"):
        SamplingParams(structured_output=so, so_args={"schema_type": "json"})


class _PydanticLike:
    """Stands in for a pydantic model: what a user passes instead of its schema."""

    @classmethod
    def model_json_schema(cls) -> dict:
        return {"type": "object"}


def test_a_pydantic_model_as_schema_names_the_call_to_make(compiler: StructuredOutputCompiler) -> None:
    with pytest.raises(GrammarError, match=r"must be a JSON object .*pass Model\.model_json_schema\(\)"):
        compiler.compile({"schema_type": "json", "schema": _PydanticLike})
