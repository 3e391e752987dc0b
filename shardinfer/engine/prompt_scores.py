"""Prompt logprobs of a step, scored on the device a bounded number of rows at a time.

A step that scores prompt positions (prompt_logprobs, score jobs, the lm-evaluation-harness model)
may carry a whole token budget of them. Their logits at once would be budget x vocab float32 values,
and the log-softmax and the ranking as many again: at 16384 tokens and a 150k vocabulary, tens of
GB beside the KV cache. Here the LM head, the log-softmax, each position's own token's logprob
and its top k run over chunks of rows whose temporaries stay under SCORE_CHUNK_BYTES; what the
step keeps is n logprobs and n x k top entries. A chunk's rows are independent of one another
(the batch-invariant LM head gives a row the same bits in any batch), so chunking changes no
value, and the ranking is a stable sort: ties go to the lower id.

Nothing here waits for the device; the host reads the small results when it completes the step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from shardinfer.engine.device_copy import values_to_device

# Bytes of a chunk's temporaries: float32 logits and log-softmax, and the stable sort's float32
# values and int64 ids when top entries are asked for (24 bytes a vocabulary entry in all).
SCORE_CHUNK_BYTES = 1 << 30
_BYTES_PER_ENTRY = 24


@dataclass
class PromptScores:
    """One request's scored prompt positions of a step, on the device."""

    first: int  # the first position scored: logprobs[i] is token first + 1 + i's
    logprobs: torch.Tensor  # [n] float32
    top_ids: torch.Tensor | None  # [n, k] int64, best first (k: the step's largest ask)
    top_logprobs: torch.Tensor | None  # [n, k] float32

    def __len__(self) -> int:
        return int(self.logprobs.shape[0])


def chunk_rows(vocab: int, budget_bytes: int | None = None) -> int:
    """Rows scored at once for a vocabulary of `vocab` entries (budget: SCORE_CHUNK_BYTES)."""
    budget = SCORE_CHUNK_BYTES if budget_bytes is None else budget_bytes
    return max(1, budget // (vocab * _BYTES_PER_ENTRY))


def score_rows(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    rows: list[int],
    targets: list[int],
    top_k: int,
    vocab: int,
    budget_bytes: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Row r's logprob of token targets[i] (r = rows[i]), and its top_k (ids, logprobs), best
    first; compute_logits maps hidden rows to float32 logits [n, vocab]."""
    device = hidden.device
    index = values_to_device(rows, torch.long, device)
    wanted = values_to_device(targets, torch.long, device)
    step = chunk_rows(vocab, budget_bytes)
    values, ids, tops = [], [], []
    for start in range(0, len(rows), step):
        logprobs = torch.log_softmax(compute_logits(hidden[index[start : start + step]]).float(), dim=-1)
        values.append(logprobs.gather(1, wanted[start : start + step].view(-1, 1)).view(-1))
        if top_k:
            ranked = torch.sort(logprobs, dim=-1, descending=True, stable=True)
            tops.append(ranked.values[:, :top_k].clone())
            ids.append(ranked.indices[:, :top_k].clone())
        del logprobs
    if not values:
        empty = torch.zeros(0, dtype=torch.float32, device=device)
        return empty, None, None
    if not top_k:
        return torch.cat(values), None, None
    return torch.cat(values), torch.cat(ids), torch.cat(tops)


def split_scores(
    firsts: list[int],
    counts: list[int],
    logprobs: torch.Tensor,
    top_ids: torch.Tensor | None,
    top_logprobs: torch.Tensor | None,
) -> list[PromptScores]:
    """score_rows' results cut into one PromptScores per request (counts[i] rows each, in order)."""
    out, row = [], 0
    for first, count in zip(firsts, counts, strict=True):
        part = slice(row, row + count)
        out.append(
            PromptScores(
                first,
                logprobs[part],
                None if top_ids is None else top_ids[part],
                None if top_logprobs is None else top_logprobs[part],
            )
        )
        row += count
    return out


def read_scores(scores: PromptScores, k: int) -> tuple[list[float], list[list[tuple[int, float]] | None]]:
    """The host's copy: each position's logprob, and its k best (id, logprob) or None (k = 0)."""
    values: list[float] = scores.logprobs.tolist()
    if not k or scores.top_ids is None or scores.top_logprobs is None:
        return values, [None] * len(values)
    ids = scores.top_ids[:, :k].tolist()
    lps = scores.top_logprobs[:, :k].tolist()
    return values, [list(zip(i, v, strict=True)) for i, v in zip(ids, lps, strict=True)]
