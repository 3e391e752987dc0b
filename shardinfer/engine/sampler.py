"""Token selection and logprobs for one step's sampling rows, and the plan of those rows.

Each row is processed alone (per-row ops only), so a row's token never depends on its batch:
  raw logits -> logprobs (returned: the raw model distribution)
  -> penalties (repetition / presence / frequency) -> min_tokens and grammar masks (-inf)
  -> greedy argmax when temperature == 0 (or below GREEDY_BELOW, as vLLM), else
     /T -> top-k, then top-p and min-p over the survivors (kernels/reference_sampling.py defines
     the sets) -> + Gumbel noise g(seed, position, token id) -> argmax.
Ties go to the lowest token id.

plan_sampling() turns a forward's logits rows into sampling rows on the host, putting a
placeholder where each sampled token will go; launch_sampling() queues their sampling.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch

from shardinfer.engine.device_copy import columns_to_device, values_to_device
from shardinfer.engine.model_runner import StepLogits
from shardinfer.engine.request import PLACEHOLDER, Request
from shardinfer.engine.sampling_noise import gumbel_noise
from shardinfer.engine.sampling_params import SamplingParams
from shardinfer.engine.scheduler import ScheduledBatch
from shardinfer.kernels import ops
from shardinfer.kernels.top_logprob import TopLogprob

# SamplingPlan.output_slots markers for requests whose sampled token owns no placeholder.
DRAFTS = -1  # the request's draft tokens hold this step's slots (speculative decoding)
DISCARDED = -2  # the request finished before this step sampled: its row's token is dropped


@dataclass(slots=True)
class SamplingRow:
    params: SamplingParams
    seed: int
    position: int  # absolute index of the token being sampled
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    blocked_token_ids: list[int]  # ids that may not be sampled now (eos / stop ids before min_tokens)


@dataclass
class GrammarMasks:
    """The step's structured-output masks: bitmask row j masks sampling row rows[j]."""

    bitmask: torch.Tensor  # int32 [R, ceil(V / 32)], filled by the grammar compiler on the host
    rows: list[int]


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]] | None]
    accepted: list[int] | None = None  # per request: draft tokens accepted (speculative steps)
    mtp_drafts: list[list[int]] | None = None  # per request: the MTP layer's drafts for the next step
    mtp_confidence: list[list[float]] | None = None  # ... and the MTP head's probability of each


def _apply_penalties(logits: torch.Tensor, row: SamplingRow) -> torch.Tensor:
    """Penalize one row of logits; may write into it (its caller passes a row of a clone)."""
    p = row.params
    if not p.has_penalties:
        return logits
    vocab = logits.shape[-1]
    if p.repetition_penalty != 1.0:
        seen = values_to_device(
            sorted({t for t in row.prompt_token_ids + row.output_token_ids if t < vocab}),
            torch.long,
            logits.device,
        )
        if seen.numel():
            vals = logits[seen]
            logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0) and row.output_token_ids:
        ids = values_to_device(row.output_token_ids, torch.long, logits.device)
        counts = torch.bincount(ids, minlength=vocab)[:vocab].to(logits.dtype)
        logits = logits - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


class DeviceSample:
    """A step's sampled tokens and logprobs, still on the device.

    stage() queues their copy into pinned host memory and records an event, without waiting;
    result() waits for that event only, so the device can already be running the next step.
    """

    def __init__(
        self,
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        top: tuple[torch.Tensor, torch.Tensor] | None,
        top_k: list[int],
    ) -> None:
        self.tokens = tokens  # [S] int64, on the logits' device (the next step may read it there)
        self.logprobs = logprobs
        self.top = top
        self.top_k = top_k
        self._host: list[torch.Tensor] | None = None
        self._event: torch.cuda.Event | None = None
        # Speculative decoding (drafting.py): per request, drafts accepted, and the MTP layer's
        # draft for the next step; both read back with the tokens.
        self.accepted: torch.Tensor | None = None
        self.mtp_drafts: torch.Tensor | None = None
        self.mtp_confidence: torch.Tensor | None = None  # [P, D] the MTP head's probability of each draft
        # Per request: the row of its newest accepted token, and its rejected drafts (device only).
        self.last_rows: torch.Tensor | None = None
        self.shifts: torch.Tensor | None = None

    def stage(self) -> None:
        extra = [t for t in (self.accepted, self.mtp_drafts, self.mtp_confidence) if t is not None]
        parts = [*extra, self.tokens, self.logprobs, *(self.top or ())]
        if not self.tokens.is_cuda:
            self._host = parts
            return
        self._host = [
            torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True) for t in parts
        ]
        self._event = torch.cuda.Event()
        self._event.record()

    def result(self) -> SampleResult:
        if self._host is None:
            self.stage()
        if self._event is not None:
            self._event.synchronize()
        assert self._host is not None
        host = list(self._host)
        accepted = host.pop(0).tolist() if self.accepted is not None else None
        mtp_drafts = host.pop(0).tolist() if self.mtp_drafts is not None else None
        mtp_confidence = host.pop(0).tolist() if self.mtp_confidence is not None else None
        tokens, lps = host[0].tolist(), host[1].tolist()
        tops: list[list[tuple[int, float]] | None] = [None] * len(tokens)
        if self.top is not None:
            top_vals, top_ids = host[2].tolist(), host[3].tolist()
            for i, k in enumerate(self.top_k):
                if k:
                    tops[i] = list(zip(top_ids[i][:k], top_vals[i][:k], strict=True))
        return SampleResult(tokens, lps, tops, accepted, mtp_drafts, mtp_confidence)


