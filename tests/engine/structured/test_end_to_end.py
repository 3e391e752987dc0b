"""Structured outputs through the whole engine: a random-init model sampled under grammar masks.

A random model has no idea of JSON; every valid output here is the mask's doing, which is the
point: validity must not depend on the model being good.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from shardinfer import LLM, SamplingParams
from shardinfer.engine.structured import GrammarError

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    },
    "required": ["name", "age", "color", "tags"],
    "additionalProperties": False,
}
# A random-init model samples whitespace as readily as any other allowed token and would spend its
# budget on blanks, so the tests that need finished objects from it ask for compact JSON.
COMPACT_JSON = {"schema_type": "json", "schema": SCHEMA, "whitespace": "compact"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), "llama", seed=3, num_hidden_layers=1)


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> LLM:
    return LLM(str(model_dir), device="cpu", dtype="float32")


def test_json_schema_samples_validate(llm: LLM):
    params = SamplingParams(temperature=1.0, max_tokens=80, n=4, seed=11, so_args=COMPACT_JSON)
    (out,) = llm.generate(["Describe a person as JSON:"], params)
    assert len(out.outputs) == 4
    for c in out.outputs:
        assert c.finish_reason == "stop", (c.finish_reason, c.text)
        value = json.loads(c.text)
        jsonschema.validate(value, SCHEMA)
        assert list(value) == list(SCHEMA["properties"])  # keys in schema order
    assert len({c.text for c in out.outputs}) > 1  # different seeds, different samples


def test_regex_greedy_and_lark(llm: LLM):
    pattern = r"[a-z]{2,5}@[a-z]{2,5}\.(com|org)"
    regex = SamplingParams(
        temperature=0.0, max_tokens=40, so_args={"schema_type": "regex", "schema": pattern}
    )
    lark = SamplingParams(
        temperature=1.0,
        max_tokens=40,
        seed=5,
        so_args={"schema_type": "lark", "schema": 'start: NUM ("+" NUM){1,3}\nNUM: /[1-9][0-9]?/'},
    )
    out_regex, out_lark = llm.generate(["email:", "sum:"], [regex, lark])
    c = out_regex.outputs[0]
    assert c.finish_reason == "stop" and re.fullmatch(pattern, c.text), (c.finish_reason, c.text)
    c = out_lark.outputs[0]
    assert c.finish_reason == "stop" and re.fullmatch(r"[1-9][0-9]?(\+[1-9][0-9]?){1,3}", c.text), c.text


def test_unfinished_grammar_ends_with_length(llm: LLM):
    params = SamplingParams(temperature=1.0, max_tokens=3, seed=2, so_args=COMPACT_JSON)
    (out,) = llm.generate(["JSON:"], params)
    c = out.outputs[0]
    assert c.finish_reason == "length" and len(c.token_ids) == 3
    assert '{"name":"'.startswith(c.text) or c.text.startswith('{"name":"')  # a prefix of a valid object


def test_invalid_schema_is_a_grammar_error(llm: LLM):
    params = SamplingParams(
        max_tokens=5, so_args={"schema_type": "json", "schema": {"type": "integer", "minimum": "zero"}}
    )
    with pytest.raises(GrammarError, match="invalid json schema") as info:
        llm.generate(["x"], params)
    assert info.value.error_code == "invalid_schema"


def test_preemption_keeps_grammar_state(model_dir: Path, llm: LLM):
    """Samples preempted for lack of KV blocks (and recomputed) come out valid and identical to
    samples that ran without interruption: the matcher is unaffected by recomputation."""
    params = SamplingParams(temperature=1.0, max_tokens=60, n=4, seed=23, so_args=COMPACT_JSON)
    prompt = ["Describe a person as JSON:"]
    (free,) = llm.generate(prompt, params)
    tight = LLM(str(model_dir), device="cpu", dtype="float32", block_size=4, num_kv_blocks=30)
    (squeezed,) = tight.generate(prompt, params)
    assert tight.llm_engine.stats()["preemptions"] > 0
    for a, b in zip(free.outputs, squeezed.outputs, strict=True):
        assert a.finish_reason == "stop"
        jsonschema.validate(json.loads(a.text), SCHEMA)
        assert (b.token_ids, b.text, b.finish_reason) == (a.token_ids, a.text, a.finish_reason)


def test_text_is_decoded_once_per_request_without_stop_strings(llm: LLM, monkeypatch: pytest.MonkeyPatch):
    """A grammar request without stop strings needs its text only when it ends: one decode per
    request, whichever way it ends (grammar finished, eos, max_tokens), with the same text as
    decoding its tokens."""
    tokenizer = llm.llm_engine.tokenizer
    decode = tokenizer.decode
    calls: list[int] = []

    def counted(ids: list[int], skip_special_tokens: bool = True) -> str:
        calls.append(len(ids))
        return decode(ids, skip_special_tokens)

    monkeypatch.setattr(tokenizer, "decode", counted)
    so_args = {"schema_type": "json", "schema": SCHEMA}
    params = [SamplingParams(temperature=1.0, max_tokens=80, seed=s, so_args=so_args) for s in range(3)]
    params.append(SamplingParams(temperature=1.0, max_tokens=5, seed=9, so_args=so_args))
    outs = llm.generate(["JSON:"] * len(params), params)
    assert len(calls) == len(params)
    eos = set(tokenizer.eos_token_ids)
    assert {o.outputs[0].finish_reason for o in outs} == {"stop", "length"}
    for o in outs:
        c = o.outputs[0]
        ids = c.token_ids[:-1] if c.token_ids and c.token_ids[-1] in eos else c.token_ids
        assert c.text == decode(ids)
