"""Speculative decoding: draft tokens before a step, verify them after it.

Two drafters: prompt lookup (`propose`: the tokens that followed the latest earlier occurrence
of the sequence's last n tokens, n = 3, 2, 1, longest first; no model involved, so it suits any
checkpoint and pays off on outputs that copy from the prompt) and a DeepSeek checkpoint's MTP
layer (draft_device.mtp_drafts). A host drafter may be replaced (`Drafter.proposer`), which is how
the benchmarks' replay drafter plugs in.

Drafts are only proposals: every drafted position is sampled with the same (seed, position)
noise as plain decoding, and a draft is kept only while it equals the sampled token, so
speculative outputs are token-identical to non-speculative ones
(reference/deterministic-speculative-decoding.md).

With asynchronous scheduling, step N+1 is drafted and launched before step N is read back. The
host then lays N+1 out as if all of N's drafts were accepted; the device corrects that by the
number it rejected (input_fixup.py). The MTP draft for N+1 is computed on the device from N's
hidden states; a host drafter proposes from the host copy, which trails by one step (it may
offer one proposal per possible rejection count, of which the device picks the right one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from shardinfer.engine.config import EngineConfig
from shardinfer.engine.draft_budget import DraftBudget
from shardinfer.engine.draft_calibration import LONGEST_MATCH_BIN
from shardinfer.engine.ngram_index import MATCH_LENGTHS, SEARCH_WINDOW, IndexedLookup
from shardinfer.engine.output_processor import OutputProcessor
from shardinfer.engine.request import PLACEHOLDER, Request, RequestStatus
from shardinfer.engine.sampler import SampleResult
from shardinfer.engine.scheduler import ScheduledBatch, Scheduler

FILLER = 0.0  # the confidence of a token that only pads a prompt-lookup draft to the step's width
# How often a step whose requests skip proposing (draft_budget.DraftBudget.worth_drafting) probes
# with one draft each instead, so the acceptance estimates can learn that drafts pay again.
PROBE_EVERY = 64


def propose(tokens: list[int], max_draft: int) -> list[int]:
    """Up to max_draft tokens that followed the latest earlier match of tokens' suffix."""
    return lookup(tokens, max_draft)[0]


def lookup(tokens: list[int], max_draft: int) -> tuple[list[int], int]:
    """propose's draft and its match length: how many tokens before the draft's source agree with
    the sequence's last ones (the suffix that found it, measured further back up to
    LONGEST_MATCH_BIN; 0 when nothing matched). The length is the draft's confidence.

    The search runs over the window as one numpy comparison per suffix token (a Python loop over
    the window took milliseconds per request, which a GPU step of a large batch cannot hide)."""
    if max_draft <= 0 or len(tokens) < 2:
        return [], 0
    lo = max(0, len(tokens) - SEARCH_WINDOW)
    window = np.asarray(tokens[lo:], dtype=np.int64)
    size = len(window)
    for n in MATCH_LENGTHS:
        if len(tokens) <= n:
            continue
        # Start i (window coordinates, i < size - n) matches when window[i + j] == suffix[j] for all j.
        hit = np.ones(size - n, dtype=bool)
        for j in range(n):
            hit &= window[j : size - n + j] == window[size - n + j]
        starts = np.flatnonzero(hit)
        if starts.size:
            i = lo + int(starts[-1])
            length = n
            while (
                length < LONGEST_MATCH_BIN
                and i + n - 1 - length >= 0
                and tokens[i + n - 1 - length] == tokens[-1 - length]
            ):
                length += 1
            return tokens[i + n : i + n + max_draft], length
    return [], 0


@dataclass
class Proposal:
    """A host drafter's drafts (HostProposer) with its confidence in each token of them."""

    choices: list[list[int]]
    confidence: list[float] | None = None  # per draft token; None: the drafter has none


class HostProposer(Protocol):
    def __call__(self, req: Request, room: int, in_flight: int) -> Proposal | list[list[int]]:
        """Drafts for `req`'s next step, at most `room` tokens. The request's last `in_flight`
        slots are those of its step still on the device (its drafts, then a placeholder for the
        token after them). Returns one draft per number r of those drafts the device may reject
        (index r; a single draft when it does not depend on r), or [] for none; as a Proposal
        when the drafter has a confidence in its tokens (a bare list has none: the draft budget
        then uses the measured acceptance of each draft position)."""
        ...


