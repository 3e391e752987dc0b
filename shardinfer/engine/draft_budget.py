"""How many draft tokens each request verifies in the next step: the confidence schedule.

A verify step of B requests and k drafts each computes B * (1 + k) rows. While the step is bound
by reading the weights (small B) the extra rows are nearly free and drafting deeper pays; once it
is bound by compute (large B) every extra row costs its full share and drafting only pays with
very confident drafts. The schedule picks the k (0 .. max depth, one k for the whole step so it
replays the CUDA graph of width 1 + k) that maximises expected tokens per second:

    tokens(k) / time(B, 1 + k),  tokens(k) = 1 + S_1 + ... + S_k

where S_j, the chance that a request's first j drafts are all accepted, is the drafter's measured
per-position acceptance (a running count, starting from a prior of prior**j over PRIOR_WEIGHT
pseudo-drafts), and time(B, w) is the step time of the CUDA graph of width w at B's batch bucket,
measured on this GPU when the graphs were captured (cuda_graphs.DecodeGraphs.replay_ms). Without
that table (CPU, enforce_eager) the depth stays at its maximum.
"""

from __future__ import annotations

PRIOR = 0.7  # assumed acceptance of one draft token before any was verified
PRIOR_WEIGHT = 8.0  # how many verified drafts the prior is worth


class DraftBudget:
    def __init__(self, max_depth: int, step_ms: dict[tuple[int, int], float] | None,
                 buckets: list[int] | None) -> None:
        self.max_depth = max_depth
        self.step_ms = step_ms or {}
        self.buckets = buckets or []
        self.drafted = [0] * max_depth  # per draft position: times it was verified
        self.accepted = [0] * max_depth  # ... and times it (and every draft before it) was accepted

    @property
    def scheduled(self) -> bool:
        return bool(self.step_ms and self.buckets)

    def record(self, drafts: int, accepted: int) -> None:
        """One request's verification: `drafts` drafted, the first `accepted` of them kept."""
        for j in range(min(drafts, self.max_depth)):
            self.drafted[j] += 1
            if j < accepted:
                self.accepted[j] += 1

    def survival(self) -> list[float]:
        """S_1 .. S_max: the estimated chance that the first j drafts are all accepted."""
        return [(self.accepted[j] + PRIOR ** (j + 1) * PRIOR_WEIGHT) / (self.drafted[j] + PRIOR_WEIGHT)
                for j in range(self.max_depth)]

    def acceptance_by_position(self) -> list[float | None]:
        """Measured S_j (None where nothing was drafted that deep)."""
        return [a / d if d else None for a, d in zip(self.accepted, self.drafted, strict=True)]

    def depth(self, batch: int) -> int:
        """The draft depth for a step of `batch` decoding requests."""
        if not self.scheduled or batch <= 0:
            return self.max_depth
        bucket = next((b for b in self.buckets if b >= batch), None)
        if bucket is None:
            return self.max_depth
        survival = self.survival()
        best, best_rate = 0, 0.0
        tokens = 1.0
        for k in range(self.max_depth + 1):
            if k:
                tokens += survival[k - 1]
            ms = self.step_ms.get((1 + k, bucket))
            if ms is None or ms <= 0:
                continue
            rate = tokens / ms
            if rate > best_rate:
                best, best_rate = k, rate
        return best
