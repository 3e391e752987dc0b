"""How many draft tokens each request verifies in the next step: the confidence schedule.

A verify step of B requests and k drafts each computes B * (1 + k) rows. While the step is bound
by reading the weights (small B) the extra rows are nearly free and drafting deeper pays; once it
is bound by compute (large B) every extra row costs its full share and drafting only pays with
very confident drafts. The schedule picks the k (0 .. max depth, one k for the whole step so it
replays the CUDA graph of width 1 + k) that maximises expected tokens per unit of step time:

    sum over requests r of E_r(k)  /  time(B, 1 + k)
    E_r(k) = 1 + sum_{j <= k} p_{r,1} * ... * p_{r,j}

where p_{r,i} is the chance that request r's draft i is accepted once its drafts before it were.

p_{r,i} comes from the draft's confidence (the MTP head's probability of its token, the
prompt-lookup match length) through an online calibration of that drafter's confidences
(draft_calibration.py). A draft without a confidence (the benchmarks' replay drafter; an MTP
request before its first draft came back) uses the measured per-position rate: S_j, the share of
verified requests whose first j drafts were all accepted (a running count from a prior of
PRIOR**j over PRIOR_WEIGHT pseudo-drafts), gives p_i = S_i / S_{i-1}, so a request without
confidences expects 1 + S_1 + ... + S_k tokens. A request that does not draft counts 1.

time(B, w) is the step time of width w at B's batch bucket (step_timer.StepTimes): seeded by the
graph replay times measured at capture, then measured on the running steps, on the device and on
the wall clock between steps (the larger counts: a step the host cannot prepare in the device's
time costs the host's). Without buckets
(CPU, enforce_eager: no graphs) the depth stays at its maximum.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from shardinfer.engine.draft_calibration import ConfidenceCalibration
from shardinfer.engine.step_timer import StepTimes

PRIOR = 0.7  # assumed acceptance of one draft token before any was verified
PRIOR_WEIGHT = 8.0  # how many verified drafts the prior is worth
# What drafting must promise over plain decoding, in tokens per unit of step time, before a step
# drafts or its requests propose: step times are measured with noise of this order, and in a
# host-bound step the verify rows look free while the proposals' host time is paid regardless.
MIN_GAIN = 1.02

Confidence = Sequence[float | None]  # per draft token of one request


class DraftBudget:
    def __init__(
        self,
        max_depth: int,
        step_ms: dict[tuple[int, int], float] | None,
        buckets: list[int] | None,
        drafter: str = "ngram",
    ) -> None:
        """`step_ms`: (width, bucket) -> seed step time; `drafter` ("ngram" or "mtp") chooses how
        its confidences are binned."""
        self.max_depth = max_depth
        self.step_ms = step_ms or {}  # the seed, as given
        self.buckets = buckets or []
        self.times = StepTimes(self.step_ms)
        self.drafted = [0] * max_depth  # per draft position: times it was verified
        self.accepted = [0] * max_depth  # ... and times it (and every draft before it) was accepted
        self.calibration = ConfidenceCalibration(drafter, max_depth)

    @property
    def scheduled(self) -> bool:
        return bool(self.times and self.buckets)

    def bucket(self, batch: int) -> int | None:
        """The graph bucket a step of `batch` requests replays (None: larger than every bucket)."""
        return next((b for b in self.buckets if b >= batch), None)

    def observe(self, width: int, batch: int, ms: float) -> None:
        """A measured step: `batch` requests verifying `width` rows each took `ms` on the device."""
        bucket = self.bucket(batch)
        if bucket is not None:
            self.times.observe(width, bucket, ms)

    def observe_paced(self, width: int, batch: int, ms: float) -> None:
        """A step's paced wall time: from the engine step that launched it to the next one."""
        bucket = self.bucket(batch)
        if bucket is not None:
            self.times.observe_paced(width, bucket, ms)

    def record(self, drafts: int, accepted: int, confidence: Confidence | None = None) -> None:
        """One request's verification: `drafts` drafted, the first `accepted` of them kept;
        `confidence`: what the drafter said of each when the step was planned (None: nothing)."""
        for j in range(min(drafts, self.max_depth)):
            self.drafted[j] += 1
            if j < accepted:
                self.accepted[j] += 1
        if confidence is not None:
            self.calibration.record(list(confidence[:drafts]), accepted)

    def survival(self) -> list[float]:
        """S_1 .. S_max: the estimated chance that the first j drafts are all accepted."""
        return [
            (self.accepted[j] + PRIOR ** (j + 1) * PRIOR_WEIGHT) / (self.drafted[j] + PRIOR_WEIGHT)
            for j in range(self.max_depth)
        ]

    def conditional_rates(self) -> list[float]:
        """p_1 .. p_max without confidence: S_i / S_{i-1} (S_0 = 1), at most 1."""
        rates, before = [], 1.0
        for s in self.survival():
            rates.append(min(1.0, s / before) if before > 0 else 0.0)
            before = s
        return rates

    def acceptance_by_position(self) -> list[float | None]:
        """Measured S_j (None where nothing was drafted that deep)."""
        return [a / d if d else None for a, d in zip(self.accepted, self.drafted, strict=True)]

    def expected_extra(self, confidence: Confidence) -> list[float]:
        """For one request: the expected accepted drafts at depth 1 .. len(confidence), the running
        sums of p_{r,1} * ... * p_{r,j}."""
        return self._extra(self._bins(confidence), self.conditional_rates())

    def _bins(self, confidence: Confidence) -> tuple[int | None, ...]:
        bin_of = self.calibration.bin_of
        return tuple(None if c is None else bin_of(c) for c in confidence[: self.max_depth])

    def _extra(self, bins: tuple[int | None, ...], rates: list[float]) -> list[float]:
        bin_probability = self.calibration.bin_probability
        return _running_sums(
            rates[i] if b is None else bin_probability(i, b, rates[i]) for i, b in enumerate(bins)
        )

    def best_case(self) -> list[float]:
        """Per draft position: the highest chance that any draft there is accepted once the drafts
        before it were, over every confidence bin's estimate and the rate of drafts without one."""
        rates = self.conditional_rates()
        cal = self.calibration
        return [
            max([rates[i], *(cal.bin_probability(i, b, rates[i]) for b in range(len(cal.reached[i])))])
            for i in range(self.max_depth)
        ]

    def worth_drafting(self, batch: int, rooms: Sequence[int], certain: bool = False) -> bool:
        """Whether any depth could beat plain decoding by MIN_GAIN for a step of `batch` requests of
        which some may draft `rooms` tokens each, were every draft as likely accepted as the best
        confidence bin's drafts are estimated to be (`certain`: were every draft accepted): when
        not, depth() would choose 0 whatever the confidences, and nobody needs to propose."""
        bucket = self.bucket(batch)
        plain = self.times.ms(1, bucket) if bucket is not None else None
        if not self.scheduled or bucket is None or plain is None or plain <= 0:
            return True
        # expected[j]: the accepted drafts of a request drafting j
        expected = [0.0, *_running_sums([1.0] * self.max_depth if certain else self.best_case())]
        return self._paying_depth(batch, bucket, lambda k: sum(expected[min(k, r)] for r in rooms)) > 0

    def depth(self, batch: int, confidences: Sequence[Confidence] | None = None) -> int:
        """The draft depth for a step of `batch` running requests. `confidences`: per request that
        can draft, one entry per draft it can make (None: no confidence for that draft); None: all
        `batch` requests draft up to the maximum depth without confidences."""
        if not self.scheduled or batch <= 0:
            return self.max_depth
        bucket = self.bucket(batch)
        if bucket is None:
            return self.max_depth
        rates = self.conditional_rates()
        # Requests whose drafts fall in the same bins expect the same: one sum per distinct case.
        groups: dict[tuple[int | None, ...], int] = {}
        if confidences is None:
            groups[(None,) * self.max_depth] = batch
        else:
            for c in confidences:
                key = self._bins(c)
                groups[key] = groups.get(key, 0) + 1
        extras = [(self._extra(key, rates), n) for key, n in groups.items() if key]
        return self._paying_depth(batch, bucket, lambda k: sum(n * e[min(k, len(e)) - 1] for e, n in extras))

    def _paying_depth(self, batch: int, bucket: int, extra: Callable[[int], float]) -> int:
        """The depth k with the most tokens per ms, (batch + extra(k)) over the measured time of a
        step of width 1 + k, among those beating plain decoding by MIN_GAIN; 0 where none does.

        A step's time is taken as at least that of every narrower width at the bucket: a wider
        step does more work, and an estimate below a narrower one's (a wider width known only
        from its capture-time seed beside a narrower one measured on long contexts, or noise)
        would otherwise make drafts that are never accepted look like they pay."""
        plain = self.times.ms(1, bucket)
        best, best_rate = 0, batch / plain * MIN_GAIN if plain is not None and plain > 0 else 0.0
        narrower = plain if plain is not None and plain > 0 else 0.0
        for k in range(1, self.max_depth + 1):
            ms = self.times.ms(1 + k, bucket)
            if ms is None or ms <= 0:
                continue
            ms = narrower = max(ms, narrower)
            rate = (batch + extra(k)) / ms
            if rate > best_rate:
                best, best_rate = k, rate
        return best


def _running_sums(probabilities: Iterable[float]) -> list[float]:
    """Expected accepted drafts at depth 1, 2, ...: running sums of the running products of each
    position's chance of acceptance given the ones before it."""
    out, keep, total = [], 1.0, 0.0
    for p in probabilities:
        keep *= p
        total += keep
        out.append(total)
    return out
