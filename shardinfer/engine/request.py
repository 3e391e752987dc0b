"""A request as the scheduler sees it: its tokens, its progress and its status.

Invariants (checked where they change): num_computed_tokens <= num_tokens_to_compute; a RUNNING
request owns ceil(num_tokens_with_kv / block_size) blocks; a finished request owns none.

A prompt-only request (params.max_tokens == 0) scores its prompt and generates nothing: its last
prompt token is a target only, scored from the logits of the position before it, so it is never
fed and has no KV; the request ends once every wanted prompt logprob is recorded.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from shardinfer.engine.sampling_params import SamplingParams

PLACEHOLDER = -1  # an output token still being sampled on the device
NOT_ADMITTED = -1  # num_cached_tokens of a request never admitted yet
NO_SAMPLE_ROW = -1  # sample_slot of a request that has not sampled yet


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # not yet admitted, or preempted (its KV was freed; recompute)
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"

    @property
    def finished(self) -> bool:
        return self not in _LIVE


_LIVE = frozenset({RequestStatus.WAITING, RequestStatus.RUNNING})  # read on every step for each request


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    max_tokens: int  # resolved: params.max_tokens or the room left in max_model_len
    prompt: str | None = None
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    prompt_logprobs: list[float | None] = field(default_factory=list)
    prompt_top_logprobs: list[list[tuple[int, float]] | None] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = NOT_ADMITTED  # prompt tokens found in the prefix cache at first admission
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # hashes of this request's full blocks
    # Sliding-window models: the first blocks of block_table that left every layer's window and were
    # released (their ids stay in the table so positions keep their block; attention masks them).
    num_released_blocks: int = 0
    num_preemptions: int = 0
    stop_reason: str | int | None = None
    output_text: str = ""
    error: str | None = None
    grammar: Any = None  # a structured-output matcher, when so_args is set
    # Asynchronous scheduling: a sampled token whose value is still on the device sits in
    # output_token_ids as PLACEHOLDER until the step completes; the next step reads it there.
    num_placeholders: int = 0
    sample_slot: int = NO_SAMPLE_ROW  # this request's row in the newest launched step's sampled tokens
    finishing: bool = False  # its last launched token reaches max_tokens: schedule it no more
    # Speculative decoding: draft tokens appended to output_token_ids (and counted as placeholders)
    # for this step's verification; the engine replaces them with the verified tokens.
    num_draft_tokens: int = 0
    mtp_draft: list[int] = field(default_factory=list)  # the MTP layer's proposal for the next step
    # The MTP head's probability of each token of the newest proposal the host has read back.
    mtp_confidence: list[float] = field(default_factory=list)
    # What the drafter said of each of this step's drafts when it was planned (None: nothing);
    # the draft budget learns from it how far to trust the drafter (draft_budget.py).
    draft_confidence: list[float | None] | None = None
    # How many of the newest drafts have values on the device only (the MTP layer's, while the
    # step it drafted from is in flight); input_fixup.py fills them in.
    device_drafts: int = 0
    # A host drafter's proposals when the step in flight may reject r drafts: row r is the draft
    # for that case (input_fixup.py picks it on the device); None when it does not matter.
    draft_choices: list[list[int]] | None = None

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end] without concatenating the whole sequence (hot path)."""
        p = len(self.prompt_token_ids)
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        if end <= p:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - p]

    @property
    def cached_prompt_tokens(self) -> int:
        """Prompt tokens found in the prefix cache at first admission (0 before it)."""
        return 0 if self.num_cached_tokens == NOT_ADMITTED else self.num_cached_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_resolved_tokens(self) -> int:
        """Tokens whose values the host knows (all but pending placeholders)."""
        return self.num_tokens - self.num_placeholders

    @property
    def prompt_only(self) -> bool:
        """Whether the request only scores its prompt (max_tokens=0): nothing is sampled."""
        return self.params.max_tokens == 0

    @property
    def num_tokens_to_compute(self) -> int:
        """Where this request's computation ends: every token, but for a prompt-only request the
        last prompt token, which is only a target."""
        return self.num_tokens - 1 if self.prompt_only else self.num_tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.params.prompt_logprobs is not None

    @property
    def prompt_logprobs_done(self) -> bool:
        return len(self.prompt_logprobs) >= self.num_prompt_tokens

    def finish(self, status: RequestStatus, reason: str | int | None = None) -> None:
        if not status.finished:
            raise ValueError(f"finish() needs a finished status, got {status}")
        self.status = status
        self.stop_reason = reason
