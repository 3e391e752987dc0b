"""Score jobs' rows: an input row becomes scoring spans, and finished spans become output records.

A row with a context and continuations gives one span (and one output record) per continuation;
a row with a document gives one span per rolling window and one output record for the document.
As for generation, everything wrong with one row (a null or non-string cell, a text that
tokenises to nothing, a span longer than the model takes) becomes that row's error record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from shardinfer.errors import EMPTY_PROMPT, INVALID_REQUEST, INVALID_ROW, PROMPT_TOO_LONG, TOKENIZER_ERROR
from shardinfer.pipeline.config import InputSection
from shardinfer.pipeline.rows import PreparedRow, RowError, RowPreparer, Tokenizer, id_is_missing
from shardinfer.pipeline.scoring import (
    SPAN_RULE,
    ScoreInputError,
    Span,
    SpanScore,
    encode_text,
    longest_rolling_window,
    max_span_tokens,
    prefix_token_id,
    rolling_window_refusal,
    rolling_windows,
    split_pair,
)
from shardinfer.splits import ROW_ERROR_COLUMN


@dataclass
class ScoreRow(PreparedRow):
    """A prepared row of a score job: its spans and the texts whose bytes are counted."""

    spans: list[Span] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # one per output record
    rolling: bool = False


class ScorePreparer:
    """Tokenises score rows (the harness's convention, see scoring.py); thread-safe like RowPreparer."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_model_len: int,
        input_section: InputSection,
        window_tokens: int,
        span_rule: str = SPAN_RULE,
    ) -> None:
        """`span_rule`: the span limits the job was planned with (scoring.SPAN_RULE)."""
        self.tokenizer: Any = tokenizer
        self.inp = input_section
        self.max_model_len = max_model_len
        self.max_span = max_span_tokens(max_model_len, span_rule)
        # A window's span is window + 1 tokens (its input positions and the last scored token).
        refusal = rolling_window_refusal(window_tokens, max_model_len, span_rule)
        if refusal is not None:
            raise ValueError(refusal)
        self.window = window_tokens or longest_rolling_window(max_model_len, span_rule)
        self._ids = RowPreparer(tokenizer, max_model_len, {}, input_section, 0)
        # Columns of the batch being prepared whose values the reader wrote as JSON text (see
        # `note_schema`): their strings are lists or objects, not texts to score.
        self._json_text: frozenset[str] = frozenset()

    def note_schema(self, schema: pa.Schema) -> None:
        """Called with each read batch's schema before its rows are prepared. A JSONL column whose
        lines mix shapes (a list of choices in some, an empty or null one in others) arrives as JSON
        text: a continuations string of such a column is a list to parse, and a context or document
        string of one is no text at all."""
        from shardinfer.readers.jsonl_source import is_json_text

        self._json_text = frozenset(f.name for f in schema if is_json_text(f))

    def prepare(self, split_index: int, file_index: int, pos: int, row: dict[str, Any]) -> ScoreRow:
        row_id = self._ids.row_id(row, file_index)
        passthrough = {c: row.get(c) for c in self.inp.passthrough_columns}
        prepared = ScoreRow(split_index, pos, row_id, 1, [None], passthrough)
        try:
            unreadable = row.get(ROW_ERROR_COLUMN)  # the reader could not decode a cell of this row
            if unreadable is not None:
                raise RowError(INVALID_ROW, unreadable)
            id_value = row.get(self.inp.id_column) if self.inp.id_column else None
            if self.inp.id_column and id_is_missing(id_value):
                missing = "null" if id_value is None else "NaN"
                raise RowError(
                    INVALID_ROW,
                    f"id_column {self.inp.id_column!r} is {missing} in this row; "
                    "every row needs an id (row_id falls back to file:row)",
                )
            if self.inp.document_column:
                self._document(prepared, row)
            else:
                self._pairs(prepared, row)
        except RowError as err:
            prepared.error = err
            prepared.spans = []
        return prepared

    def _text(self, row: dict[str, Any], column: str) -> str:
        value = row.get(column)
        if value is None:
            raise RowError(EMPTY_PROMPT, f"column {column!r} is null")
        if column in self._json_text:
            value = json.loads(value)
        if not isinstance(value, str):
            raise RowError(INVALID_ROW, f"column {column!r} holds {type(value).__name__}, expected a string")
        return value

    def _continuations(self, row: dict[str, Any]) -> list[str]:
        """The row's continuations: a string is one, a list of strings is several."""
        column = self.inp.continuations_column
        raw = row.get(column)
        if isinstance(raw, str) and column in self._json_text:
            raw = json.loads(raw)
        conts = [raw] if isinstance(raw, str) else raw
        if not isinstance(conts, list) or not conts:
            raise RowError(
                INVALID_ROW,
                f"column {column!r} must hold a string or a non-empty list of strings, got {raw!r:.80}",
            )
        for j, cont in enumerate(conts):
            if not isinstance(cont, str):
                got = "null" if cont is None else f"{type(cont).__name__} {cont!r:.40}"
                raise RowError(
                    INVALID_ROW,
                    f"column {column!r}: continuation {j} is {got}; every continuation must be a string",
                )
        return conts

    def _pairs(self, prepared: ScoreRow, row: dict[str, Any]) -> None:
        # The continuations first: a row whose context cannot be scored still gets one error
        # record per continuation, as a row with one bad continuation does.
        conts = self._continuations(row)
        prepared.n = len(conts)
        prepared.seeds = [None] * len(conts)
        prepared.texts = list(conts)
        context = self._text(row, self.inp.context_column)
        if context and not context.strip():
            # Named as the context's fault, not as the first continuation's (split_pair's message).
            raise RowError(
                EMPTY_PROMPT,
                f"column {self.inp.context_column!r} holds only whitespace: give an empty context (the "
                "continuations are then scored after the BOS token) or some text",
            )
        for j, cont in enumerate(conts):
            try:
                span = split_pair(self.tokenizer, context, cont)
            except ScoreInputError as exc:
                raise RowError(EMPTY_PROMPT, f"continuation {j}: {exc}") from None
            except Exception as exc:  # tokenizers raise bare Exceptions on odd input
                raise RowError(TOKENIZER_ERROR, f"tokenizer failed: {exc}") from None
            self._check_length(span, f"continuation {j}")
            prepared.spans.append(span)

    def _document(self, prepared: ScoreRow, row: dict[str, Any]) -> None:
        text = self._text(row, self.inp.document_column)
        try:
            tokens = encode_text(self.tokenizer, text)
            prefix = prefix_token_id(self.tokenizer)
        except ScoreInputError as exc:
            raise RowError(INVALID_REQUEST, str(exc)) from None
        except Exception as exc:  # tokenizers raise bare Exceptions on odd input
            raise RowError(TOKENIZER_ERROR, f"tokenizer failed: {exc}") from None
        if not tokens:
            raise RowError(EMPTY_PROMPT, f"document column {self.inp.document_column!r} tokenises to nothing")
        prepared.rolling = True
        prepared.texts = [text]
        prepared.spans = rolling_windows(tokens, prefix, self.window)

    def _check_length(self, span: Span, what: str) -> None:
        if len(span.prompt_ids) > self.max_span:
            raise RowError(
                PROMPT_TOO_LONG,
                f"{what}: context and continuation have {len(span.prompt_ids)} tokens; the engine scores at "
                f"most {self.max_span} (max_model_len={self.max_model_len}): shorten the context or raise "
                "engine.max_model_len",
            )


