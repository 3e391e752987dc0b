"""Speculative decoding: draft tokens before a step, verify them after it.

Two drafters: prompt lookup (`propose`: the tokens that followed the latest earlier occurrence
of the sequence's last n tokens, n = 3, 2, 1, longest first; no model involved, so it suits any
checkpoint and pays off on outputs that copy from the prompt) and a DeepSeek checkpoint's MTP
layer (`Drafter.mtp_step`).

Drafts are only proposals: every drafted position is sampled with the same (seed, position)
noise as plain decoding, and a draft is kept only while it equals the sampled token, so
speculative outputs are token-identical to non-speculative ones
(reference/deterministic-speculative-decoding.md). Drafting reads the newest token on the
host, so speculative steps run synchronously.
"""

from __future__ import annotations

import torch

from shardinfer.engine.config import EngineConfig
from shardinfer.engine.device_copy import values_to_device
from shardinfer.engine.model_runner import ModelRunner
from shardinfer.engine.output_processor import OutputProcessor
from shardinfer.engine.request import Request
from shardinfer.engine.sampler import SampleResult, sample_on_device, sampling_row
from shardinfer.engine.scheduler import ScheduledBatch, Scheduler

MATCH_LENGTHS = (3, 2, 1)
SEARCH_WINDOW = 2048  # only the last tokens are searched: older matches rarely pay, and cost time


def propose(tokens: list[int], max_draft: int) -> list[int]:
    """Up to max_draft tokens that followed the latest earlier match of tokens' suffix."""
    if max_draft <= 0 or len(tokens) < 2:
        return []
    lo = max(0, len(tokens) - SEARCH_WINDOW)
    for n in MATCH_LENGTHS:
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        # Latest start i < len - n with tokens[i : i + n] == suffix.
        for i in range(len(tokens) - n - 1, lo - 1, -1):
            if tokens[i : i + n] == suffix:
                return tokens[i + n : i + n + max_draft]
    return []


class Drafter:
    """Adds drafts to the running requests before a step is scheduled, and verifies them after."""

    def __init__(self, config: EngineConfig, scheduler: Scheduler, runner: ModelRunner, outputs: OutputProcessor,
                 eos_token_ids: list[int], counters: dict[str, float]) -> None:
        self.max_draft = config.speculative_ngram_tokens or 1
        self.use_mtp = config.speculative_mtp
        self.scheduler = scheduler
        self.runner = runner
        self.outputs = outputs
        self.eos_token_ids = eos_token_ids
        self.max_model_len = runner.max_model_len
        self.counters = counters

    def add_drafts(self) -> None:
        """Append drafts to decoding requests whose next token's sampling depends on nothing but
        (seed, position) and the logits."""
        for req in self.scheduler.running:
            mtp_draft, req.mtp_draft = req.mtp_draft, []
            p = req.params
            if (req.num_placeholders or req.finishing or req.num_computed_tokens + 1 != req.num_tokens
                    or req.grammar is not None or req.num_output_tokens < p.min_tokens or p.has_penalties):
                continue
            room = min(self.max_draft, req.max_tokens - req.num_output_tokens - 1,
                       self.max_model_len - req.num_tokens - 1)
            draft = mtp_draft[:room] if self.use_mtp else propose(req.all_token_ids, room)
            if draft:
                req.output_token_ids.extend(draft)
                req.num_placeholders += len(draft)
                req.num_draft_tokens = len(draft)
                self.counters["draft_tokens"] += len(draft)

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

    def verify(self, req: Request, result: SampleResult, first: int, k: int) -> None:
        """Keep each draft token that equals the token plain decoding samples at its position, then
        the first sampled token that differs (or the one after the last draft)."""
        drafts = req.output_token_ids[len(req.output_token_ids) - k :]
        del req.output_token_ids[len(req.output_token_ids) - k :]
        req.num_placeholders -= k
        req.num_draft_tokens = 0
        for j in range(k + 1):
            token = result.token_ids[first + j]
            req.output_token_ids.append(token)
            slot = req.num_output_tokens - 1
            self.outputs.accept_token(req, slot, result.logprobs[first + j], result.top_logprobs[first + j])
            if req.status.finished or j == k or drafts[j] != token:
                break
            self.counters["accepted_draft_tokens"] += 1
        if not req.status.finished:
            # The newest token is not in the cache yet; everything before it is (drafts that matched).
            req.num_computed_tokens = req.num_tokens - 1

    def after_step(self, batch: ScheduledBatch, drafting: list[Request]) -> None:
        """Draft the next tokens from what the step computed: the MTP layer's work (the prompt-lookup
        drafter needs only the tokens, at the next add_drafts)."""
        if self.use_mtp:
            self.mtp_step(batch, drafting)

    def mtp_step(self, batch: ScheduledBatch, drafting: list[Request]) -> None:
        """Run the MTP layer over this step's positions and draft each live request's next token.

        Row p pairs the main model's hidden state at p with the token at p + 1 (known now that the
        step's tokens are verified), fills the MTP layer's cache at p, and predicts the token at
        p + 2. A request's draft comes from its last computed position; the draft is chosen with the
        same sampling rule and (seed, position) noise the main model's token will use there, which
        keeps acceptance high for sampled requests too. Rows past a request's verified tokens (a
        rejected draft's position) get token 0: their outputs are unused and their cache entries
        are rewritten when the position is computed again.
        """
        runner = self.runner
        if runner.last_forward is None:
            return
        input_ids, positions, ctx, hidden = runner.last_forward
        runner.last_forward = None
        next_ids: list[int] = []
        pick: dict[int, int] = {}  # id(request) -> flat row of its last computed position
        offset = 0
        for i, (req, n) in enumerate(zip(batch.requests, batch.num_new_tokens, strict=True)):
            start = ctx.attn.seq_lens_cpu[i] - n  # host copy: no device read
            tokens = req.token_slice(start + 1, start + n + 1)
            next_ids.extend(tokens + [0] * (n - len(tokens)))
            last = req.num_tokens - 2  # the newest token sits at num_tokens - 1
            if start <= last < start + n:
                pick[id(req)] = offset + last - start
            offset += n
        with torch.inference_mode():
            nxt = values_to_device(next_ids, torch.long, input_ids.device)
            draft_hidden = runner.model.mtp_forward(nxt, positions, hidden, ctx)
            live = [r for r in drafting if id(r) in pick]
            if not live:
                return
            rows = values_to_device([pick[id(r)] for r in live], torch.long, input_ids.device)
            logits = runner.model.mtp_compute_logits(draft_hidden[rows])
            picks = sample_on_device(logits, [sampling_row(r, r.num_tokens, self.eos_token_ids)
                                              for r in live]).result()
        for req, token in zip(live, picks.token_ids, strict=True):
            req.mtp_draft = [token]
