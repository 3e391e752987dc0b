"""What the engine hands back: one RequestOutput per prompt, one CompletionOutput per sample."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[float]  # raw-model logprob of each generated token
    top_logprobs: list[list[tuple[int, float]]] | None  # per token, k (id, logprob), best first
    finish_reason: str | None  # "stop" | "length" | "abort" | "error"
    seed: int = 0
    # As vLLM: the stop string or stop_token_ids entry that ended the sample; None when it ended
    # at an end-of-sequence token, at max_tokens, or without finishing.
    stop_reason: str | int | None = None
    error: str | None = None
    # LLM.generate only: top_logprobs' token ids decoded one by one, in the same places.
    top_logprob_tokens: list[list[str]] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def cumulative_logprob(self) -> float:
        """The sample's log probability under the raw model distribution: the sum of its tokens'."""
        return math.fsum(self.logprobs)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    # prompt_logprobs[i] = logprob of prompt token i given tokens < i (index 0 is None);
    # prompt_top_logprobs[i] = the k best (id, logprob) there, when prompt_logprobs=k > 0.
    prompt_logprobs: list[float | None] | None
    outputs: list[CompletionOutput]
    prompt_top_logprobs: list[list[tuple[int, float]] | None] | None = None
    num_cached_tokens: int = 0
    finished: bool = True
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)