def ngram_proposer(req: Request, room: int, in_flight: int) -> Proposal:
    """Prompt lookup over the host copy: with a step in flight, its drafts are taken as accepted
    and the lookup also predicts the token after them, which the draft then follows. Every
    token's confidence is the match length."""
    tokens = req.all_token_ids
    if in_flight:
        drafts, length = lookup(tokens[:-1], room + 1)
        drafts = drafts[1:]
    else:
        drafts, length = lookup(tokens, room)
    return Proposal([drafts] if drafts else [], [float(length)] * len(drafts))


class NgramProposer:
    """ngram_proposer's drafts from per-request n-gram indexes (ngram_index.py): the drafter's
    default, whose lookup time does not grow with the sequence."""

    def __init__(self) -> None:
        self.lookup = IndexedLookup()

    def __call__(self, req: Request, room: int, in_flight: int) -> Proposal:
        if in_flight:
            drafts, length = self.lookup(req, req.num_tokens - 1, room + 1)
            drafts = drafts[1:]
        else:
            drafts, length = self.lookup(req, req.num_tokens, room)
        return Proposal([drafts] if drafts else [], [float(length)] * len(drafts))


def _fill(draft: list[int], room: int, req: Request) -> list[int]:
    """A host draft padded to `room` tokens (repeating its last token, or the newest known one):
    every drafting request then verifies the same number of rows, so the step can replay the
    CUDA graph of that width. A filler token costs only its verify row, which the graph computes
    anyway, and is accepted whenever it happens to be right."""
    if len(draft) >= room:
        return draft
    if draft:
        last = draft[-1]
    else:
        known = [t for t in req.token_slice(max(0, req.num_tokens - 2), req.num_tokens) if t != PLACEHOLDER]
        last = known[-1] if known else 0
    return draft + [last] * (room - len(draft))


@dataclass
class _Candidate:
    """A request that can draft this step, before the budget picks the depth."""

    req: Request
    choices: list[list[int]]  # host drafts, unpadded (one per rejection count); MTP: its one draft
    room: int  # drafts it may verify: the host drafter's room, the MTP draft's length
    confidence: list[float | None]  # per draft it can make (room entries)
    on_device: bool = False  # MTP drafts the device makes from the step in flight


