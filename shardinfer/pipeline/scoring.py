"""Loglikelihood scoring: continuations after a context, and whole documents in rolling windows.

A span is one prompt-only engine request (max_tokens=0): `context_ids + continuation_ids` as the
prompt, with prompt logprobs asked from the first continuation position on. The engine then
computes logits only for the continuation, and the context's KV may come from the prefix cache, so
the continuations of one context cost one prefill of that context. The span's last token is only
a target, never fed, as in the harness's hf model (`(context + continuation)[:-1]` is its input):
a span may hold max_model_len + 1 tokens, and a rolling window max_model_len input positions.

Tokenisation follows lm-evaluation-harness, so that a score here equals the harness's for the
same text and model:
- trailing whitespace of the context moves to the front of the continuation ("Q: 2+2 =" / " 4");
- the whole text and the context are tokenised separately, and the continuation is the whole's
  tokens past the context's: the split point is exact even where a token spans the boundary;
- a text gets the tokenizer's special tokens unless it already starts with the prefix token's
  text (a chat-templated prompt carries its own BOS);
- an empty context is the prefix token (BOS, else EOS), the continuation tokenised alone.

Rolling windows (perplexity) follow the harness's rule: every document token is predicted
exactly once; the first window predicts up to `window` tokens after the prefix token, each later
window predicts the next `window` tokens at most, with as much of the preceding text as context
as fits in `window` input positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from shardinfer.engine.outputs import RequestOutput
from shardinfer.engine.sampling_params import SamplingParams

# max_tokens=0: score the prompt and sample nothing, so the span's last token is never fed; top-1
# prompt logprobs give the argmax. Greedy and seeded all the same, so no default draws randomness.
SCORE_PARAMS = SamplingParams(temperature=0.0, max_tokens=0, prompt_logprobs=1, seed=0)

# How long a span may be, by the name a score job's fingerprint gives it (pipeline/fingerprint.py).
# SPAN_RULE: the span's last token is scored but not fed, as in the harness's hf model, so a span
# holds up to max_model_len + 1 tokens. SAMPLED_TOKEN_RULE: the rule of jobs planned before that,
# whose fingerprint names no rule; their spans were fed whole with one token sampled after them, so
# a span held up to max_model_len - 1 tokens. A job resumes under the rule it was planned with, so
# it never mixes windows (or refusals) of two lengths.
SPAN_RULE = "last_token_unfed"
SAMPLED_TOKEN_RULE = "sampled_token"
_SPAN_ROOM = {SPAN_RULE: 1, SAMPLED_TOKEN_RULE: -1}  # tokens a span may hold past max_model_len


class ScoreTokenizer(Protocol):
    bos_token: str | None
    eos_token: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class ScoreInputError(ValueError):
    """A text that cannot be scored (empty continuation, nothing left of the context)."""


@dataclass(frozen=True)
class Span:
    """One scoring request: the continuation's tokens are scored given the context's."""

    context_ids: list[int]
    continuation_ids: list[int]

    @property
    def prompt_ids(self) -> list[int]:
        return self.context_ids + self.continuation_ids

    @property
    def score_from(self) -> int:
        """The first prompt position whose logprob is part of the score."""
        return len(self.context_ids)


@dataclass(frozen=True)
class SpanScore:
    token_logprobs: list[float]
    is_greedy: bool  # every scored token was the argmax (ties to the lower id, as torch.argmax)

    @property
    def logprob_sum(self) -> float:
        return float(sum(self.token_logprobs))


def prefix_token_id(tokenizer: ScoreTokenizer) -> int:
    """The token an empty context (and a document's first window) conditions on: BOS, else EOS."""
    if tokenizer.bos_token_id is not None:
        return int(tokenizer.bos_token_id)
    if tokenizer.eos_token is not None:
        ids = tokenizer.encode(tokenizer.eos_token, add_special_tokens=False)
        if len(ids) == 1:
            return ids[0]
    if tokenizer.eos_token_ids:
        return int(tokenizer.eos_token_ids[0])
    raise ScoreInputError(
        "the tokenizer has neither a BOS nor an EOS token, so an empty context or a document has "
        "nothing to condition on: add bos_token or eos_token to tokenizer_config.json"
    )


def encode_text(tokenizer: ScoreTokenizer, text: str) -> list[int]:
    """The harness's default encoding: special tokens added unless the text starts with the prefix token."""
    prefix = tokenizer.decode([prefix_token_id(tokenizer)], skip_special_tokens=False)
    return tokenizer.encode(text, add_special_tokens=not (prefix and text.startswith(prefix)))


def split_pair(tokenizer: ScoreTokenizer, context: str, continuation: str) -> Span:
    """Context and continuation tokens with the split point the harness uses (module docstring)."""
    if continuation == "":
        raise ScoreInputError("the continuation is empty: there is nothing to score")
    if context == "":
        cont = tokenizer.encode(continuation, add_special_tokens=False)
        prefix = prefix_token_id(tokenizer)
        # A continuation that starts with the prefix token is its own context (as in the harness).
        span = Span(cont[:1], cont[1:]) if cont and cont[0] == prefix else Span([prefix], cont)
        if not span.continuation_ids:
            raise _nothing_to_score(continuation)
        return span
    stripped = context.rstrip()
    if stripped != context:
        continuation = context[len(stripped) :] + continuation
        context = stripped
    if context == "":
        raise ScoreInputError(
            "the context is only whitespace: give an empty context (scored after the BOS token) or some text"
        )
    whole = encode_text(tokenizer, context + continuation)
    context_ids = encode_text(tokenizer, context)
    continuation_ids = whole[len(context_ids) :]
    if not continuation_ids:
        raise _nothing_to_score(continuation)
    return Span(context_ids, continuation_ids)


def _nothing_to_score(continuation: str) -> ScoreInputError:
    return ScoreInputError(f"the continuation {continuation[:40]!r} tokenises to no tokens after the context")


def rolling_windows(tokens: list[int], prefix_token: int, window: int) -> list[Span]:
    """Disjoint-prediction windows over a document's tokens (module docstring); `window` >= 1 is the
    number of model input positions per window, so each span has at most window + 1 tokens."""
    if window < 1:
        raise ValueError(f"window={window}: a rolling window needs at least one input position")
    spans: list[Span] = []
    if not tokens:
        return spans
    first = min(window, len(tokens))
    spans.append(Span([prefix_token], tokens[:first]))
    start = first
    while start < len(tokens):
        end = min(len(tokens), start + window)
        # The window's inputs end just before its last predicted token and hold `window` tokens.
        spans.append(Span(tokens[end - window - 1 : start], tokens[start:end]))
        start = end
    return spans


def span_score(out: RequestOutput, span: Span) -> SpanScore:
    """The continuation's logprobs and greediness from a finished request's prompt logprobs."""
    start = span.score_from
    logprobs = out.prompt_logprobs or []
    tops = out.prompt_top_logprobs or []
    if len(logprobs) != len(span.prompt_ids) or len(tops) != len(span.prompt_ids):
        raise ValueError(
            f"request {out.request_id}: got {len(logprobs)} prompt logprobs for {len(span.prompt_ids)} "
            "prompt tokens; was it sent with the scoring parameters?"
        )
    values = [float(v) for v in logprobs[start:] if v is not None]
    if len(values) != len(span.continuation_ids):
        raise ValueError(f"request {out.request_id}: a scored position has no logprob")
    greedy = all(
        top is not None and bool(top) and top[0][0] == token
        for top, token in zip(tops[start:], span.continuation_ids, strict=True)
    )
    return SpanScore(values, greedy)


def add_span(engine: Any, request_id: str, span: Span) -> None:
    """Queue `span` on an LLMEngine as a scoring request (raises the engine's ValueError)."""
    engine.add_request(request_id, span.prompt_ids, SCORE_PARAMS, prompt_logprobs_from=span.score_from)


def max_span_tokens(max_model_len: int, rule: str = SPAN_RULE) -> int:
    """The longest span the engine scores under `rule`: max_model_len fed tokens and a last one
    that is only scored (SPAN_RULE)."""
    if rule not in _SPAN_ROOM:
        raise ValueError(f"span rule {rule!r} is unknown: expected one of {sorted(_SPAN_ROOM)}")
    return max_model_len + _SPAN_ROOM[rule]


def longest_rolling_window(max_model_len: int, rule: str = SPAN_RULE) -> int:
    """The most input positions a rolling window may have: its span is the window plus the last
    scored token, and must fit max_span_tokens (job.rolling_window_tokens = 0 takes this)."""
    return max_span_tokens(max_model_len, rule) - 1


def rolling_window_refusal(window_tokens: int, max_model_len: int, rule: str = SPAN_RULE) -> str | None:
    """Why job.rolling_window_tokens=window_tokens cannot be scored by an engine of max_model_len
    (None when it can; 0 takes the longest window, so always can). The one rule for both the plan
    (`validate`, `submit --dry-run`, `submit` before it writes) and the engine-time ScorePreparer."""
    longest = longest_rolling_window(max_model_len, rule)
    if not window_tokens or window_tokens <= longest:
        return None
    return (
        f"job.rolling_window_tokens={window_tokens} needs spans of {window_tokens + 1} tokens but the engine "
        f"takes at most {max_span_tokens(max_model_len, rule)} (max_model_len={max_model_len}); lower it to "
        f"{longest} or less (0 takes the longest), or raise engine.max_model_len (at most the model's "
        "max_position_embeddings)"
    )
