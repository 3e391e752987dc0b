"""Plain-PyTorch reference of the sampling kernel's filters and Gumbel-max choice.

The noise is an input here (the engine draws it with engine/sampling_noise.gumbel_noise, keyed
by seed, position and token id), so this module stays below the engine in the dependency
order. It sorts where the kernel binary-searches; both define the same sets:

  x = logits / T; top_k keeps x >= the k-th largest x; top_p, over the top_k survivors sorted
  by x descending, finds the first index j where the cumulative exp(x - max) reaches
  top_p * (their total) and keeps x >= x_(j); min_p > 0 keeps exp(x - max) >= min_p. The token is
  argmax over kept ids of x + noise, ties to the lowest id; T == 0 is argmax of the logits.

These are the sets engine/sampler.py's `_truncate` keeps (top-k, then top-p and min-p on the
top-k softmax) with two differences at the margins: an id tied with the last member of the
top-p prefix is kept here (the engine's stable sort keeps only the lower ids of a tie), and
the float32 sums and exps that place a threshold round differently from a softmax + cumsum.
"""

from __future__ import annotations

import torch


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    noise: torch.Tensor,
) -> torch.Tensor:
    """logits [B, V] float32, per-row temperature/top_k/top_p/min_p [B], noise [B, V] -> ids [B] int64."""
    b, vocab = logits.shape
    out = torch.zeros(b, dtype=torch.int64)
    ids = torch.arange(vocab)
    for r in range(b):
        row = logits[r].float().nan_to_num(nan=float("-inf"), posinf=float("inf"))
        t = float(temperature[r])
        if t <= 0.0:
            score = row
        else:
            x = row / torch.tensor(t, dtype=torch.float32)
            x = torch.where(x == 0, torch.zeros_like(x), x)
            keep = torch.ones(vocab, dtype=torch.bool)
            k = int(top_k[r])
            if 0 < k < vocab:
                keep &= x >= torch.topk(x, k).values[-1]
            m = x.max()
            e = torch.exp(x - m)
            p = float(top_p[r])
            if p < 1.0:
                order = torch.sort(torch.where(keep, x, float("-inf")), descending=True, stable=True).indices
                mass = torch.where(keep, e, torch.zeros_like(e))[order]
                cum = torch.cumsum(mass, 0)
                target = (top_p[r].float() * cum[-1]).reshape(1)  # float32, as the kernel computes it
                j = int(torch.searchsorted(cum, target)[0])
                j = min(j, vocab - 1)
                keep &= x >= x[order[j]]
            if float(min_p[r]) > 0.0:  # off at 0: every id stays, +inf logits included
                keep &= e >= float(min_p[r])
            score = torch.where(keep, x + noise[r].to(x.device), torch.full_like(x, float("-inf")))
        best = score.max()
        hit = ids[score == best]
        out[r] = int(hit[0]) if hit.numel() else 0
    return out
