"""Compiling so_args: validation errors, canonical cache keys, the LRU cache, tokenizer loading."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest

from shardinfer.engine.structured import (
    GrammarError,
    GrammarViolation,
    StructuredOutputCompiler,
    allocate_bitmask,
    canonical_schema,
    unpack_bitmask,
)
from shardinfer.engine.structured.compiler import default_mask_threads

OBJ = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}, "required": ["b"]}


@pytest.mark.parametrize(
    ("so_args", "fragments"),
    [
        ({"schema_type": "json", "schema": {"type": "foo"}}, ["invalid json schema", "foo"]),
        ({"schema_type": "json", "schema": '{"type": "object",'}, ["not valid JSON"]),
        ({"schema_type": "json", "schema": [1, 2]}, ["must be a JSON object"]),
        ({"schema_type": "json", "schema": False}, ["must be a JSON object"]),
        ({"schema_type": "json", "schema": {"enum": [{1, 2}]}}, ["cannot be serialised", "set"]),
        ({"schema_type": "json", "schema": {"maximum": float("nan")}}, ["cannot be serialised"]),
        (
            {"schema_type": "json", "schema": {"type": "string", "format": "weird"}},
            ["invalid json schema", "weird"],
        ),
        ({"schema_type": "regex", "schema": "[a-"}, ["invalid regex schema", "unclosed character class"]),
        ({"schema_type": "regex", "schema": ""}, ["regex schema must be a non-empty string"]),
        ({"schema_type": "ebnf", "schema": 'root ::= "a" missing'}, ["invalid ebnf schema", "missing"]),
        ({"schema_type": "ebnf", "schema": 'root ::= "a" [0-9'}, ["invalid ebnf schema"]),
        (
            {"schema_type": "lark", "schema": "start: undefined_rule"},
            ["invalid lark schema", "undefined_rule"],
        ),
        # GBNF with its start rule named as in Lark: the message says to name it root.
        ({"schema_type": "ebnf", "schema": 'start ::= "a" | "b"'}, ["invalid ebnf schema", "no rule 'root'"]),
        (
            {"schema_type": "ebnf", "schema": 'expr ::= "a"'},
            ["invalid ebnf schema", "'expr' but no rule 'root'"],
        ),
        # Keywords llguidance cannot enforce are refused by name, not ignored.
        ({"schema_type": "json", "schema": {"type": "array", "uniqueItems": True}}, ["uniqueItems"]),
        ({"schema_type": "json", "schema": {"not": {"type": "string"}}}, ['"not"']),
        ({"schema_type": "json", "schema": {"type": "array", "contains": {"const": 1}}}, ["contains"]),
        ({"schema_type": "json", "schema": {"if": {"type": "string"}, "then": {"minLength": 2}}}, ["if"]),
        (
            {"schema_type": "json", "schema": {"type": "object", "propertyNames": {"maxLength": 2}}},
            ["propertyNames"],
        ),
        ({"schema_type": "json", "schema": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}, ["oneOf"]),
        ({"schema_type": "xml", "schema": "<a/>"}, ["schema_type='xml'", "json"]),
        ({"schema_type": "json", "schma": {}}, ["unknown keys", "schma"]),
        ("json", ["must be a dict"]),
    ],
)
def test_invalid_schema_raises_grammar_error_naming_the_problem(so_args, fragments, compiler):
    with pytest.raises(GrammarError) as info:
        compiler.compile(so_args)
    assert isinstance(info.value, ValueError)
    assert info.value.error_code == "invalid_schema"
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_invalid_schema_error_is_cached(compiler):
    so_args = {"schema_type": "lark", "schema": "start: cached_bad_rule"}
    before = compiler.num_compiles
    for _ in range(3):
        with pytest.raises(GrammarError, match="cached_bad_rule"):
            compiler.matcher(so_args)
    assert compiler.num_compiles == before + 1


def test_cache_hit_returns_the_same_compiled_object(compiler):
    before = compiler.num_compiles
    first = compiler.compile({"schema_type": "json", "schema": OBJ})
    # The same schema as a JSON string with other spacing canonicalises to the same key.
    again = compiler.compile({"schema_type": "json", "schema": json.dumps(OBJ, indent=2)})
    assert again is first
    assert compiler.num_compiles == before + 1
    assert first.schema_text == json.dumps(OBJ, separators=(",", ":"))
    # Key order is part of the grammar (it is the order of the generated keys): another entry.
    reordered = {
        "required": ["b"],
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        "type": "object",
    }
    assert compiler.compile({"schema_type": "json", "schema": reordered}) is not first
    # Same text, another schema type: another entry.
    assert compiler.compile({"schema_type": "regex", "schema": "abc"}) is not compiler.compile(
        {"schema_type": "lark", "schema": 'start: "abc"'}
    )


def test_matchers_are_fresh_per_request(compiler):
    so_args = {"schema_type": "regex", "schema": "ab|ac"}
    m1, m2 = compiler.matcher(so_args), compiler.matcher(so_args)
    a_id = compiler.tokenizer.tokenize_str("a")[0]
    m1.accept(a_id)
    assert m1.num_accepted == 1 and m2.num_accepted == 0
    assert m2.allowed_mask().equal(compiler.matcher(so_args).allowed_mask())


def test_cache_is_bounded_lru(tokenizer_path: Path, eos_id: int, tok_vocab: int):
    small = StructuredOutputCompiler(tokenizer_path, [eos_id], tok_vocab, cache_size=2)
    a = small.compile({"schema_type": "regex", "schema": "a"})
    small.compile({"schema_type": "regex", "schema": "b"})
    assert small.compile({"schema_type": "regex", "schema": "a"}) is a  # refreshes "a"
    small.compile({"schema_type": "regex", "schema": "c"})  # evicts "b", the least recent
    assert small.compile({"schema_type": "regex", "schema": "a"}) is a
    assert small.cache_info() == {"entries": 2, "max_entries": 2, "compiles": 3}
    small.compile({"schema_type": "regex", "schema": "b"})
    assert small.num_compiles == 4


def test_canonical_schema():
    assert canonical_schema({"schema_type": "json", "schema": ""}) == ("json", "{}")
    assert canonical_schema({"schema_type": "json"}) == ("json", "{}")
    assert canonical_schema({"schema_type": "json", "schema": True}) == ("json", "{}")
    assert canonical_schema({"schema_type": "json", "schema": '{"x": "é"}'}) == ("json", '{"x":"é"}')
    assert canonical_schema({"schema_type": "regex", "schema": " a+ "}) == ("regex", " a+ ")


def test_tokenizer_from_text_or_path_is_the_same_identity(
    tokenizer_path: Path, eos_id: int, tok_vocab: int, compiler
):
    from_text = StructuredOutputCompiler(tokenizer_path.read_text(), [eos_id], tok_vocab + 37)
    assert from_text.tokenizer_id == compiler.tokenizer_id
    other_vocab = StructuredOutputCompiler(str(tokenizer_path), [eos_id], tok_vocab)
    assert other_vocab.tokenizer_id != compiler.tokenizer_id


def test_constructor_errors_name_the_value(tokenizer_path: Path, eos_id: int, tok_vocab: int):
    with pytest.raises(ValueError, match=f"vocab_size={tok_vocab - 1}"):
        StructuredOutputCompiler(tokenizer_path, [eos_id], tok_vocab - 1)
    with pytest.raises(ValueError, match="eos_token_ids"):
        StructuredOutputCompiler(tokenizer_path, [tok_vocab + 5], tok_vocab)
    with pytest.raises(ValueError, match="at least one eos"):
        StructuredOutputCompiler(tokenizer_path, [], tok_vocab)
    with pytest.raises(ValueError, match=r"neither tokenizer\.json text nor a file path"):
        StructuredOutputCompiler(str(tokenizer_path) + ".missing", [eos_id], tok_vocab)


def test_samples_are_copied_from_templates_in_turn(
    tokenizer_path: Path, eos_id: int, tok_vocab: int, random_walk
):
    pooled = StructuredOutputCompiler(tokenizer_path, [eos_id], tok_vocab, num_threads=2, templates=3)
    so_args = {"schema_type": "json", "schema": OBJ}
    grammar = pooled.compile(so_args)
    assert grammar.num_templates == 1  # the one compiled to validate the schema; others on demand
    matchers = [pooled.matcher(so_args) for _ in range(7)]
    assert grammar.num_templates == 3
    # Copies of different templates, filled in one batched call while they walk, give the masks
    # of matchers built from the grammar alone (which share nothing with any template).
    alone = [grammar.new_matcher(independent=True) for _ in matchers]
    walks = [random_walk(m, seed=i) for i, m in enumerate(alone)]
    bitmask = allocate_bitmask(len(matchers), tok_vocab)
    for step in range(max(map(len, walks))):
        live = [i for i, w in enumerate(walks) if step < len(w)]
        pooled.fill_bitmasks([(matchers[i], i) for i in live], bitmask)
        for i in live:
            ref = grammar.new_matcher(independent=True)
            for t in walks[i][:step]:
                ref.accept(t)
            assert unpack_bitmask(bitmask[i : i + 1], tok_vocab)[0].equal(ref.allowed_mask()), (i, step)
            matchers[i].accept(walks[i][step])


def test_default_templates_follow_the_mask_threads(tokenizer_path: Path, eos_id: int, tok_vocab: int):
    assert StructuredOutputCompiler(tokenizer_path, [eos_id], tok_vocab, num_threads=5).templates == 5
    assert StructuredOutputCompiler(tokenizer_path, [eos_id], tok_vocab).templates == default_mask_threads()
    with pytest.raises(ValueError, match="templates=0"):
        StructuredOutputCompiler(tokenizer_path, [eos_id], tok_vocab, templates=0)
    with pytest.raises(ValueError, match="num_threads=0"):
        StructuredOutputCompiler(tokenizer_path, [eos_id], tok_vocab, num_threads=0)


@pytest.mark.parametrize("parallel", [True, False], ids=["thread-pool", "one-by-one"])
def test_batched_accept_equals_accepting_one_by_one(
    tokenizer_path: Path, eos_id: int, tok_vocab: int, random_walk, parallel: bool
):
    """accept_tokens advances every matcher as accept() would, and reports a refused token (or an
    id outside the vocabulary) for its pair alone, leaving that matcher unusable."""
    batched = StructuredOutputCompiler(
        tokenizer_path, [eos_id], tok_vocab, num_threads=2, parallel_accept=parallel
    )
    assert batched.parallel_accept is parallel
    so_args = {"schema_type": "json", "schema": OBJ}
    grammar = batched.compile(so_args)
    walks = [random_walk(grammar.new_matcher(independent=True), seed=i) for i in range(6)]
    matchers = [batched.matcher(so_args) for _ in walks]
    refs = [grammar.new_matcher(independent=True) for _ in walks]
    for step in range(max(map(len, walks))):
        live = [i for i, w in enumerate(walks) if step < len(w)]
        assert batched.accept_tokens([(matchers[i], walks[i][step]) for i in live]) == [None] * len(live)
        for i in live:
            refs[i].accept(walks[i][step])
            assert matchers[i].num_accepted == refs[i].num_accepted == step + 1
            assert matchers[i].is_finished() == refs[i].is_finished()
            if not matchers[i].is_finished():
                assert matchers[i].allowed_mask().equal(refs[i].allowed_mask()), (i, step)
    fresh = [batched.matcher(so_args) for _ in range(3)]
    first = walks[0][0]  # allowed at the start; "}" (a JSON object cannot start with it) is not
    refused = next(t for t in range(tok_vocab) if not fresh[0].allowed_mask()[t])
    out = batched.accept_tokens([(fresh[0], first), (fresh[1], refused), (fresh[2], tok_vocab + 5)])
    assert out[0] is None and fresh[0].num_accepted == 1
    assert isinstance(out[1], GrammarViolation) and f"token {refused} is not allowed" in str(out[1])
    assert isinstance(out[2], GrammarViolation) and "outside the vocabulary" in str(out[2])
    with pytest.raises(GrammarViolation, match="error state"):
        fresh[1].allowed_mask()
    assert fresh[2].num_accepted == 0 and fresh[2].allowed_mask().any()  # never handed to llguidance


def test_copies_are_filled_one_thread_per_template(
    tokenizer_path: Path, eos_id: int, tok_vocab: int, monkeypatch: pytest.MonkeyPatch
):
    """Copies of one template never reach two threads at once: the batch is split by template
    slot (matchers built alone, which share nothing, are spread over the slots), each slot on
    its own thread; the masks are those of matchers built alone."""
    compiler = StructuredOutputCompiler(tokenizer_path, [eos_id], tok_vocab, num_threads=3)
    assert compiler.templates == 3
    so_args = {"schema_type": "json", "schema": OBJ}
    grammar = compiler.compile(so_args)
    copies = [compiler.matcher(so_args) for _ in range(7)]
    assert [m.template for m in copies] == [0, 1, 2, 0, 1, 2, 0]
    assert copies[4].fork().template == 1
    alone = grammar.new_matcher(independent=True)
    assert alone.template is None
    batch = [*copies, alone]
    seen: list[tuple[int, list[int], str]] = []
    per_template = compiler._per_template

    def watched(groups, call):
        def on_thread(ex, group):
            seen.append((len(group), sorted(row for _, row in group), threading.current_thread().name))
            return call(ex, group)

        return per_template(groups, on_thread)

    monkeypatch.setattr(compiler, "_per_template", watched)
    bitmask = allocate_bitmask(len(batch), tok_vocab)
    compiler.fill_bitmasks([(m, i) for i, m in enumerate(batch)], bitmask)
    # Slots 0, 1, 2 hold rows {0, 3, 6}, {1, 4, 7 (the lone matcher, 7 % 3)}, {2, 5}.
    assert sorted(rows for _, rows, _ in seen) == [[0, 3, 6], [1, 4, 7], [2, 5]]
    assert all(name.startswith("shardinfer-grammar") for _, _, name in seen)
    want = alone.allowed_mask()
    for i in range(len(batch)):
        assert unpack_bitmask(bitmask[i : i + 1], tok_vocab)[0].equal(want), i


def test_lenient_schema_names_the_constraints_it_leaves_out(
    tokenizer_path: Path, eos_id: int, tok_vocab: int, caplog: pytest.LogCaptureFixture
):
    """With "lenient", llguidance drops keywords it cannot enforce instead of refusing the schema:
    the user is told which ones, once per schema, since outputs may break them."""
    compiler = StructuredOutputCompiler(tokenizer_path, [eos_id], tok_vocab)
    lenient = {
        "type": "array",
        "items": {"type": "integer"},
        "uniqueItems": True,
        "x-guidance": {"lenient": True},
    }
    with caplog.at_level(logging.WARNING, logger="shardinfer.engine.structured.compiler"):
        grammar = compiler.compile({"schema_type": "json", "schema": lenient})
        compiler.compile({"schema_type": "json", "schema": lenient})  # cached: not told twice
    assert any("uniqueItems" in w for w in grammar.warnings), grammar.warnings
    told = [r.getMessage() for r in caplog.records if "uniqueItems" in r.getMessage()]
    assert len(told) == 1, told
    strict = compiler.compile(
        {"schema_type": "json", "schema": {"type": "array", "items": {"type": "integer"}}}
    )
    assert strict.warnings == ()
