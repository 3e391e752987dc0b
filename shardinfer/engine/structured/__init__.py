"""Structured outputs: grammar-constrained sampling through llguidance.

`StructuredOutputCompiler` turns a request's structured output (JSON Schema, regex, GBNF, Lark or a choice) into a
`CompiledGrammar`; each sample walks it with a `GrammarMatcher`, whose packed token bitmask is
applied to the logits (`apply_bitmask`) before sampling. See docs/structured-outputs.md.
"""

from shardinfer.engine.structured.bitmask import (
    allocate_bitmask,
    apply_bitmask,
    bitmask_width,
    unpack_bitmask,
)
from shardinfer.engine.structured.compiler import (
    SCHEMA_TYPES,
    CompiledGrammar,
    GrammarError,
    StructuredOutputCompiler,
    canonical_schema,
)
from shardinfer.engine.structured.matcher import GrammarMatcher, GrammarViolation

__all__ = [
    "SCHEMA_TYPES",
    "CompiledGrammar",
    "GrammarError",
    "GrammarMatcher",
    "GrammarViolation",
    "StructuredOutputCompiler",
    "allocate_bitmask",
    "apply_bitmask",
    "bitmask_width",
    "canonical_schema",
    "unpack_bitmask",
]
