"""Each row's most likely token under the raw logits, and its logprob: the top-1 logprob a request
with `logprobs=1` gets for every token it samples.

A top-k over the vocabulary is a selection pass of its own; for k = 1 the answer is the row's
maximum, which the pass computing the log-sum-exp reads anyway. So on CUDA the sampling kernels
write it (kernels/sampling_split.py, TOP) and elsewhere `fill_reference` computes the same thing.
Ties go to the lowest id, and a NaN logit counts as -inf (a row of nothing else gives id 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TopLogprob:
    """Where a row's top-1 token ([B] int64) and its logprob ([B] float32) are written."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor

    @staticmethod
    def empty(rows: int, device: torch.device) -> TopLogprob:
        return TopLogprob(
            torch.empty(rows, dtype=torch.int64, device=device),
            torch.empty(rows, dtype=torch.float32, device=device),
        )


def fill_reference(top: TopLogprob, raw: torch.Tensor, lse: torch.Tensor) -> None:
    """The reference: for raw [B, V] float32 and its log-sum-exp [B], the lowest id of each row's
    maximum (NaN as -inf) and raw[id] - lse, written into `top`."""
    values, ids = raw.max(dim=-1)  # the first maximal index; a NaN in the row wins here
    nan_rows = torch.isnan(values).nonzero().view(-1)
    if nan_rows.numel():
        rows = raw[nan_rows]
        ids[nan_rows] = torch.where(torch.isnan(rows), float("-inf"), rows).argmax(dim=-1)
    top.token_ids.copy_(ids)
    top.logprobs.copy_(raw.gather(1, ids.view(-1, 1)).view(-1) - lse)