# logprobs=1 read from the sampling pass (kernels/top_logprob.py); False: a top-k, as for more
# (the same values; for benchmarks to compare the two in one run).
TOP1_FROM_SAMPLING = True


def sample(
    logits: torch.Tensor, rows: list[SamplingRow], grammar: GrammarMasks | None = None
) -> SampleResult:
    """Choose and read back in one call (see sample_on_device)."""
    return sample_on_device(logits, rows, grammar).result()


def sample_on_device(
    logits: torch.Tensor,
    rows: list[SamplingRow],
    grammar: GrammarMasks | None = None,
    position_shift: torch.Tensor | None = None,
) -> DeviceSample:
    """logits [B, V] float32, one row per sampling request; nothing waits for the device.

    position_shift [B] (speculative decoding with asynchronous scheduling): how far each row's
    position is behind the one the host planned, known only on the device (input_fixup.py).

    Per-row processing (penalties, blocked ids) touches only the rows that ask for it; grammar
    masks are one batched operation for all their rows; the choice itself is one batched call: the
    Triton kernel on CUDA, the reference on CPU (same sets, same noise), so CPU and GPU runs follow
    one definition.
    """
    logits = logits.float()
    x = logits
    # Rows that need work of their own; grammar rows do not (their masks are applied together), so
    # a constrained step launches no per-row operation for them.
    special = [i for i, r in enumerate(rows) if r.blocked_token_ids or r.params.has_penalties]
    masked = grammar is not None and bool(grammar.rows)
    if special or masked:
        x = logits.clone()  # the masks write in place; the caller's logits stay as they were
    for i in special:
        row = rows[i]
        if row.params.has_penalties:
            x[i] = _apply_penalties(x[i], row)
        if row.blocked_token_ids:
            x[i, values_to_device(row.blocked_token_ids, torch.long, x.device)] = float("-inf")
    if masked:
        assert grammar is not None
        _apply_grammar(x, grammar)
    dev = x.device

    # Every row's sampling settings in one copy (a launch path with asynchronous scheduling). Rows
    # of one step mostly share their params: each distinct params' settings are read once.
    vocab = x.shape[-1]
    settings: dict[int, tuple[float, int, float, float, bool, int]] = {}
    per_row: list[tuple[float, int, float, float, bool, int]] = []
    for r in rows:
        p = r.params
        row_settings = settings.get(id(p))
        if row_settings is None:
            row_settings = settings[id(p)] = (
                0.0 if p.greedy else p.temperature,
                p.top_k,
                p.top_p,
                p.min_p,
                _filters(p, vocab),
                p.logprobs or 0,
            )
        per_row.append(row_settings)
    temperature, top_k, top_p, min_p, seeds, positions = columns_to_device(
        [
            np.array([c[0] for c in per_row], dtype=np.float32),
            np.array([c[1] for c in per_row], dtype=np.int32),
            np.array([c[2] for c in per_row], dtype=np.float32),
            np.array([c[3] for c in per_row], dtype=np.float32),
            np.array([r.seed for r in rows], dtype=np.int64),
            np.array([r.position for r in rows], dtype=np.int64),
        ],
        dev,
    )
    if position_shift is not None:
        positions = positions - position_shift
    noise = None if x.is_cuda else gumbel_noise(seeds, positions, vocab)
    # Whether any row filters is known here, on the host; a row's token is the same either way.
    filtered = any(c[4] for c in per_row)
    k_per_row = [c[5] for c in per_row]
    top_k_max = max(k_per_row, default=0)
    # One top logprob per token (logprobs=1, the common ask) comes out of the pass that computes
    # the log-sum-exp (kernels/top_logprob.py); more take a top-k over the raw logits.
    top1 = TopLogprob.empty(len(rows), dev) if top_k_max == 1 and TOP1_FROM_SAMPLING else None
    chosen, lps, lse = ops.sample_with_logprobs(
        logits, x, temperature, top_k, top_p, min_p, seeds, positions, filtered, noise, top=top1
    )
    top = None
    if top1 is not None:
        top = (top1.logprobs.view(-1, 1), top1.token_ids.view(-1, 1))
    elif top_k_max:
        # The raw logits' top ids, as logprobs with the same lse as the sampled token's.
        values, indices = torch.topk(logits, top_k_max, dim=-1)
        top = (values - lse.view(-1, 1), indices)
    return DeviceSample(chosen, lps, top, k_per_row)


