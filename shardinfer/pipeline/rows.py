"""Turn one input row into engine requests, or into the reason it cannot be one.

Runs on the preparation thread, never the engine's: chat templating and tokenisation are pure
CPU work that would otherwise stall decode steps. Every failure here is a property of the row
(null prompt, bad override value, too long, a value the reader could not decode, a request over
the per-row limits of row_limits.py, a value nested too deeply), so it becomes an error record
with a stable `error_code` and the job goes on; only job-level mistakes (a missing column, a
`[sampling]` section over the limits) raise.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shardinfer.engine.chat_messages import MessageError, normalize_messages
from shardinfer.engine.prompt_checks import LENGTH_FIX, check_prompt
from shardinfer.engine.sampling_params import SamplingParams
from shardinfer.engine.seeds import sample_seeds
from shardinfer.errors import (
    BAD_OVERRIDE,
    EMPTY_PROMPT,
    INVALID_ROW,
    INVALID_SCHEMA,
    TEMPLATE_ERROR,
    TOKENIZER_ERROR,
    ConfigError,
    RequestError,
    RowError,
)
from shardinfer.pipeline.config import InputSection
from shardinfer.pipeline.row_limits import LimitError, check_depth, check_limits
from shardinfer.splits import ROW_ERROR_COLUMN, ROW_INDEX_COLUMN

# The override columns that hold a structured-output schema (its name, and its older alias).
_SCHEMA_COLUMNS = ("structured_output", "so_args")


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        *,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> str: ...


@dataclass
class PreparedRow:
    """One input row, ready for the engine (or already an error), with its place in its split."""

    split_index: int
    pos: int  # position of the row inside its split: output order is input order
    row_id: str
    n: int  # output records this row produces (one per sample)
    seeds: list[int | None]
    passthrough: dict[str, Any]
    prompt_ids: list[int] | None = None
    params: list[SamplingParams] = field(default_factory=list)  # one per sample, n=1, seeded
    error: RowError | None = None


def id_is_missing(id_value: Any) -> bool:
    """Whether an id cell holds no id: null, or a float NaN (how pandas stores a missing value in a
    numeric column; as text it would be the id "nan", shared by every such row)."""
    return id_value is None or (isinstance(id_value, float) and math.isnan(id_value))


def row_id_of(id_value: Any, file_index: int, row_index: int) -> str:
    """A row's id: its id column's value as text, or `"{file_index}:{row_index}"` without one (or
    where it is missing: such a row becomes an error record under that id)."""
    return f"{file_index}:{row_index}" if id_is_missing(id_value) else str(id_value)


def parse_messages(value: Any, column: str) -> list[dict[str, Any]]:
    """A messages cell as the chat template takes it: a list of {role, content} structs or maps, or
    its JSON text. RowError when the cell holds none: EMPTY_PROMPT for a null or an empty list (no
    turn to answer), INVALID_ROW for anything else (text that is not JSON, JSON of another shape)."""
    if value is None:
        raise RowError(EMPTY_PROMPT, f"messages column {column!r} is null")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RowError(
                INVALID_ROW,
                f"messages column {column!r} holds a string that is not JSON ({exc}): {short_cell(value)}; "
                'write the messages as a JSON list of {"role": ..., "content": ...} objects',
            ) from None
    if isinstance(value, list) and not value:  # nothing to continue from, as a null
        raise RowError(EMPTY_PROMPT, f"messages column {column!r} is an empty list")
    try:
        check_depth("messages", value)
        return normalize_messages(_maps_as_dicts(value))
    except (LimitError, MessageError) as exc:
        raise RowError(INVALID_ROW, f"messages column {column!r}: {exc}") from None


def is_conversation_text(value: Any) -> bool:
    """Whether a cell is a chat conversation written as JSON text: a non-empty JSON list of objects
    that each have a "role" and a "content". A prompt column holding such cells is chat data named
    as prompt text: its JSON would reach the model as written, never through the chat template."""
    if not isinstance(value, str) or not value.lstrip().startswith("["):
        return False  # most prompts: decided without parsing them
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        return False
    if not isinstance(parsed, list) or not parsed:
        return False
    return all(isinstance(message, dict) and "role" in message and "content" in message for message in parsed)


class RowPreparer:
    """Formats, tokenises and parameterises rows for one job; thread-safe (no mutable state)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_model_len: int,
        sampling: dict[str, Any] | SamplingParams,
        input_section: InputSection,
        job_seed: int,
        length_fix: str = LENGTH_FIX,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.length_fix = length_fix  # what a too-long prompt's error suggests (prompt_checks.length_fix)
        # The job's resolved sampling (checkpoint defaults included), or [sampling] as a dict.
        try:
            self.base = sampling if isinstance(sampling, SamplingParams) else SamplingParams(**sampling)
        except ValueError as exc:
            raise ConfigError(f"[sampling]: {exc}") from None
        self.inp = input_section
        self.job_seed = job_seed
        # Validated params per distinct set of override values: rows repeating a value (a
        # max_tokens column, say) skip building and checking SamplingParams again. Shared by
        # the preparation thread only; a race would at worst build one twice.
        self._override_cache: dict[tuple[tuple[str, str, Any], ...], SamplingParams] = {}
        try:
            # Not against max_model_len: a checkpoint's generation config may default max_tokens
            # past it, and generation simply ends there; a row that asks for more is refused.
            check_limits(self.base)
        except LimitError as exc:
            raise ConfigError(f"[sampling]: {exc}") from None

    def row_id(self, row: dict[str, Any], file_index: int) -> str:
        value = row.get(self.inp.id_column) if self.inp.id_column else None
        return row_id_of(value, file_index, row[ROW_INDEX_COLUMN])

    def prepare_batch(
        self, split_index: int, file_index: int, first_pos: int, rows: Sequence[dict[str, Any]]
    ) -> list[PreparedRow]:
        """`prepare` of consecutive rows, their text prompts tokenised in one batch call (which runs
        outside the interpreter lock, in parallel); any row that call cannot take is tokenised
        alone, so a failure stays that row's error record."""
        encoded: list[list[int] | None] = [None] * len(rows)
        batch_encode = getattr(self.tokenizer, "encode_batch", None)
        if batch_encode is not None and not self.inp.messages_column:
            column = self.inp.prompt_column
            picked = [i for i, row in enumerate(rows) if isinstance(row.get(column), str) and row[column]]
            try:
                ids = batch_encode([rows[i][column] for i in picked], add_special_tokens=True)
            except Exception:  # one odd text fails the whole call: fall back to row by row
                ids = [None] * len(picked)
            for i, one in zip(picked, ids, strict=True):
                encoded[i] = one
        return [
            self.prepare(split_index, file_index, first_pos + k, row, encoded[k])
            for k, row in enumerate(rows)
        ]

    def prepare(
        self,
        split_index: int,
        file_index: int,
        pos: int,
        row: dict[str, Any],
        encoded: list[int] | None = None,
    ) -> PreparedRow:
        """One row as requests, or an error record; `encoded`: its text prompt already tokenised."""
        try:
            return self._prepare(split_index, file_index, pos, row, encoded)
        except RecursionError:
            # A value nested deeper than some library's recursive walk can go (json, Arrow, jinja):
            # the row's problem, whatever step met it.
            error = RowError(INVALID_ROW, "a value in this row is nested too deeply to process; flatten it")
            row_id = f"{file_index}:{row[ROW_INDEX_COLUMN]}"
            passthrough = {c: None for c in self.inp.passthrough_columns}
            return self._error_row(split_index, pos, row_id, passthrough, error)

    def _error_row(
        self, split_index: int, pos: int, row_id: str, passthrough: dict[str, Any], error: RowError
    ) -> PreparedRow:
        """A row that fails before its own `n` is known: the job's `n` error records."""
        n = self.base.n
        return PreparedRow(split_index, pos, row_id, n, [None] * n, passthrough, error=error)

    def _prepare(
        self, split_index: int, file_index: int, pos: int, row: dict[str, Any], encoded: list[int] | None
    ) -> PreparedRow:
        row_id = self.row_id(row, file_index)
        passthrough = {c: row.get(c) for c in self.inp.passthrough_columns}
        unreadable = row.get(ROW_ERROR_COLUMN)
        if unreadable is not None:
            return self._error_row(split_index, pos, row_id, passthrough, RowError(INVALID_ROW, unreadable))
        try:
            params = self._params(row)
        except RowError as err:
            # An error record still carries its seed: the job's derivation, unless the row's own
            # seed override is what cannot be read.
            failed = self._error_row(split_index, pos, row_id, passthrough, err)
            seed = self._row_seed_or_none(row)
            if seed is not None:
                failed.seeds = list(sample_seeds(seed, failed.n, row_id))
            return failed
        base_seed = params.seed if params.seed is not None else self.job_seed
        seeds: list[int | None] = list(sample_seeds(base_seed, params.n, row_id))
        prepared = PreparedRow(split_index, pos, row_id, params.n, seeds, passthrough)
        id_value = row.get(self.inp.id_column) if self.inp.id_column else None
        if self.inp.id_column and id_is_missing(id_value):
            prepared.error = RowError(
                INVALID_ROW,
                f"id_column {self.inp.id_column!r} is {'null' if id_value is None else 'NaN'} in this row; "
                "every row needs an id (row_id falls back to file:row)",
            )
            return prepared
        try:
            prepared.prompt_ids = self._prompt_ids(row, encoded)
        except RowError as err:
            prepared.error = err
            return prepared
        prepared.params = [_seeded(params, s, first=j == 0) for j, s in enumerate(seeds) if s is not None]
        return prepared

    def _row_seed_or_none(self, row: dict[str, Any]) -> int | None:
        """The seed a row's samples derive from (its seed override, else the job seed's base), or
        None when its seed override is there but unusable."""
        value = row.get("seed") if "seed" in self.inp.override_columns else None
        if value is None:
            return self.base.seed if self.base.seed is not None else self.job_seed
        try:
            seed = self._coerce("seed", value)
            self.base.replace(seed=seed)
        except (TypeError, ValueError, OverflowError):
            return None
        return int(seed)

    def _params(self, row: dict[str, Any]) -> SamplingParams:
        changes: dict[str, Any] = {}
        for name in self.inp.override_columns:
            value = row.get(name)
            if value is None:
                continue
            try:
                changes[name] = self._coerce(name, value)
            except RecursionError:
                raise RowError(INVALID_SCHEMA, f"column {name!r} is nested too deeply to parse") from None
            except LimitError as exc:
                raise RowError(
                    INVALID_SCHEMA if name in _SCHEMA_COLUMNS else BAD_OVERRIDE, str(exc)
                ) from None
            except (TypeError, ValueError, OverflowError) as exc:
                raise RowError(BAD_OVERRIDE, f"column {name!r} value {short_cell(value)}: {exc}") from None
        if not changes:
            return self.base
        rows_tokens = changes.get("max_tokens")
        if isinstance(rows_tokens, int) and rows_tokens < 1:
            # Checked here, not by SamplingParams, whose message offers 0 for prompt-only scoring:
            # an engine request, never a generated row.
            raise RowError(
                BAD_OVERRIDE,
                f"column 'max_tokens' value {rows_tokens}: a row generates at least one token; "
                "give max_tokens >= 1 or null for the job's",
            )
        key = _cache_key(changes)
        cached = self._override_cache.get(key) if key is not None else None
        if cached is not None:
            return cached
        try:
            params = self.base.replace(**changes)
        except (TypeError, ValueError, OverflowError) as exc:
            raise RowError(BAD_OVERRIDE, str(exc)) from None
        try:
            check_limits(params, self.max_model_len)
        except LimitError as exc:
            code = INVALID_SCHEMA if exc.field in _SCHEMA_COLUMNS else BAD_OVERRIDE
            raise RowError(code, f"{exc}; see the per-row limits in docs/jobs.md") from None
        if key is not None:
            if len(self._override_cache) >= _OVERRIDE_CACHE_SIZE:
                self._override_cache.clear()
            self._override_cache[key] = params
        return params

    def _coerce(self, name: str, value: Any) -> Any:
        """Convert an Arrow/JSON cell into the SamplingParams field's type, strictly."""
        if name in ("stop", "stop_token_ids"):
            if isinstance(value, str) and name == "stop":
                return [value]
            if not isinstance(value, list | tuple):
                raise TypeError(f"expected a list for {name}")
            return list(value)
        if name in _SCHEMA_COLUMNS:
            if isinstance(value, str):
                value = json.loads(value)
            check_depth(name, value)
            if not isinstance(value, dict):
                raise TypeError('expected a JSON object like {"schema_type": "json", "schema": ...}')
            return value
        if isinstance(value, bool) and name not in (
            "ignore_eos",
            "skip_special_tokens",
            "include_stop_str_in_output",
        ):
            raise TypeError(f"expected a number for {name}, got a boolean")
        if name in ("seed", "max_tokens", "min_tokens", "top_k", "n"):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"expected an integer for {name}")
            return int(value)
        if name in (
            "temperature",
            "top_p",
            "min_p",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
        ):
            result = float(value)
            if result != result:  # NaN passes every range check by comparing false; reject it here
                raise ValueError(f"{name} is NaN")
            return result
        return value

    def _prompt_ids(self, row: dict[str, Any], encoded: list[int] | None = None) -> list[int]:
        inp = self.inp
        if inp.messages_column:
            messages = parse_messages(row.get(inp.messages_column), inp.messages_column)
            try:
                text = self.tokenizer.apply_chat_template(
                    messages,
                    add_generation_prompt=True,
                    chat_template_kwargs=self.inp.chat_template_kwargs or None,
                )
                ids = self.tokenizer.encode(text, add_special_tokens=False)
            except Exception as exc:  # a template or tokenizer failure is this row's problem
                raise RowError(TEMPLATE_ERROR, f"chat template failed: {exc}") from None
        else:
            prompt = row.get(inp.prompt_column)
            if prompt is None or prompt == "":
                raise RowError(EMPTY_PROMPT, f"prompt column {inp.prompt_column!r} is null or empty")
            if not isinstance(prompt, str):
                raise RowError(
                    INVALID_ROW,
                    f"prompt column {inp.prompt_column!r} holds {type(prompt).__name__}, expected a string",
                )
            try:
                ids = (
                    encoded if encoded is not None else self.tokenizer.encode(prompt, add_special_tokens=True)
                )
            except Exception as exc:  # tokenizers raise bare Exceptions on odd input
                raise RowError(TOKENIZER_ERROR, f"tokenizer failed: {exc}") from None
        try:
            check_prompt(ids, self.max_model_len, self.length_fix)
        except RequestError as exc:
            raise RowError.of(exc, prompt_tokens=len(ids)) from None
        return ids


