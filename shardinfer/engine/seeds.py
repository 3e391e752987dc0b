"""The seeds of a request's samples and of a job's rows: pure Python, so that what plans and reads a
job (status, history, a dry run) derives them without importing torch.

A derived seed is a hash of a seed and keys (sample index, row id), stable across runs, machines
and Python versions; the noise it keys lives in `sampling_noise`.
"""

from __future__ import annotations

import hashlib


def derive_seed(seed: int, *keys: int | str) -> int:
    """A new 63-bit seed from a seed and keys (sample index, row id, ...), stable across runs."""
    payload = ":".join([str(int(seed))] + [str(k) for k in keys]).encode()
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "little") & (2**63 - 1)


def sample_seed(seed: int, sample_index: int) -> int:
    """Seed of sample j of a request with n > 1: sample 0 keeps the request's seed."""
    return seed if sample_index == 0 else derive_seed(seed, "sample", sample_index)


def sample_seeds(seed: int, n: int, row_id: str | None = None) -> list[int]:
    """The seeds of the n samples of one row: the one place both the job and `LLM` derive them.

    A job's row (`row_id` given) seeds sample j with `derive_seed(seed, row_id, j)`: the row's
    output then depends on its id, never on its position in the input or its batch. A prompt of
    `LLM.generate` (no row id; its seed is already the request's own) keeps that seed for sample 0,
    so n=1 samples exactly what the same seeded request would, and derives the others.
    """
    if row_id is not None:
        return [derive_seed(seed, row_id, j) for j in range(n)]
    return [sample_seed(seed, j) for j in range(n)]
