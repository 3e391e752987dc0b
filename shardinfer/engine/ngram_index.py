"""Prompt lookup with an incremental index per request: the same drafts as drafting.lookup, found
in time that does not grow with the sequence.

drafting.lookup searches the last SEARCH_WINDOW tokens for the latest earlier occurrence of the
sequence's last n tokens (n = 3, 2, 1), which costs a pass over the window per request and step
(and the window's conversion to an array). Here each request keeps, per n, a dict from every
n-gram of its committed tokens to its latest start, updated as tokens are committed; a lookup is
then a dict read plus a check of the few starts whose n-gram reaches into the uncommitted tail.

Committed tokens (the request's tokens minus its placeholders: drafts and tokens still on the
device) never change, so the index only grows. Starts are taken into the index only up to one
token before the queried sequence's end: the suffix itself is never its own earlier occurrence.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from shardinfer.engine.draft_calibration import LONGEST_MATCH_BIN
from shardinfer.engine.request import Request

MATCH_LENGTHS = (3, 2, 1)
SEARCH_WINDOW = 2048  # only the last tokens are searched: older matches rarely pay
_LONGEST = max(MATCH_LENGTHS)
# How far back from the sequence's end a lookup reads: the longest suffix and its extension.
_REACH = _LONGEST + LONGEST_MATCH_BIN


class NgramIndex:
    """One request's n-grams: for n in MATCH_LENGTHS, n-gram -> its latest start (starts from
    self.base on: older ones lie outside every later lookup's window, and are dropped in one go
    once the index spans two windows, which bounds its size whatever the sequence's length)."""

    def __init__(self) -> None:
        self.latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in MATCH_LENGTHS}
        self.indexed = 0  # the n-grams ending at or before this many tokens are in the index
        self.base = 0  # ... and starting at or after this token

    def extend(self, req: Request, upto: int) -> None:
        """Take in the n-grams of req's tokens that end at or before `upto` (committed tokens only;
        a later lookup covers more than `upto` tokens)."""
        if upto <= self.indexed:
            return
        if upto - self.base > 2 * SEARCH_WINDOW:
            # A later lookup's window starts after upto - SEARCH_WINDOW: earlier starts never count.
            self.base = upto - SEARCH_WINDOW
            self.indexed = self.base
            self.latest = {n: {} for n in MATCH_LENGTHS}
        first = max(0, self.indexed - _LONGEST + 1)
        tokens = req.token_slice(first, upto)
        for n in MATCH_LENGTHS:
            latest = self.latest[n]
            for start in range(max(self.base, self.indexed + 1 - n), upto + 1 - n):
                latest[tuple(tokens[start - first : start - first + n])] = start
        self.indexed = upto

    def lookup(self, req: Request, length: int, max_draft: int) -> tuple[list[int], int]:
        """drafting.lookup over req's first `length` tokens, whose first self.indexed are indexed
        (self.indexed < length) and committed."""
        if max_draft <= 0 or length < 2:
            return [], 0
        lo = max(0, length - SEARCH_WINDOW)
        indexed = self.indexed
        # The sequence's end, enough of it for the suffixes, the unindexed starts and the extension.
        tail_from = min(length - _REACH, indexed - _LONGEST)
        if tail_from < 0:
            tail_from = 0
        tail = req.token_slice(tail_from, length)
        size = len(tail)
        for n in MATCH_LENGTHS:
            if length <= n:
                continue
            suffix = tail[size - n :]
            found = -1
            # Starts whose n-gram ends past the indexed tokens, latest first (a few at most).
            for start in range(length - n - 1, indexed - n if indexed >= n else -1, -1):
                if tail[start - tail_from : start - tail_from + n] == suffix:
                    found = start
                    break
            if found < 0:
                found = self.latest[n].get(tuple(suffix), -1)
            if found < lo:
                continue  # the latest start is outside the window: so is every other
            matched = n
            while matched < LONGEST_MATCH_BIN and found + n - 1 - matched >= 0:
                before = found + n - 1 - matched
                here = (
                    tail[before - tail_from]
                    if before >= tail_from
                    else req.token_slice(before, before + 1)[0]
                )
                if here != tail[size - 1 - matched]:
                    break
                matched += 1
            return req.token_slice(found + n, min(found + n + max_draft, length)), matched
        return [], 0


class IndexedLookup:
    """The per-request indexes of a drafter, dropped with their requests."""

    def __init__(self) -> None:
        self._indexes: WeakKeyDictionary[Request, NgramIndex] = WeakKeyDictionary()

    def __call__(self, req: Request, length: int, max_draft: int) -> tuple[list[int], int]:
        """drafting.lookup(req.all_token_ids[:length], max_draft), where the request's tokens past
        its committed ones may still change."""
        index = self._indexes.get(req)
        if index is None or index.indexed >= length:
            # New, or (never in the engine's use) asked about fewer tokens than it took in.
            index = self._indexes[req] = NgramIndex()
        index.extend(req, min(req.num_resolved_tokens, length - 1))
        return index.lookup(req, length, max_draft)
