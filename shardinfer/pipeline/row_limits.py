"""Upper bounds on the work one row may ask for (documented in docs/jobs.md, "Per-row limits").

A job reads rows nobody has looked at. Without bounds one row can stall every other: `n` of a
billion builds a billion seeds before anything else happens, thousands of stop strings are searched after every token, a structured-output
schema nested thousands deep overflows the parser. Each bound here is far above what any real
request uses; a row above one becomes an error record naming the value and the bound, and the job
goes on. The same bounds apply to the job's own `[sampling]` section, where breaking one is a
configuration error.

Bounds that already live elsewhere: `logprobs` and `prompt_logprobs` are at most
`MAX_TOP_LOGPROBS` and `top_k` at most `MAX_TOP_K` (SamplingParams, so the API has them too),
and a prompt must leave room under `max_model_len`.
"""

from __future__ import annotations

import json
from typing import Any

from shardinfer.engine.sampling_params import MAX_N, SamplingParams

MAX_SAMPLES_PER_ROW = MAX_N  # n: SamplingParams' own bound
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 512
MAX_STOP_TOKEN_IDS = 1024
MAX_SCHEMA_CHARS = 1_000_000  # a structured-output schema, as compact JSON text
MAX_NESTING_DEPTH = 64  # lists and objects inside one value: chat messages, structured_output


class LimitError(ValueError):
    """A value over one of the bounds; `field` is the SamplingParams field (or input value) at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def over_max_model_len(name: str, value: int, max_model_len: int) -> str:
    """Why `name` (max_tokens or min_tokens) = value cannot be, and the value to set instead."""
    fill = (
        f" (max_tokens = {max_model_len} generates until prompt and output fill it)"
        if name == "max_tokens"
        else ""
    )
    return (
        f"{name}={value} is above max_model_len={max_model_len}, the most a request can ever hold; "
        f"lower it to {max_model_len} or less{fill}"
    )


def check_limits(params: SamplingParams, max_model_len: int | None = None) -> None:
    """Raise LimitError for the first field of `params` above its bound (max_tokens and min_tokens
    against `max_model_len`: a request never generates past it, so a larger value is a mistake)."""
    if params.n > MAX_SAMPLES_PER_ROW:
        raise LimitError("n", f"n={params.n} is above the limit of {MAX_SAMPLES_PER_ROW} samples per row")
    if max_model_len is not None:
        for name in ("max_tokens", "min_tokens"):
            value = getattr(params, name)
            if value is not None and value > max_model_len:
                raise LimitError(name, over_max_model_len(name, value, max_model_len))
    if len(params.stop) > MAX_STOP_STRINGS:
        raise LimitError(
            "stop", f"stop has {len(params.stop)} strings, above the limit of {MAX_STOP_STRINGS}"
        )
    longest = max((len(s) for s in params.stop), default=0)
    if longest > MAX_STOP_STRING_CHARS:
        raise LimitError(
            "stop", f"a stop string has {longest} characters, above the limit of {MAX_STOP_STRING_CHARS}"
        )
    if len(params.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise LimitError(
            "stop_token_ids",
            f"stop_token_ids has {len(params.stop_token_ids)} ids, above the limit of {MAX_STOP_TOKEN_IDS}",
        )
    if params.structured_output is not None:
        check_depth("structured_output", params.structured_output)
        size = len(json.dumps(params.structured_output, separators=(",", ":"), default=str))
        if size > MAX_SCHEMA_CHARS:
            raise LimitError(
                "structured_output",
                f"structured_output is {size} characters as JSON, above the limit of {MAX_SCHEMA_CHARS}",
            )


def check_depth(what: str, value: Any, limit: int = MAX_NESTING_DEPTH) -> None:
    """Raise LimitError if lists/dicts nest deeper than `limit` in `value` (walked without recursion,
    so a hostile value cannot overflow the stack while it is being measured)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            raise LimitError(what, f"{what} nests lists/objects deeper than the limit of {limit} levels")
        stack.extend((child, depth + 1) for child in children)