class Drafter:
    """Adds drafts to the running requests before a step is scheduled, and verifies them after."""

    def __init__(
        self,
        config: EngineConfig,
        scheduler: Scheduler,
        outputs: OutputProcessor,
        max_model_len: int,
        counters: dict[str, float],
        budget: DraftBudget | None = None,
    ) -> None:
        self.use_mtp = config.speculative_mode == "mtp"
        self.depth = config.draft_depth
        # The confidence schedule (None or without step times: always self.depth).
        self.budget = budget or DraftBudget(
            self.depth, None, None, drafter="mtp" if self.use_mtp else "ngram"
        )
        # The depth the budget chose for the newest step (None: no request could draft).
        self.last_depth: int | None = None
        self.proposer: HostProposer = NgramProposer()
        self.scheduler = scheduler
        self.outputs = outputs
        self.max_model_len = max_model_len
        self.counters = counters
        self._unproposed_steps = 0  # steps without proposals since the last probe

    def _probe_due(self) -> bool:
        """Counts a step that skipped proposing; True on every PROBE_EVERY-th."""
        self._unproposed_steps += 1
        if self._unproposed_steps < PROBE_EVERY:
            return False
        self._unproposed_steps = 0
        return True

    def add_drafts(self) -> None:
        """Append drafts to decoding requests whose next token's sampling depends on nothing but
        (seed, position) and the logits. Each such request first proposes as many drafts as it
        may verify, with the drafter's confidence in each; the budget then picks the step's depth
        from those confidences (at most self.depth) and every request keeps that many.

        MTP confidences are the head's probabilities, read back with the step that drafted them.
        With asynchronous scheduling the drafts of the step planned now are still being made on
        the device, so the schedule weighs the newest probabilities the host has: those of the
        request's previous drafts (one step behind). What it records for the calibration is that
        same value, so it learns how far the trailing probability predicts acceptance."""
        running = self.scheduler.running
        drafting = [(req, room, mtp) for req in running for room, mtp in [self._room(req)] if room]
        self.last_depth = None
        if not drafting:
            return  # nothing to choose: the step is not counted as one the budget decided
        depth = self.depth
        candidates: list[_Candidate] = []
        rooms = [r for _, r, _ in drafting]
        # Proposing costs host time per request (a prompt lookup each): skipped when even the
        # drafts of the best confidence, at their estimated acceptance, would not pay for their
        # verify rows. Then only every PROBE_EVERY-th such step proposes and verifies one draft
        # each, where certain drafts would pay, so the estimates keep learning what the drafts
        # are worth now (without it one bad stretch would switch speculation off for good).
        if not self.budget.scheduled or self.budget.worth_drafting(len(running), rooms):
            candidates = [self._propose(req, room, mtp) for req, room, mtp in drafting]
            if self.budget.scheduled:
                depth = min(self.depth, self.budget.depth(len(running), [c.confidence for c in candidates]))
        elif self._probe_due() and self.budget.worth_drafting(len(running), rooms, certain=True):
            candidates = [self._propose(req, room, mtp) for req, room, mtp in drafting]
            depth = min(self.depth, 1)
            self.counters["draft_probe_steps"] += 1
        else:
            depth = 0
        self.last_depth = depth
        self.counters["draft_depth_sum"] += depth
        self.counters["draft_depth_steps"] += 1
        if depth == 0 and self.depth:
            self.counters["speculation_off_steps"] += 1
        for candidate in candidates:
            self._place(candidate, depth)

    def _room(self, req: Request) -> tuple[int, list[int]]:
        """How many drafts `req` may verify this step (0: it does not draft), and the MTP draft the
        host holds for it (taken off the request: a draft is used once)."""
        mtp_draft, req.mtp_draft = req.mtp_draft, []
        req.device_drafts, req.draft_choices, req.draft_confidence = 0, None, None
        p = req.params
        committed = req.num_output_tokens - req.num_placeholders
        if (
            req.finishing
            or req.prompt_only  # it samples nothing, so nothing to verify
            or req.num_computed_tokens + 1 != req.num_tokens
            or req.grammar is not None
            or committed < p.min_tokens
            or p.has_penalties
        ):
            return 0, mtp_draft
        room = min(
            self.depth,
            req.max_tokens - req.num_output_tokens - 1,
            self.max_model_len - req.num_tokens - 1,
        )
        if room > 0 and self.use_mtp:
            # With a step in flight the draft is made on the device from that step.
            room = min(room, self.mtp_depth) if req.num_placeholders else min(room, len(mtp_draft))
        return max(room, 0), mtp_draft

    def _propose(self, req: Request, room: int, mtp_draft: list[int]) -> _Candidate:
        """What `req` drafts this step, up to `room` tokens, with the drafter's confidence in each."""
        in_flight = req.num_placeholders
        if self.use_mtp:
            draft = [PLACEHOLDER] * room if in_flight else mtp_draft[:room]
            known = req.mtp_confidence
            trailing = [known[j] if j < len(known) else None for j in range(room)]
            return _Candidate(req, [draft], room, trailing, bool(in_flight))
        proposed = self.proposer(req, room, in_flight)
        choices, given = (
            (proposed.choices, proposed.confidence) if isinstance(proposed, Proposal) else (proposed, None)
        )
        if given is None:
            confidence: list[float | None] = [None] * room
        else:
            confidence = [given[j] if j < len(given) else FILLER for j in range(room)]
        return _Candidate(req, choices or [[]], room, confidence)

    def _place(self, candidate: _Candidate, depth: int) -> None:
        """Append the candidate's first `depth` drafts (host drafts padded to that many)."""
        req = candidate.req
        room = min(depth, candidate.room)
        if room <= 0:
            return
        if self.use_mtp:
            draft = candidate.choices[0][:room]
            if candidate.on_device:
                req.device_drafts = len(draft)
        else:
            proposed = candidate.choices
            self.counters["padded_draft_tokens"] += room - min(len(c[:room]) for c in proposed)
            choices = [_fill(c[:room], room, req) for c in proposed]
            draft = choices[0]
            if len(choices) > 1:
                req.draft_choices = choices
        req.output_token_ids.extend(draft)
        req.num_placeholders += len(draft)
        req.num_draft_tokens = len(draft)
        req.draft_confidence = candidate.confidence[: len(draft)]
        self.counters["draft_tokens"] += len(draft)

    @property
    def mtp_depth(self) -> int:
        """MTP drafts made after each step: always the configured depth (a step drafting fewer
        uses the first ones), so a step drafted while the previous one is in flight never asks
        for more than the device made."""
        return max(1, self.depth)

    def trim_drafts(self, batch: ScheduledBatch) -> None:
        """Fit drafts to what was scheduled: a request that got fewer tokens than 1 + its drafts keeps
        only the drafts that fit; one not scheduled (or preempted) drops them."""
        scheduled = dict(zip(map(id, batch.requests), batch.num_new_tokens, strict=True))
        for req in [*self.scheduler.running, *self.scheduler.waiting]:
            if not req.num_draft_tokens:
                continue
            # The step computes the last real token and then n - 1 drafts (n = 0: not scheduled).
            keep = max(0, min(req.num_draft_tokens, scheduled.get(id(req), 0) - 1))
            drop = req.num_draft_tokens - keep
            if drop:
                del req.output_token_ids[len(req.output_token_ids) - drop :]
                req.num_placeholders -= drop
                req.num_draft_tokens = keep
                self.counters["draft_tokens"] -= drop
                req.device_drafts = min(req.device_drafts, keep)
                if req.draft_confidence is not None:
                    req.draft_confidence = req.draft_confidence[:keep] if keep else None
                if keep == 0:
                    req.draft_choices = None
                elif req.draft_choices is not None:
                    req.draft_choices = [c[:keep] for c in req.draft_choices]

    def verify(
        self,
        req: Request,
        result: SampleResult,
        index: int,
        first_row: int,
        count: int,
        confidence: Sequence[float | None] | None = None,
    ) -> None:
        """Resolve a launched speculative step of `req` (its `index`-th sampling request, rows
        first_row .. first_row + count - 1): keep the drafts the device accepted and the token
        sampled after them, drop the slots of the rejected drafts and move the request (and a
        following step's slots) back by their number. `confidence`: the drafter's, per draft,
        when the step was planned (for the budget's calibration)."""
        assert result.accepted is not None
        accepted = result.accepted[index]
        first = req.num_output_tokens - req.num_placeholders  # this step's slots come first
        for j in range(accepted + 1):
            req.output_token_ids[first + j] = result.token_ids[first_row + j]
            req.num_placeholders -= 1
            self.outputs.accept_token(
                req, first + j, result.logprobs[first_row + j], result.top_logprobs[first_row + j]
            )
            if req.status.finished:  # a stop among the accepted tokens: the rest are not needed
                self.counters["accepted_draft_tokens"] += min(j + 1, accepted)
                self.budget.record(min(j + 1, accepted), min(j + 1, accepted), confidence)
                return
        self.counters["accepted_draft_tokens"] += accepted
        self.budget.record(count - 1, accepted, confidence)
        rejected = count - 1 - accepted
        end = first + accepted + 1
        if rejected:
            del req.output_token_ids[end : end + rejected]
            req.num_placeholders -= rejected
            if req.status is RequestStatus.RUNNING:
                req.num_computed_tokens -= rejected
            req.finishing = req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.max_model_len
        self._resolve_next_drafts(req, result, index, end, rejected)

    def _resolve_next_drafts(
        self, req: Request, result: SampleResult, index: int, start: int, rejected: int
    ) -> None:
        """Give the host copy of a following step's drafts (slots from `start`) the values the
        device chose for them, and keep the MTP draft for a step drafted after this one."""
        if self.use_mtp and result.mtp_drafts is not None:
            drafts = result.mtp_drafts[index]
            req.mtp_draft = list(drafts)
            if result.mtp_confidence is not None:
                req.mtp_confidence = result.mtp_confidence[index]
            if req.device_drafts and start + req.device_drafts <= req.num_output_tokens:
                req.output_token_ids[start : start + req.device_drafts] = drafts[: req.device_drafts]
                req.device_drafts = 0
        if req.draft_choices is not None:
            row = req.draft_choices[min(rejected, len(req.draft_choices) - 1)]
            req.output_token_ids[start : start + len(row)] = row
            req.draft_choices = None

    def after_plain_step(self, req: Request, result: SampleResult, index: int) -> None:
        """A request that sampled one token in a step: keep its MTP draft and its next step's
        drafts' values (that step's slots start right after the one just resolved)."""
        start = req.num_output_tokens - req.num_placeholders
        self._resolve_next_drafts(req, result, index, start, 0)