def score_error_record(row: PreparedRow, index: int, code: str, message: str) -> dict[str, Any]:
    return {
        "row_id": row.row_id,
        "continuation_index": index,
        "status": "error",
        "error_code": code,
        "error_message": message,
        **row.passthrough,
    }


def pair_record(row: ScoreRow, index: int, score: SpanScore) -> dict[str, Any]:
    span = row.spans[index]
    return _ok_record(row, index, span.continuation_ids, [score], len(span.prompt_ids), None)


def document_record(row: ScoreRow, scores: list[SpanScore]) -> dict[str, Any]:
    tokens: list[int] = []
    windows = []
    for span in row.spans:
        windows.append(
            {
                "first_token": len(tokens),
                "num_tokens": len(span.continuation_ids),
                "context_tokens": len(span.context_ids),
            }
        )
        tokens += span.continuation_ids
    read = sum(len(s.prompt_ids) for s in row.spans)
    return _ok_record(row, 0, tokens, scores, read, windows)


def _ok_record(
    row: ScoreRow,
    index: int,
    token_ids: list[int],
    scores: list[SpanScore],
    prompt_tokens: int,
    windows: list[dict[str, int]] | None,
) -> dict[str, Any]:
    logprobs = [lp for s in scores for lp in s.token_logprobs]
    return {
        "row_id": row.row_id,
        "continuation_index": index,
        "status": "ok",
        "error_code": None,
        "error_message": None,
        "logprob_sum": float(sum(s.logprob_sum for s in scores)),
        "is_greedy": all(s.is_greedy for s in scores),
        "num_tokens": len(token_ids),
        "num_bytes": len(row.texts[index].encode("utf-8")),
        "token_ids": token_ids,
        "token_logprobs": logprobs,
        "prompt_tokens": prompt_tokens,
        "windows": windows,
        **row.passthrough,
    }
