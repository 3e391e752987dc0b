"""Self-check of structured outputs: sample under each schema type and validate every output.

    python examples/structured_selfcheck.py                      # a tiny random-init model, built here
    python examples/structured_selfcheck.py --model DIR --device cuda --samples 16

With a random model every valid output is the grammar mask's doing; with a real model the same
check shows the masks do not get in the way. Exits 1 if any finished output fails its validator
(outputs cut by max_tokens, finish_reason "length", are counted but not validated).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from shardinfer import LLM, SamplingParams

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"},
        "languages": {
            "type": "array",
            "items": {"enum": ["en", "fr", "de", "zh"]},
            "minItems": 1,
            "maxItems": 3,
        },
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "zip": {"type": "integer", "minimum": 10000, "maximum": 99999},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "email", "languages", "address"],
    "additionalProperties": False,
}
DATE = r"20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
ARITH = 'root ::= expr\nexpr ::= term (("+" | "-" | "*") term){0,4}\nterm ::= [1-9] [0-9]? | "(" expr ")"\n'
CSV = 'start: row ("\\n" row){0,2}\nrow: CELL ("," CELL){2}\nCELL: /[a-z]{1,6}/ | /[0-9]{1,4}/\n'


def _check_json(text: str) -> None:
    value = json.loads(text)
    try:
        import jsonschema
    except ImportError:  # jsonschema is a test dependency; fall back to the required keys
        missing = [k for k in PERSON["required"] if k not in value]
        if missing:
            raise ValueError(f"missing keys {missing}") from None
        return
    jsonschema.validate(value, PERSON)


def _check_regex(text: str) -> None:
    if not re.fullmatch(DATE, text):
        raise ValueError("does not match the date pattern")


def _check_arith(text: str) -> None:
    tree = ast.parse(text, mode="eval")
    allowed = (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult)
    if not all(isinstance(n, allowed) for n in ast.walk(tree)):
        raise ValueError("not an integer + - * expression")


def _check_csv(text: str) -> None:
    if not re.fullmatch(r"([a-z]{1,6}|[0-9]{1,4})(,([a-z]{1,6}|[0-9]{1,4})){2}(\n.*){0,2}", text, re.DOTALL):
        raise ValueError("not 1-3 rows of 3 cells")
    for row in text.split("\n"):
        if not re.fullmatch(r"([a-z]{1,6}|[0-9]{1,4})(,([a-z]{1,6}|[0-9]{1,4})){2}", row):
            raise ValueError(f"bad row {row!r}")


CASES: list[tuple[str, str, dict[str, Any], Callable[[str], None]]] = [
    ("json", "Describe a person as JSON: ", {"schema_type": "json", "schema": PERSON}, _check_json),
    ("regex", "A date: ", {"schema_type": "regex", "schema": DATE}, _check_regex),
    ("ebnf", "An arithmetic expression: ", {"schema_type": "ebnf", "schema": ARITH}, _check_arith),
    ("lark", "A small CSV: ", {"schema_type": "lark", "schema": CSV}, _check_csv),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a local HF model directory (default: build a tiny random-init one)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--samples", type=int, default=8, help="samples per schema type")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    model = args.model
    if model is None:
        from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint

        model = str(make_tiny_checkpoint(tempfile.mkdtemp(prefix="so-selfcheck-"), "llama", seed=args.seed))
    llm = LLM(model, device=args.device, dtype=args.dtype)
    prompts = [prompt for _, prompt, _, _ in CASES]
    params = [
        SamplingParams(
            temperature=args.temperature,
            max_tokens=args.max_tokens,
            n=args.samples,
            seed=args.seed,
            structured_output=so,
        )
        for _, _, so, _ in CASES
    ]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    failures = 0
    for (name, _, _, check), out in zip(CASES, outputs, strict=True):
        valid = cut = 0
        for c in out.outputs:
            if c.finish_reason == "length":
                cut += 1
                continue
            try:
                check(c.text)
                valid += 1
            except (ValueError, SyntaxError) as exc:
                failures += 1
                print(f"  INVALID {name} ({c.finish_reason}): {c.text!r}: {exc}")
        print(
            f"{name:6s} valid {valid}/{len(out.outputs)}  cut by max_tokens {cut}  e.g. {out.outputs[0].text!r}"
        )
    tokens = sum(len(c.token_ids) for out in outputs for c in out.outputs)
    print(f"{tokens} tokens in {elapsed:.1f}s; {'FAIL' if failures else 'OK'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
