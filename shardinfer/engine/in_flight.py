"""What one step hands the next: the step whose forward is queued on the device and whose sampled
tokens the host has not read yet.

Asynchronous scheduling keeps the engine one step behind the device (docs/engine.md): step N is
launched before step N-1 is completed, so N-1's data travels from one `step()` to the next in an
`InFlightStep`, the only state the overlap needs. A synchronous engine completes each step
before `step()` returns and never holds one.

An in-flight step is in one of two states:

    sampling queued      sampled = DeviceSample (or None: nothing sampled), unsampled = None
    waiting for masks    unsampled = its SamplingPlan, whose grammar masks are being filled on
                         the mask thread; the next step() queues its sampling before anything else
"""

from __future__ import annotations

from dataclasses import dataclass

from shardinfer.engine.input_fixup import DraftChoice, InputFixup, PreviousStep
from shardinfer.engine.prompt_scores import PromptScores
from shardinfer.engine.request import Request
from shardinfer.engine.sampler import DeviceSample, SamplingPlan
from shardinfer.engine.scheduler import ScheduledBatch


@dataclass
class InFlightStep:
    batch: ScheduledBatch
    requests: list[Request]  # the requests that sample, in sampling-row order
    counts: list[int]  # sampling rows per request: 1, or 1 + its draft tokens
    output_slots: list[int]  # per request: its placeholder's index in output_token_ids, or DRAFTS / DISCARDED
    # request id -> its prompt positions scored by this step (engine/prompt_scores.py)
    prompt_scores: dict[str, PromptScores]
    sampled: DeviceSample | None = None
    unsampled: SamplingPlan | None = None
    # Per request: its drafts' confidences when planned, for the draft budget (None: none).
    draft_confidence: list[list[float | None] | None] | None = None

    @classmethod
    def launched(cls, plan: SamplingPlan, sampled: DeviceSample | None) -> InFlightStep:
        """A planned step whose sampling is queued (the plan's logits are not kept past it)."""
        logits = plan.step_logits
        return cls(
            plan.batch,
            logits.sample_requests,
            logits.sample_counts,
            plan.output_slots,
            logits.prompt_scores,
            sampled,
            draft_confidence=plan.draft_confidence,
        )

    @classmethod
    def waiting_for_masks(cls, plan: SamplingPlan) -> InFlightStep:
        """A planned step whose sampling waits for the masks being filled on the mask thread."""
        step = cls.launched(plan, None)
        step.unsampled = plan
        return step

    def first_rows(self) -> list[int]:
        rows, row = [], 0
        for c in self.counts:
            rows.append(row)
            row += c
        return rows

    def newest_position(self, req: Request, i: int) -> int:
        """Where request i's newest slot of this step is in the host's layout now. This step is
        the request's oldest one not read back, so its slots are the first placeholders; an earlier
        step's rejected drafts, dropped since this one was planned, have moved them back."""
        return req.num_prompt_tokens + req.num_output_tokens - req.num_placeholders + self.counts[i] - 1

    def pending_chunk_mismatch(self, batch: ScheduledBatch) -> bool:
        """Whether a request of `batch` with drafts in flight here starts anywhere but at its
        newest slot: its inputs would need more than a shift (only a recomputation after
        preemption could do that); the engine then completes this step first."""
        if self.sampled is None or self.sampled.accepted is None:
            return False
        index = {id(r): i for i, r in enumerate(self.requests)}
        for req in batch.requests:
            i = index.get(id(req))
            if (
                i is not None
                and self.counts[i] > 1
                and req.num_computed_tokens != self.newest_position(req, i)
            ):
                return True
        return False

    def input_fixup(self, batch: ScheduledBatch) -> InputFixup | None:
        """The next batch's inputs that are still on the device: this step's newest tokens, its
        shifts (rejected drafts) and the next step's drafts that depend on them (input_fixup.py)."""
        if self.sampled is None:
            return None
        sampled = self.sampled
        previous = PreviousStep(
            sampled.tokens, self.first_rows(), sampled.last_rows, sampled.shifts, sampled.mtp_drafts
        )
        index = {id(r): i for i, r in enumerate(self.requests)}
        fix = InputFixup(previous, [], [])
        shifted = sampled.shifts is not None
        choice = DraftChoice([])
        counts = self.counts
        offset = 0
        # One pass, per request only integer reads (this runs on the host every step).
        for b, (req, n) in enumerate(zip(batch.requests, batch.num_new_tokens, strict=True)):
            start = req.num_computed_tokens
            total = req.num_tokens
            i = index.get(id(req), -1)
            if i >= 0 and req.num_placeholders:
                newest = total - req.num_placeholders + counts[i] - 1  # newest_position(req, i)
                if start <= newest < start + n:
                    fix.token_rows.append(offset + newest - start)
                    fix.token_prev.append(i)
            samples = start + n == total
            k = req.num_draft_tokens
            if shifted:
                own = i if i >= 0 and counts[i] > 1 else -1
                fix.token_shift_of += [own] * n
                fix.token_owner += [b] * n
                fix.request_shift_of.append(own)
                if samples:  # the request samples k + 1 rows
                    fix.sample_shift_of += [own] * (k + 1)
            else:
                own = -1
            if k and samples:
                first_draft = offset + n - k
                if req.device_drafts:
                    for j in range(req.device_drafts):
                        fix.mtp_rows.append(first_draft + j)
                        fix.mtp_prev.append(i)
                        fix.mtp_cols.append(j)
                elif req.draft_choices is not None and len(req.draft_choices) > 1:
                    q = len(choice.table)
                    choice.table.append(req.draft_choices)
                    for j in range(k):
                        choice.rows.append(first_draft + j)
                        choice.entries.append((q, j, own))
            offset += n
        if choice.rows:
            fix.choice = choice
        if not (fix.token_rows or fix.mtp_rows or fix.choice or fix.shifted):
            return None
        return fix
