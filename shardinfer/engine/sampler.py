"""Token selection and logprobs for one step's sampling rows.

Each row is processed alone (per-row ops only), so a row's token never depends on its batch:
  raw logits -> logprobs (returned: the raw model distribution)
  -> penalties (repetition / presence / frequency) -> min_tokens and grammar masks (-inf)
  -> greedy argmax when temperature == 0, else
     /T -> top-k, then top-p and min-p over the survivors (kernels/reference_sampling.py defines
     the sets) -> + Gumbel noise g(seed, position, token id) -> argmax.
Ties go to the lowest token id.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardinfer.engine.device_copy import values_to_device
from shardinfer.engine.sampling_noise import gumbel_noise
from shardinfer.engine.sampling_params import SamplingParams
from shardinfer.kernels import ops


@dataclass
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


def _apply_penalties(logits: torch.Tensor, row: SamplingRow) -> torch.Tensor:
    """Penalize one row of logits; may write into it (its caller passes a row of a clone)."""
    p = row.params
    if not p.has_penalties:
        return logits
    vocab = logits.shape[-1]
    if p.repetition_penalty != 1.0:
        seen = values_to_device(sorted({t for t in row.prompt_token_ids + row.output_token_ids if t < vocab}),
                                torch.long, logits.device)
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

    def __init__(self, tokens: torch.Tensor, logprobs: torch.Tensor, top: tuple[torch.Tensor, torch.Tensor] | None,
                 top_k: list[int]) -> None:
        self.tokens = tokens  # [S] int64, on the logits' device (the next step may read it there)
        self.logprobs = logprobs
        self.top = top
        self.top_k = top_k
        self._host: list[torch.Tensor] | None = None
        self._event: torch.cuda.Event | None = None

    def stage(self) -> None:
        parts = [self.tokens, self.logprobs, *(self.top or ())]
        if not self.tokens.is_cuda:
            self._host = parts
            return
        self._host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
                      for t in parts]
        self._event = torch.cuda.Event()
        self._event.record()

    def result(self) -> SampleResult:
        if self._host is None:
            self.stage()
        if self._event is not None:
            self._event.synchronize()
        assert self._host is not None
        tokens, lps = self._host[0].tolist(), self._host[1].tolist()
        tops: list[list[tuple[int, float]] | None] = [None] * len(tokens)
        if self.top is not None:
            top_vals, top_ids = self._host[2].tolist(), self._host[3].tolist()
            for i, k in enumerate(self.top_k):
                if k:
                    tops[i] = list(zip(top_ids[i][:k], top_vals[i][:k], strict=True))
        return SampleResult(tokens, lps, tops)


def sample(logits: torch.Tensor, rows: list[SamplingRow], grammar: GrammarMasks | None = None) -> SampleResult:
    """Choose and read back in one call (see sample_on_device)."""
    return sample_on_device(logits, rows, grammar).result()


def sample_on_device(logits: torch.Tensor, rows: list[SamplingRow],
                     grammar: GrammarMasks | None = None) -> DeviceSample:
    """logits [B, V] float32, one row per sampling request; nothing waits for the device.

    Per-row processing (penalties, blocked ids) touches only the rows that ask for it; grammar
    masks are one batched operation for all their rows; the choice itself is one batched call: the
    Triton kernel on CUDA, the reference on CPU (same sets, same noise), so CPU and GPU runs follow
    one definition.
    """
    logits = logits.float()
    x = logits
    special = [i for i, r in enumerate(rows) if _needs_processing(r)]
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

    def col(values: list[float] | list[int], dtype: torch.dtype) -> torch.Tensor:
        return values_to_device(values, dtype, dev)

    temperature = col([r.params.temperature for r in rows], torch.float32)
    top_k = col([r.params.top_k for r in rows], torch.int32)
    top_p = col([r.params.top_p for r in rows], torch.float32)
    min_p = col([r.params.min_p for r in rows], torch.float32)
    seeds = col([r.seed for r in rows], torch.int64)
    positions = col([r.position for r in rows], torch.int64)
    noise = None if x.is_cuda else gumbel_noise(seeds, positions, x.shape[-1])
    # Whether any row filters is known here, on the host; a row's token is the same either way.
    filtered = any(_filters(r.params, x.shape[-1]) for r in rows)
    chosen, lps, lse = ops.sample_with_logprobs(logits, x, temperature, top_k, top_p, min_p, seeds, positions,
                                                filtered, noise)
    k_per_row = [r.params.logprobs or 0 for r in rows]
    top = None
    if max(k_per_row):
        # The raw logits' top ids, as logprobs with the same lse as the sampled token's.
        values, indices = torch.topk(logits, max(k_per_row), dim=-1)
        top = (values - lse.view(-1, 1), indices)
    return DeviceSample(chosen, lps, top, k_per_row)


def _filters(p: SamplingParams, vocab: int) -> bool:
    """Whether a row restricts its candidates by top_k / top_p / min_p (kernels/sampling.py's
    definitions of "off"); greedy rows never do."""
    if p.temperature <= 0.0:
        return False
    return 0 < p.top_k < vocab or p.top_p < 1.0 or p.min_p > 0.0


def _needs_processing(row: SamplingRow) -> bool:
    """Rows that need work of their own; grammar rows do not (their masks are applied together),
    so a constrained step launches no per-row operation for them."""
    return bool(row.blocked_token_ids or row.params.has_penalties)


def _apply_grammar(x: torch.Tensor, grammar: GrammarMasks) -> None:
    """Mask x's constrained rows in one batched unpack-and-mask on x's device. When every row is
    constrained in order (a step where all requests carry a grammar), x is masked in place with no
    row index to copy over or gather and scatter through."""
    from shardinfer.engine.structured import apply_bitmask

    if len(grammar.rows) == x.shape[0] and grammar.rows == list(range(x.shape[0])):
        apply_bitmask(x, grammar.bitmask)
    else:
        apply_bitmask(x, grammar.bitmask, values_to_device(grammar.rows, torch.long, x.device))


def top_k_logprobs(logprobs: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The k most likely (id, logprob), best first, ties to the lower id."""
    ranked = torch.sort(logprobs, descending=True, stable=True)
    return list(zip(ranked.indices[:k].tolist(), ranked.values[:k].tolist(), strict=True))
