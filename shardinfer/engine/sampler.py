"""Token selection and logprobs for one step's sampling rows.

Each row is processed alone (per-row ops only), so a row's token never depends on its batch:
  raw logits -> logprobs (returned: the raw model distribution)
  -> penalties (repetition / presence / frequency) -> min_tokens and grammar masks (-inf)
  -> greedy argmax when temperature == 0, else
     /T -> top-k, top-p, min-p masks (-inf) -> + Gumbel noise g(seed, position, token id) -> argmax.
argmax returns the first maximum, so ties go to the lowest token id.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardinfer.engine.sampling_noise import gumbel_noise
from shardinfer.engine.sampling_params import SamplingParams


@dataclass
class SamplingRow:
    params: SamplingParams
    seed: int
    position: int  # absolute index of the token being sampled
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    blocked_token_ids: list[int]  # ids that may not be sampled now (eos / stop ids before min_tokens)
    allowed_mask: torch.Tensor | None = None  # bool [V] from a grammar, or None


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]] | None]


def _apply_penalties(logits: torch.Tensor, row: SamplingRow) -> torch.Tensor:
    p = row.params
    if p.repetition_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0:
        return logits
    logits = logits.clone()
    vocab = logits.shape[-1]
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted({t for t in row.prompt_token_ids + row.output_token_ids if t < vocab}),
                            dtype=torch.long, device=logits.device)
        if seen.numel():
            vals = logits[seen]
            logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0) and row.output_token_ids:
        ids = torch.tensor(row.output_token_ids, dtype=torch.long, device=logits.device)
        counts = torch.bincount(ids, minlength=vocab)[:vocab].to(logits.dtype)
        logits = logits - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def _truncate(scaled: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """top-k, top-p and min-p on temperature-scaled logits of one row; masked ids become -inf."""
    neg_inf = torch.tensor(float("-inf"), device=scaled.device)
    if p.top_k > 0 and p.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, p.top_k).values[-1]
        scaled = torch.where(scaled < kth, neg_inf, scaled)
    if p.top_p < 1.0 or p.min_p > 0.0:
        probs = torch.softmax(scaled, dim=-1)
        if p.min_p > 0.0:
            scaled = torch.where(probs < p.min_p * probs.max(), neg_inf, scaled)
        if p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True, stable=True)
            # Keep a token while the mass before it is < top_p: the smallest set reaching top_p.
            mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            drop_sorted = mass_before >= p.top_p
            drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
            scaled = torch.where(drop, neg_inf, scaled)
    return scaled


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> SampleResult:
    """logits [B, V] float32, one row per sampling request."""
    logprobs_all = torch.log_softmax(logits.float(), dim=-1)
    tokens: list[int] = []
    for i, row in enumerate(rows):
        x = _apply_penalties(logits[i].float(), row)
        if row.blocked_token_ids:
            x = x.clone()
            x[torch.tensor(row.blocked_token_ids, dtype=torch.long, device=x.device)] = float("-inf")
        if row.allowed_mask is not None:
            x = x.masked_fill(~row.allowed_mask.to(x.device), float("-inf"))
        if row.params.greedy:
            tokens.append(int(torch.argmax(x)))
            continue
        scaled = _truncate(x / row.params.temperature, row.params)
        noise = gumbel_noise(torch.tensor([row.seed]), torch.tensor([row.position]), x.shape[-1])[0]
        tokens.append(int(torch.argmax(scaled + noise.to(scaled.device))))
    chosen = torch.tensor(tokens, dtype=torch.long, device=logits.device)
    lps = logprobs_all.gather(1, chosen.view(-1, 1)).view(-1).tolist()
    tops: list[list[tuple[int, float]] | None] = []
    for i, row in enumerate(rows):
        k = row.params.logprobs
        tops.append(top_k_logprobs(logprobs_all[i], k) if k else None)
    return SampleResult(tokens, lps, tops)


def top_k_logprobs(logprobs: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The k most likely (id, logprob), best first, ties to the lower id."""
    order = torch.sort(logprobs, descending=True, stable=True).indices[:k]
    return [(int(t), float(logprobs[t])) for t in order]