_OVERRIDE_CACHE_SIZE = 4096


def _cache_key(changes: dict[str, Any]) -> tuple[tuple[str, str, Any], ...] | None:
    """A hashable key of override values, or None when one is a list or dict (not cached).
    The type is part of the key: 1, 1.0 and True are equal in Python but not as parameters."""
    items = tuple(sorted((name, type(v).__name__, v) for name, v in changes.items()))
    try:
        hash(items)
    except TypeError:
        return None
    return items


def _seeded(params: SamplingParams, seed: int, first: bool) -> SamplingParams:
    """`params.replace(n=1, seed=seed)` without validating again: `params` is valid, n=1 is, and
    derived seeds are 63-bit by construction. A shallow copy: nothing mutates params' lists. The
    values SamplingParams caches (greedy, has_penalties) depend on none of the fields changed here,
    so they are copied with the rest.

    Prompt logprobs are a property of the row, not of a sample: only the first sample asks for
    them (the output stores them once per row), so the others skip that work and may reuse the
    first one's cached prompt blocks."""
    out = object.__new__(SamplingParams)
    out.__dict__.update(params.__dict__, n=1, seed=seed)
    if not first:
        out.__dict__["prompt_logprobs"] = None
    return out


def _maps_as_dicts(value: Any) -> Any:
    """`value` with each Arrow map cell, which Python sees as a list of (key, value) tuples, made a
    dict: a messages column written as `array<map<string, string>>` (as Spark often writes chat
    data) holds its messages that way. JSON never gives tuples, so nothing else is changed.
    Recursive: the caller has bounded the depth (check_depth)."""
    if isinstance(value, list):
        if value and all(isinstance(item, tuple) and len(item) == 2 for item in value):
            return {key: _maps_as_dicts(item) for key, item in value}
        return [_maps_as_dicts(item) for item in value]
    if isinstance(value, dict):
        return {key: _maps_as_dicts(item) for key, item in value.items()}
    return value


def short_cell(value: Any, limit: int = 120) -> str:
    """A cell for an error message: its repr cut to `limit` characters (a cell may be megabytes)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