def _filters(p: SamplingParams, vocab: int) -> bool:
    """Whether a row restricts its candidates by top_k / top_p / min_p (kernels/sampling.py's
    definitions of "off"); greedy rows never do."""
    if p.greedy:
        return False
    return 0 < p.top_k < vocab or p.top_p < 1.0 or p.min_p > 0.0


def _apply_grammar(x: torch.Tensor, grammar: GrammarMasks) -> None:
    """Mask x's constrained rows in one batched unpack-and-mask on x's device. When every row is
    constrained in order (a step where all requests carry a grammar), x is masked in place with no
    row index to copy over or gather and scatter through."""
    from shardinfer.engine.structured import apply_bitmask

    if len(grammar.rows) == x.shape[0] and grammar.rows == list(range(x.shape[0])):
        apply_bitmask(x, grammar.bitmask)
    else:
        apply_bitmask(x, grammar.bitmask, values_to_device(grammar.rows, torch.long, x.device))


def sampling_row(req: Request, position: int, eos_token_ids: list[int] | tuple[int, ...]) -> SamplingRow:
    """The row that samples `req`'s token at `position`."""
    p = req.params
    blocked: list[int] = []
    if req.num_output_tokens < p.min_tokens:
        blocked = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_token_ids))
    # Penalties count the tokens known now: a copy, since the placeholder of the token this row
    # samples is appended before the sampling is queued (the other rows never read the list).
    outputs = list(req.output_token_ids) if p.has_penalties else req.output_token_ids
    return SamplingRow(p, req.seed, position, req.prompt_token_ids, outputs, blocked)


@dataclass
class SamplingPlan:
    """A forward's sampling rows prepared on the host (placeholders already in place); what is
    left is the grammar masks and queueing the sampling itself."""

    step_logits: StepLogits
    batch: ScheduledBatch
    rows: list[SamplingRow]
    # Where each request's sampled token goes in its output_token_ids, or DRAFTS / DISCARDED.
    output_slots: list[int]
    constrained: list[tuple[Request, int]]  # (request, sampling row) that need a grammar mask
    masks: Future[GrammarMasks | None] | None = None  # a fill running on the mask thread
    # Per sampling request: the position of its newest slot in the host's layout when planned
    # (drafts of a later step may be appended before a deferred sampling is queued).
    newest_positions: list[int] = field(default_factory=list)
    # Per sampling request: its drafts' confidences when they were planned (None: none).
    draft_confidence: list[list[float | None] | None] = field(default_factory=list)


def plan_sampling(
    step_logits: StepLogits,
    batch: ScheduledBatch,
    eos_token_ids: list[int] | tuple[int, ...],
    max_model_len: int,
    constrained: list[tuple[Request, int]] | None = None,
) -> SamplingPlan:
    """A forward's sampling rows, with a placeholder where each token will go.

    A request may have finished since its forward was queued (the previous step, completed in
    between, stopped it): its row is sampled without a mask and its token dropped.
    `constrained`: the rows that get a grammar mask, when already chosen (None: chosen here)."""
    reqs, counts = step_logits.sample_requests, step_logits.sample_counts
    rows: list[SamplingRow] = []
    slots: list[int] = []
    first_rows: list[int] = []
    for req, count in zip(reqs, counts, strict=True):
        first_rows.append(len(rows))
        num_tokens = req.num_tokens
        if count == 1:  # the common row: no drafts
            rows.append(sampling_row(req, num_tokens, eos_token_ids))
        else:
            # Row j scores the token at position (tokens before the drafts) + j.
            base = num_tokens - (count - 1)
            rows.extend(sampling_row(req, base + j, eos_token_ids) for j in range(count))
    if constrained is None:
        constrained = [
            (r, first_rows[i]) for i, r in enumerate(reqs) if r.grammar is not None and not r.status.finished
        ]
    confidence: list[list[float | None] | None] = []
    for i, (req, count) in enumerate(zip(reqs, counts, strict=True)):
        confidence.append(req.draft_confidence if count > 1 else None)
        req.draft_confidence = None
        if req.status.finished:
            slots.append(DISCARDED)
            continue
        if count > 1:
            # The drafts hold this step's first slots; one more placeholder takes the token after
            # the last accepted draft. The host lays the next step out as if every draft were
            # accepted; the verification removes the slots of rejected ones.
            slots.append(DRAFTS)
            req.output_token_ids.append(PLACEHOLDER)
            req.num_placeholders += 1
            req.num_draft_tokens = 0
            if req.num_output_tokens >= req.max_tokens or req.num_tokens >= max_model_len:
                req.finishing = True
            continue
        req.output_token_ids.append(PLACEHOLDER)
        req.num_placeholders += 1
        req.sample_slot = first_rows[i]
        slots.append(req.num_output_tokens - 1)
        if req.num_output_tokens >= req.max_tokens or req.num_tokens >= max_model_len:
            req.finishing = True
    # The newest slot of each request, its placeholder now appended.
    newest = [r.num_tokens - 1 for r in reqs]
    return SamplingPlan(
        step_logits, batch, rows, slots, constrained, newest_positions=newest, draft_confidence=confidence
    )
