"""Turning a request's structured output into a grammar over the model's tokens, once per distinct schema.

    structured_output = {"schema_type": "json", "schema": ..., "whitespace": "flexible" | "compact"}
                      | {"schema_type": "regex" | "ebnf" | "lark", "schema": ...}
                      | {"schema_type": "choice", "choices": [str, ...]}
        -> canonical text (cache key)  -> llguidance grammar  -> CompiledGrammar (template matcher)
        -> GrammarMatcher per sample (a deep copy of one of a few templates, taken in turn:
           microseconds; or, with independent_matchers=True, a matcher compiled for that sample
           alone: ~1 ms)

llguidance reads the model's tokenizer.json itself (through the Rust `tokenizers` crate), so no
Python tokenizer object is needed at run time. The tokenizer is built once per compiler, with
the MODEL's logits width: ids past the tokenizer's own vocabulary exist in the logits but have no
bytes, so llguidance never allows them.

A job may carry one schema for every row or one per row; compiled grammars (and the errors of
invalid ones, so a million rows with the same bad schema cost one compilation) sit in a bounded
LRU cache keyed by (schema type, canonical schema text, tokenizer identity).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import llguidance
import torch

from shardinfer.engine.config import usable_cpus
from shardinfer.engine.structured.bitmask import bitmask_width, check_host_bitmask
from shardinfer.engine.structured.matcher import GrammarMatcher, GrammarViolation
from shardinfer.errors import GrammarError

SCHEMA_TYPES = ("json", "regex", "ebnf", "lark", "choice")
JSON_WHITESPACE = ("flexible", "compact")
_SO_KEYS = {"schema_type", "schema", "whitespace", "choices"}
_MAX_ERROR_CHARS = 1000
logger = logging.getLogger(__name__)
_T = TypeVar("_T")
_R = TypeVar("_R")


class _TemplatePool:
    """Up to `size` compiled templates of one grammar; samples are copied from them in turn.

    A copy shares its template's lexer cache, behind that template's lock: copies of ONE template
    fill their masks one at a time however many threads there are. With as many templates as
    mask threads, and each template's copies handed to one thread (the compiler's
    `_per_template`), the threads work side by side and never wait on each other's locks, while
    each template's cache still serves many samples. Templates are compiled on first use, so a
    grammar used by one sample costs one compilation.
    """

    def __init__(
        self, first: llguidance.LLMatcher, tokenizer: llguidance.LLTokenizer, grammar: str, size: int
    ) -> None:
        self._templates = [first]
        self._tokenizer = tokenizer
        self._grammar = grammar
        self.size = size
        self._next = 0
        self._lock = threading.Lock()

    def build(self) -> llguidance.LLMatcher:
        """A matcher compiled from the grammar alone (shares nothing with the templates)."""
        return llguidance.LLMatcher(self._tokenizer, self._grammar, log_level=0)

    def take(self) -> tuple[int, llguidance.LLMatcher]:
        """(index, template) the next sample is copied from (round robin, compiling it if new)."""
        with self._lock:
            i = self._next
            self._next = (i + 1) % self.size
            if i == len(self._templates):
                self._templates.append(self.build())
            return i, self._templates[i]

    def __len__(self) -> int:
        return len(self._templates)


@dataclass(frozen=True)
class CompiledGrammar:
    """A validated grammar bound to one tokenizer; `new_matcher()` starts a sample at its beginning."""

    schema_type: str
    schema_text: str  # canonical text: the cache key together with the type and tokenizer
    grammar: str  # llguidance's grammar definition (what LLMatcher consumes)
    tokenizer_id: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    _templates: _TemplatePool = field(repr=False, compare=False)
    # What llguidance left out of the grammar where the schema asked it to be lenient ("x-guidance":
    # {"lenient": true} ignores unsupported keywords, "coerce_one_of" reads oneOf as anyOf):
    # constraints the output may break.
    warnings: tuple[str, ...] = ()

    def new_matcher(self, independent: bool = False) -> GrammarMatcher:
        """A matcher at the grammar's start: a copy of one of the grammar's templates (sharing that
        template's lexer cache, and its lock, with the other copies of it), or with
        independent=True one built from the grammar alone, which shares nothing (see
        StructuredOutputCompiler)."""
        if independent:
            return GrammarMatcher(self, self._templates.build())
        index, template = self._templates.take()
        return GrammarMatcher(self, template.deep_copy(), template=index)

    @property
    def num_templates(self) -> int:
        """Templates compiled so far (at most the compiler's `templates`)."""
        return len(self._templates)


def canonical_schema(structured_output: Any) -> tuple[str, str]:
    """(schema_type, canonical schema text) of a structured output, or GrammarError naming what is wrong.

    JSON schemas are re-serialised compactly WITHOUT sorting keys: the order of "properties"
    is the order of the generated object's keys, so two schemas differing only in key order
    are different grammars. JSON output allows whitespace between tokens by default, as vLLM's
    llguidance backend does: forced compact JSON is text the model rarely saw, and it pulls weak
    models off their own distribution. `"whitespace": "compact"` asks for compact JSON; it is
    written into the canonical text as llguidance's own per-schema option
    (`"x-guidance": {"whitespace_flexible": false}`), so the text alone decides the grammar.
    A choice is the JSON list of its strings.
    """
    if not isinstance(structured_output, dict):
        raise GrammarError(
            f"structured_output={structured_output!r} must be a dict like "
            '{"schema_type": "json", "schema": {...}}'
        )
    unknown = sorted(set(structured_output) - _SO_KEYS)
    if unknown:
        raise GrammarError(f"structured_output has unknown keys {unknown}; expected only {sorted(_SO_KEYS)}")
    schema_type = structured_output.get("schema_type")
    if schema_type not in SCHEMA_TYPES:
        raise GrammarError(f"structured_output schema_type={schema_type!r} is not one of {SCHEMA_TYPES}")
    if schema_type != "json" and "whitespace" in structured_output:
        raise GrammarError(f'"whitespace" applies to schema_type "json" only, not {schema_type!r}: remove it')
    if schema_type != "choice" and "choices" in structured_output:
        raise GrammarError(
            f'"choices" goes with schema_type "choice", not {schema_type!r}: '
            'use {"schema_type": "choice", "choices": [...]}'
        )
    schema = structured_output.get("schema")
    if schema_type == "json":
        return "json", _canonical_json_schema(schema, structured_output.get("whitespace", "flexible"))
    if schema_type == "choice":
        return "choice", _canonical_choices(structured_output)
    if not isinstance(schema, str) or not schema.strip():
        raise GrammarError(f"{schema_type} schema must be a non-empty string, got {schema!r}")
    return schema_type, schema


def _canonical_json_schema(schema: Any, whitespace: Any) -> str:
    if whitespace not in JSON_WHITESPACE:
        raise GrammarError(
            f"whitespace={whitespace!r} is not one of {JSON_WHITESPACE} "
            "(flexible: whitespace allowed between tokens, the default; compact: none)"
        )
    if schema is None or (isinstance(schema, str) and not schema.strip()) or schema is True:
        schema = {}  # no schema, or JSON Schema's `true`: any JSON value
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(f"json schema is not valid JSON ({e}); pass a dict or a JSON string") from e
    if not isinstance(schema, dict):
        # A pydantic model (class or instance) is the usual slip: its schema is one call away.
        hint = (
            "; for a pydantic model pass Model.model_json_schema()"
            if hasattr(schema, "model_json_schema")
            else ""
        )
        raise GrammarError(f"json schema must be a JSON object (a dict), got {schema!r:.200}{hint}")
    if whitespace == "compact":
        options = schema.get("x-guidance", {})
        if not isinstance(options, dict):
            raise GrammarError(f"json schema's x-guidance={options!r} must be an object")
        if options.get("whitespace_flexible") is True:
            raise GrammarError(
                'whitespace="compact" contradicts the schema\'s "x-guidance": '
                '{"whitespace_flexible": true}: keep one of them'
            )
        schema = {**schema, "x-guidance": {**options, "whitespace_flexible": False}}
    try:
        return json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise GrammarError(f"json schema cannot be serialised as JSON ({e}); use only JSON types") from e


def _canonical_choices(structured_output: dict[str, Any]) -> str:
    if "choices" in structured_output and "schema" in structured_output:
        raise GrammarError('give the choices once, as "choices": [...] (not also as "schema")')
    choices = structured_output.get("choices", structured_output.get("schema"))
    if (
        not isinstance(choices, list | tuple)
        or not choices
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise GrammarError(
            f"choices={choices!r} must be a non-empty list of non-empty strings, "
            'e.g. {"schema_type": "choice", "choices": ["yes", "no"]}'
        )
    return json.dumps(list(choices), ensure_ascii=False)


class StructuredOutputCompiler:
    """Compiles structured outputs for one model's tokenizer; shared by every request of an engine."""

    def __init__(
        self,
        tokenizer_json: str | os.PathLike[str],
        eos_token_ids: Sequence[int],
        vocab_size: int,
        cache_size: int = 256,
        num_threads: int | None = None,
        independent_matchers: bool = False,
        templates: int | None = None,
        parallel_accept: bool | None = None,
    ) -> None:
        """tokenizer_json: the text of tokenizer.json, or its path.
        eos_token_ids: ids that end a sample; allowed exactly when the grammar may end.
        vocab_size: the model's logits width (>= the tokenizer's vocabulary).
        num_threads: threads for batched mask computation; None: llguidance's default, 80% of the
            CPUs the process may use, at least 1 and at most 32.
        templates: how many templates of each grammar sample matchers are copied from, in turn
            (None: one per mask thread). Copies of one template share its lexer cache behind one
            lock, so the batched fill gives each template's copies to one thread of their own
            (a one-thread llguidance executor per template slot): the threads fill side by side,
            and every cache still warms up from many samples.
        independent_matchers: build each sample's matcher from the grammar alone instead of
            copying a template: nothing shared, but each matcher recomputes what copies share
            and takes ~1 ms to build (a copy: ~2 us). Measurements: docs/structured-outputs.md.
        parallel_accept: accept_tokens consumes a batch's tokens on llguidance's thread pool
            (None: when there are at least 4 mask threads).
        """
        text = _read_tokenizer_json(tokenizer_json)
        eos = tuple(int(t) for t in eos_token_ids)
        if not eos:
            raise ValueError("StructuredOutputCompiler needs at least one eos token id (the grammar's end)")
        if any(not 0 <= t < vocab_size for t in eos):
            raise ValueError(f"eos_token_ids={list(eos)} must lie in [0, vocab_size={vocab_size})")
        if cache_size < 1:
            raise ValueError(f"cache_size={cache_size} must be >= 1")
        try:
            self.tokenizer = llguidance.LLTokenizer(text, n_vocab=vocab_size, eos_token=list(eos))
        except (ValueError, RuntimeError) as e:
            raise ValueError(
                f"llguidance cannot build a tokenizer from tokenizer.json with vocab_size={vocab_size} "
                f"(vocab_size must be at least the tokenizer's vocabulary, added tokens included): "
                f"{e}"
            ) from e
        self.vocab_size = vocab_size
        self.eos_token_ids = eos
        digest = hashlib.sha256(text.encode())
        digest.update(json.dumps([list(eos), vocab_size]).encode())
        self.tokenizer_id = digest.hexdigest()[:16]
        self._cache: OrderedDict[tuple[str, str, str], CompiledGrammar | GrammarError] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads={num_threads} must be >= 1 (or None for llguidance's default)")
        if templates is not None and templates < 1:
            raise ValueError(f"templates={templates} must be >= 1 (or None for one per mask thread)")
        self._num_threads = num_threads
        mask_threads = num_threads or default_mask_threads()
        self.templates = templates if templates is not None else mask_threads
        self.independent_matchers = independent_matchers
        # Consuming a token costs a few microseconds per row; on the thread pool a full batch's
        # accepts take less time than one after another once there are a few threads to share.
        self.parallel_accept = mask_threads >= 4 if parallel_accept is None else parallel_accept
        self._executor: llguidance.LLExecutor | None = None
        self._slot_pool: ThreadPoolExecutor | None = None  # see _per_template
        self._slot_executors: list[llguidance.LLExecutor] = []
        self.num_compiles = 0  # distinct compilations done (cache misses), for tests and metrics

    # ---- compiling -----------------------------------------------------------------------
    def compile(self, structured_output: dict[str, Any]) -> CompiledGrammar:
        """The compiled grammar of a structured output (cached); raises GrammarError when it is invalid."""
        schema_type, text = canonical_schema(structured_output)
        key = (schema_type, text, self.tokenizer_id)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
        if hit is None:
            # Compile outside the lock: a big grammar takes milliseconds, other schemas need not wait.
            try:
                hit = self._compile(schema_type, text)
            except GrammarError as e:
                hit = e
            with self._lock:
                hit = self._cache.setdefault(key, hit)
                self._cache.move_to_end(key)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        if isinstance(hit, GrammarError):
            raise GrammarError(str(hit))
        return hit

    def matcher(self, structured_output: dict[str, Any]) -> GrammarMatcher:
        """A fresh matcher at the start of structured_output' grammar; raises GrammarError when it is invalid."""
        return self.compile(structured_output).new_matcher(self.independent_matchers)

    def _compile(self, schema_type: str, text: str) -> CompiledGrammar:
        self.num_compiles += 1
        try:
            if schema_type == "json":
                # Whitespace allowed by default (canonical_schema says why); a schema's own
                # "x-guidance" options, compact output among them, apply over these defaults.
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    text, defaults={"whitespace_flexible": True}
                )
            elif schema_type == "choice":
                grammar = llguidance.grammar_from("choice", text)
            elif schema_type == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(text)
            elif schema_type == "lark":
                grammar = llguidance.LLMatcher.grammar_from_lark(text)
            else:  # ebnf: GBNF (llama.cpp style) converted to Lark by llguidance; Lark text passes through
                grammar = llguidance.grammar_from("ebnf", text)
        except ValueError as e:
            raise GrammarError(_reason(schema_type, str(e)) + _ebnf_hint(schema_type, text)) from e
        template = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if template.is_error():
            raise GrammarError(_reason(schema_type, template.get_error()) + _ebnf_hint(schema_type, text))
        self._check_first_mask(schema_type, template)
        warnings = tuple(template.get_grammar_warnings())
        if warnings:
            # Once per distinct schema (compilations are cached): the user opted into leniency,
            # but must learn which constraints the output is not held to.
            logger.warning(
                "%s schema %.200s compiled with constraints left out, which outputs may break: %s",
                schema_type,
                text,
                "; ".join(warnings),
            )
        return CompiledGrammar(
            schema_type,
            text,
            grammar,
            self.tokenizer_id,
            self.vocab_size,
            self.eos_token_ids,
            _TemplatePool(template, self.tokenizer, grammar, self.templates),
            warnings,
        )

    def _check_first_mask(self, schema_type: str, template: llguidance.LLMatcher) -> None:
        """A grammar no text can match (a regex of an empty character class) passes llguidance's
        checks and fails only at a sample's first mask, as every sample's error; its first mask,
        computed here on a copy of the template, refuses it once, as an invalid schema."""
        probe = template.deep_copy()
        mask = torch.zeros((1, bitmask_width(self.vocab_size)), dtype=torch.int32)
        probe.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * mask.element_size())
        if probe.is_error() or not bool(mask.any()):
            why = probe.get_error().strip().splitlines()[0] if probe.is_error() else "no token is allowed"
            raise GrammarError(_reason(schema_type, f"no output can match it ({why})"))

    # ---- batched masks -------------------------------------------------------------------
    def fill_bitmasks(self, matchers: Sequence[tuple[GrammarMatcher, int]], bitmask: torch.Tensor) -> None:
        """Fill row `row` of `bitmask` for every (matcher, row), on llguidance's thread pool.

        bitmask: contiguous CPU int32 [B, ceil(vocab_size/32)]; rows not named are left as they are.
        One call for the whole batch releases the GIL once and spreads the matchers over threads.
        """
        self._check_bitmask(bitmask)
        pairs = []
        for m, row in matchers:
            if not 0 <= row < bitmask.shape[0]:
                raise ValueError(f"row={row} is outside the bitmask's {bitmask.shape[0]} rows")
            self._check_matcher(m)
            pairs.append((m.ll_matcher, row))
        if not pairs:
            return
        ptr, row_bytes, rows = bitmask.data_ptr(), bitmask.shape[1] * 4, bitmask.shape[0]
        groups = self._by_template([m for m, _ in matchers], pairs)
        if groups is None:
            self._get_executor().unsafe_compute_mask_ptr(pairs, ptr, row_bytes, rows)
        else:
            self._per_template(
                groups, lambda ex, group: ex.unsafe_compute_mask_ptr(group, ptr, row_bytes, rows)
            )

    def accept_tokens(self, pairs: Sequence[tuple[GrammarMatcher, int]]) -> list[GrammarViolation | None]:
        """Advance each matcher by its sampled token; per pair None, or the violation that leaves
        that matcher unusable (the others are advanced all the same).

        With parallel_accept the tokens are consumed in one call on llguidance's thread pool (the
        GIL released once; copies of a template on that template slot's thread, as for masks),
        else one after another: same states either way, since no two pairs share a matcher."""
        results: list[GrammarViolation | None] = [None] * len(pairs)
        todo: list[int] = []
        for i, (m, token) in enumerate(pairs):
            try:
                m.check_acceptable(token)
                todo.append(i)
            except GrammarViolation as e:
                results[i] = e
        if self.parallel_accept and len(todo) > 1:
            items = [(pairs[i][0].ll_matcher, pairs[i][1]) for i in todo]
            groups = self._by_template([pairs[i][0] for i in todo], list(enumerate(items)))
            if groups is None:
                oks = self._get_executor().consume_token_par(items)
            else:  # each group's answers, put back in the order of `todo`
                oks = [False] * len(todo)
                answers = self._per_template(
                    groups, lambda ex, group: ex.consume_token_par([it for _, it in group])
                )
                for (_, group), ok_list in zip(groups, answers, strict=True):
                    for (k, _), ok in zip(group, ok_list, strict=True):
                        oks[k] = ok
        else:
            oks = [pairs[i][0].ll_matcher.consume_token(pairs[i][1]) for i in todo]
        for i, ok in zip(todo, oks, strict=True):
            m, token = pairs[i]
            try:
                m.record_consumed(token, bool(ok))
            except GrammarViolation as e:
                results[i] = e
        return results

    def fill_bitmasks_with_drafts(
        self, items: Sequence[tuple[GrammarMatcher, int, Sequence[int]]], bitmask: torch.Tensor
    ) -> None:
        """Masks for verifying speculative drafts: for each (matcher, row, draft), row `row` gets
        the mask at the matcher's position and row `row + i + 1` the mask after draft[: i + 1].

        Matchers end where they started. Rows past the first draft token the grammar rejects are
        not written (`matcher.validate(draft)` says how many are accepted); those positions are
        discarded by verification anyway.
        """
        self._check_bitmask(bitmask)
        entries = []
        for m, row, draft in items:
            if row < 0 or row + len(draft) >= bitmask.shape[0]:
                raise ValueError(
                    f"rows {row}..{row + len(draft)} for a draft of {len(draft)} tokens do not fit "
                    f"in the bitmask's {bitmask.shape[0]} rows"
                )
            self._check_matcher(m)
            entries.append((m.ll_matcher, row, [int(t) for t in draft]))
        if entries:
            self._get_executor().unsafe_compute_mask_ptr_with_draft_token(
                entries, bitmask.data_ptr(), bitmask.shape[1] * 4, bitmask.shape[0]
            )

    def _check_bitmask(self, bitmask: torch.Tensor) -> None:
        check_host_bitmask(bitmask, self.vocab_size)

    def _check_matcher(self, m: GrammarMatcher) -> None:
        if m.vocab_size != self.vocab_size:
            raise ValueError(
                f"a matcher for vocab_size={m.vocab_size} cannot fill a mask of {self.vocab_size}"
            )
        m._check_usable()

    def _by_template(
        self, matchers: Sequence[GrammarMatcher], items: list[_T]
    ) -> list[tuple[int, list[_T]]] | None:
        """items (one per matcher) grouped by the template slot their matcher was copied from, or
        None when there is nothing to group (one template per grammar, or no copies).

        Copies of one template share its lexer cache behind its lock: on llguidance's pool, whose
        threads take rows regardless of template, they wait on each other. Grouped so that one
        thread serves each slot, a template's copies share the states its cache has built (the
        first row at a new state builds it, the others reuse it) without ever contending."""
        if self.templates <= 1 or all(m.template is None for m in matchers):
            return None
        groups: dict[int, list[_T]] = {}
        for k, (m, item) in enumerate(zip(matchers, items, strict=True)):
            slot = (m.template if m.template is not None else k) % self.templates
            groups.setdefault(slot, []).append(item)
        return sorted(groups.items())

    def _per_template(
        self, groups: list[tuple[int, list[_T]]], call: Callable[[llguidance.LLExecutor, list[_T]], _R]
    ) -> list[_R]:
        """call(slot's one-thread executor, group) for every group, the groups side by side on
        one Python thread per slot (llguidance releases the GIL); results in group order."""
        with self._lock:
            if self._slot_pool is None:
                self._slot_executors = [llguidance.LLExecutor(num_threads=1) for _ in range(self.templates)]
                self._slot_pool = ThreadPoolExecutor(self.templates, thread_name_prefix="shardinfer-grammar")
        pool, executors = self._slot_pool, self._slot_executors
        if len(groups) == 1:  # nothing to run side by side
            slot, group = groups[0]
            return [call(executors[slot], group)]
        futures = [pool.submit(call, executors[slot], group) for slot, group in groups]
        return [f.result() for f in futures]

    def _get_executor(self) -> llguidance.LLExecutor:
        if self._executor is None:
            self._executor = llguidance.LLExecutor(num_threads=self._num_threads)
        return self._executor

    def cache_info(self) -> dict[str, int]:
        with self._lock:
            return {
                "entries": len(self._cache),
                "max_entries": self._cache_size,
                "compiles": self.num_compiles,
            }


def default_mask_threads() -> int:
    """llguidance's default executor size: 80% of the CPUs the process may use, 1 to 32."""
    return max(1, min(32, usable_cpus() * 4 // 5))


def _read_tokenizer_json(source: str | os.PathLike[str]) -> str:
    """tokenizer.json's text from either its text or its path."""
    if isinstance(source, str) and source.lstrip().startswith("{"):
        return source
    path = Path(source)
    try:
        is_file = path.is_file()
    except OSError:  # e.g. a long string that is neither JSON nor a usable path
        is_file = False
    if not is_file:
        raise ValueError(
            f"tokenizer_json={str(source)[:200]!r} is neither tokenizer.json text nor a file path"
        )
    return path.read_text(encoding="utf-8")


# A GBNF rule definition `name ::=` at the start of a line; `root` is where the output starts.
_GBNF_RULE = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*::=", re.MULTILINE)


def _ebnf_hint(schema_type: str, text: str) -> str:
    """The likely fix of a failed GBNF grammar without a `root` rule: llguidance then takes the text
    for Lark (when it has a `start` rule) and reports a Lark syntax error at `::=`, which hides
    the actual slip."""
    rules = _GBNF_RULE.findall(text) if schema_type == "ebnf" else []
    if not rules or "root" in rules:
        return ""
    return (
        f" (the grammar defines {', '.join(map(repr, rules[:5]))} but no rule 'root': a GBNF "
        "grammar starts at `root ::= ...`; rename its start rule to root)"
    )


def _reason(schema_type: str, message: str) -> str:
    message = message.strip()
    if len(message) > _MAX_ERROR_CHARS:
        message = message[:_MAX_ERROR_CHARS] + " ..."
    return f"invalid {schema_type} schema: {message}"
