"""Counter-based sampling noise: a pure function of (seed, absolute position, token id).

The sampled token is argmax over allowed ids of (logits / T + g(seed, position, id)), i.e. the
Gumbel-max trick. Because g is keyed by the token id — not by a sorted rank, a step counter or a
shared generator's state — a request's tokens cannot depend on its batch, its neighbours, a
restart, or whether a speculative drafter proposed them.

The hash is murmur3's 32-bit finaliser chained over the 32-bit words of the key, computed in
int64 tensors so that CPU and GPU (and the Triton sampling kernel) give identical bits:
products of two values below 2**32 may wrap in int64 but their low 32 bits stay exact.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_C1 = 0x85EBCA6B
_C2 = 0xC2B2AE35
_GOLDEN = 0x9E3779B9


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3 finaliser on int64 tensors holding values in [0, 2**32)."""
    h = h ^ (h >> 16)
    h = (h * _C1) & _MASK32
    h = h ^ (h >> 13)
    h = (h * _C2) & _MASK32
    return h ^ (h >> 16)


def _mix(h: torch.Tensor, word: torch.Tensor) -> torch.Tensor:
    return fmix32(((h ^ (word & _MASK32)) + _GOLDEN) & _MASK32)


def hash_key(seeds: torch.Tensor, positions: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """32-bit hash of (seed: 63-bit, position, token id), broadcast over the inputs' shapes."""
    seeds = seeds.to(torch.int64)
    h = _mix(torch.zeros_like(seeds), seeds)
    h = _mix(h, (seeds >> 32) & _MASK32)
    h = _mix(h, positions.to(torch.int64))
    return _mix(h, token_ids.to(torch.int64))


def uniform_from_hash(h: torch.Tensor) -> torch.Tensor:
    """Top 24 bits of the hash -> float32 uniform strictly inside (0, 1)."""
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / 16777216.0)


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [B, V] float32 for rows with seeds [B] (int64) at positions [B] (int64)."""
    ids = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device).view(1, -1)
    h = hash_key(seeds.view(-1, 1), positions.view(-1, 1), ids)
    u = uniform_from_hash(h)
    return -torch.log(-torch.log(u))
