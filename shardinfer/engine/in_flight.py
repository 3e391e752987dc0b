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

import torch

from shardinfer.engine.model_runner import InputFixup
from shardinfer.engine.request import Request
from shardinfer.engine.sampler import DeviceSample, SamplingPlan
from shardinfer.engine.scheduler import ScheduledBatch


@dataclass
class InFlightStep:
    batch: ScheduledBatch
    requests: list[Request]  # the requests that sample, in sampling-row order
    counts: list[int]  # sampling rows per request: 1, or 1 + its draft tokens
    output_slots: list[int]  # per request: its placeholder's index in output_token_ids, or DRAFTS / DISCARDED
    # request id -> (first prompt position scored, logits [n, V]) for prompt logprobs
    prompt_logits: dict[str, tuple[int, torch.Tensor]]
    sampled: DeviceSample | None = None
    unsampled: SamplingPlan | None = None

    @classmethod
    def launched(cls, plan: SamplingPlan, sampled: DeviceSample | None) -> InFlightStep:
        """A planned step whose sampling is queued (the plan's logits are not kept past it)."""
        logits = plan.step_logits
        return cls(plan.batch, logits.sample_requests, logits.sample_counts, plan.output_slots,
                   logits.prompt_logits, sampled)

    @classmethod
    def waiting_for_masks(cls, plan: SamplingPlan) -> InFlightStep:
        """A planned step whose sampling waits for the masks being filled on the mask thread."""
        step = cls.launched(plan, None)
        step.unsampled = plan
        return step

    def input_fixup(self, batch: ScheduledBatch) -> InputFixup | None:
        """The next batch's inputs that are this step's sampled tokens, not yet known on the host."""
        if self.sampled is None:
            return None
        rows: list[int] = []
        index: list[int] = []
        offset = 0
        for req, n in zip(batch.requests, batch.num_new_tokens, strict=True):
            offset += n
            if req.num_placeholders and req.num_computed_tokens + n == req.num_tokens:
                rows.append(offset - 1)
                index.append(req.sample_slot)
        return InputFixup(rows, index, self.sampled.tokens) if rows else None
