"""Turning a draft token's confidence into an estimated chance that it is accepted.

Each drafter gives every draft token a confidence: the MTP head's softmax probability of the
token it drafted, or the prompt-lookup match length (0 for a filler token that only pads the
draft to the step's width). Neither is a probability of acceptance: a match length is a count,
and the head of a random or mismatched checkpoint is not calibrated. So acceptance is counted
online per (draft position, confidence bin) and the estimate is the bin's share, shrunk toward
the position's measured rate:

    p(position i, bin b) = (accepted[i][b] + W * rate_i) / (reached[i][b] + W)

where rate_i is the measured chance that draft i is accepted once drafts 1 .. i - 1 were
(draft_budget.DraftBudget.conditional_rates) and W is BIN_PRIOR_WEIGHT pseudo-drafts. A bin seen
rarely says what the measured rate says; a drafter whose confidence says nothing ends with every
bin near its position's rate, which is the schedule without confidence.

"Reached" counts the drafts whose earlier drafts were all accepted (only those can be accepted):
the estimate is the conditional chance p_{r,i}, and the chance that a request keeps its first j
drafts is the product p_{r,1} * ... * p_{r,j}.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

BIN_PRIOR_WEIGHT = 8.0  # pseudo-drafts at the position's measured rate behind every bin
PROBABILITY_BINS = 10  # deciles of the MTP head's probability
LONGEST_MATCH_BIN = 4  # match lengths 1, 2, 3 and LONGEST_MATCH_BIN or more; 0: filler


def probability_bin(confidence: float) -> int:
    """Decile of a probability (1.0 falls in the top decile)."""
    return min(max(int(confidence * PROBABILITY_BINS), 0), PROBABILITY_BINS - 1)


def match_length_bin(confidence: float) -> int:
    """0 for a filler token, else the match length, the longest ones sharing a bin."""
    return min(max(int(confidence), 0), LONGEST_MATCH_BIN)


BINNINGS: dict[str, tuple[Callable[[float], int], int]] = {
    "mtp": (probability_bin, PROBABILITY_BINS),
    "ngram": (match_length_bin, LONGEST_MATCH_BIN + 1),
}


class ConfidenceCalibration:
    """Per (draft position, confidence bin): drafts reached and drafts accepted."""

    def __init__(self, drafter: str, max_depth: int) -> None:
        if drafter not in BINNINGS:
            raise ValueError(
                f"drafter={drafter!r}: confidence bins exist for {', '.join(map(repr, BINNINGS))}"
            )
        self.bin_of, bins = BINNINGS[drafter]
        self.reached = [[0] * bins for _ in range(max_depth)]
        self.accepted = [[0] * bins for _ in range(max_depth)]

    def record(self, confidence: Sequence[float | None], accepted: int) -> None:
        """One request's verification: `confidence` of each draft verified, the first `accepted`
        kept. A draft without a confidence (None) is skipped; its position still counts for the
        drafts after it."""
        for i, c in enumerate(confidence[: len(self.reached)]):
            if i > accepted:
                break  # an earlier draft was rejected: this one was never in play
            if c is None:
                continue
            b = self.bin_of(c)
            self.reached[i][b] += 1
            if i < accepted:
                self.accepted[i][b] += 1

    def probability(self, position: int, confidence: float, rate: float) -> float:
        """The chance that the draft at `position` (0-based) with this confidence is accepted once
        the drafts before it were, given `rate`, that chance measured over all of the position's
        drafts."""
        return self.bin_probability(position, self.bin_of(confidence), rate)

    def bin_probability(self, position: int, b: int, rate: float) -> float:
        return (self.accepted[position][b] + BIN_PRIOR_WEIGHT * rate) / (
            self.reached[position][b] + BIN_PRIOR_WEIGHT
        )
