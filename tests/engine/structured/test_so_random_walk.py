"""Random walks under a grammar mask must produce text that an independent validator accepts."""

from __future__ import annotations

import ast
import json
import re

import jsonschema
import pytest

from shardinfer.engine.structured import StructuredOutputCompiler

SEEDS = range(6)

JSON_SCHEMAS = {
    "object_required": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "enum": {"enum": ["red", "green", "blue", 7, None]},
    "array_items": {
        "type": "array",
        "items": {"type": "integer", "minimum": -5, "maximum": 5},
        "minItems": 2,
        "maxItems": 4,
    },
    "integer_range": {"type": "integer", "minimum": 100, "maximum": 250},
    "nested": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 9},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3},
            "owner": {
                "type": "object",
                "properties": {
                    "ok": {"type": "boolean"},
                    "city": {"type": "string", "pattern": "^[a-z]{1,4}$"},
                },
                "required": ["ok", "city"],
                "additionalProperties": False,
            },
        },
        "required": ["id", "tags", "owner"],
        "additionalProperties": False,
    },
}


@pytest.mark.parametrize("name", sorted(JSON_SCHEMAS))
def test_json_schema_walks_validate(name, compiler: StructuredOutputCompiler, random_walk, decode, eos_id):
    schema = JSON_SCHEMAS[name]
    for seed in SEEDS:
        m = compiler.matcher({"schema_type": "json", "schema": schema})
        tokens = random_walk(m, seed)
        assert m.is_finished(), f"seed {seed}: walk did not finish: {decode(tokens)!r}"
        text = decode(tokens)
        jsonschema.validate(json.loads(text), schema)


def test_json_schema_given_as_string(compiler: StructuredOutputCompiler, random_walk, decode):
    schema = JSON_SCHEMAS["object_required"]
    for seed in SEEDS:
        m = compiler.matcher({"schema_type": "json", "schema": json.dumps(schema)})
        text = decode(random_walk(m, seed))
        value = json.loads(text)
        jsonschema.validate(value, schema)
        assert list(value) == ["name", "age"]  # properties come out in schema order


@pytest.mark.parametrize("empty", [{}, "", "  ", None, True])
def test_empty_json_schema_means_any_json(empty, compiler: StructuredOutputCompiler, decode, eos_id):
    m = compiler.matcher({"schema_type": "json", "schema": empty})
    assert not m.can_finish()  # the empty text is not JSON
    for value in ('{"a":[1,true,null]}', '"hi"', "-12.5"):
        m.reset()
        ids = compiler.tokenizer.tokenize_str(value)
        for t in ids:
            m.accept(t)
        assert m.can_finish(), value
        json.loads(decode(ids))


REGEXES = [
    r"[a-z]{1,8}@[a-z]{2,6}\.(com|org)",
    r"\d{3}-\d{4}",
    r"(yes|no|maybe)",
    r"-?(0|[1-9][0-9]{0,3})(\.[0-9]{1,2})?",
]


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_walks_fullmatch(pattern, compiler: StructuredOutputCompiler, random_walk, decode):
    for seed in SEEDS:
        m = compiler.matcher({"schema_type": "regex", "schema": pattern})
        tokens = random_walk(m, seed)
        assert m.is_finished()
        assert re.fullmatch(pattern, decode(tokens)), decode(tokens)


ARITH_GBNF = r"""
root   ::= expr
expr   ::= term (op term){0,3}
term   ::= num | "(" num op num ")"
op     ::= "+" | "-" | "*"
num    ::= [1-9] [0-9]{0,2}
"""
ARITH_RE = r"(\d+|\(\d+[-+*]\d+\))([-+*](\d+|\(\d+[-+*]\d+\))){0,3}"


def _arith_ok(text: str) -> bool:
    """Independent check: a Python expression made only of integer literals and + - *."""
    tree = ast.parse(text, mode="eval")
    allowed = (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult)
    return all(isinstance(n, allowed) for n in ast.walk(tree)) and isinstance(
        eval(compile(tree, "", "eval")), int
    )


def test_ebnf_arithmetic_walks_parse(compiler: StructuredOutputCompiler, random_walk, decode):
    texts = []
    for seed in range(12):
        m = compiler.matcher({"schema_type": "ebnf", "schema": ARITH_GBNF})
        text = decode(random_walk(m, seed, eos_bias=0.1))
        assert m.is_finished()
        assert re.fullmatch(ARITH_RE, text), text
        assert _arith_ok(text), text
        texts.append(text)
    # The walks must have explored the grammar, not only its shortest sentences.
    assert any("(" in t for t in texts) and sum(bool(re.search(r"\d[-+*]", t)) for t in texts) >= 3, texts


LARK = r"""
start: pair ("," pair)*
pair: KEY "=" VALUE
KEY: /[a-z]{1,5}/
VALUE: /[0-9]{1,3}/ | "none"
"""
LARK_RE = r"[a-z]{1,5}=([0-9]{1,3}|none)(,[a-z]{1,5}=([0-9]{1,3}|none))*"


def test_lark_walks_fullmatch(compiler: StructuredOutputCompiler, random_walk, decode):
    texts = []
    for seed in SEEDS:
        m = compiler.matcher({"schema_type": "lark", "schema": LARK})
        text = decode(random_walk(m, seed, eos_bias=0.3))
        assert m.is_finished()
        assert re.fullmatch(LARK_RE, text), text
        texts.append(text)
    assert any("," in t for t in texts), texts
