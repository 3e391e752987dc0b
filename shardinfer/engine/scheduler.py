"""One token budget per step: running requests first (decodes and unfinished prefills, oldest
first), then waiting requests as KV blocks and the sequence cap allow, each prefill chunked to
whatever budget is left. When a running request cannot get a block, the newest running request
is preempted (its blocks freed, its tokens recomputed later), which may be the request itself.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from shardinfer.engine.block_manager import BlockManager
from shardinfer.engine.request import NOT_ADMITTED, Request, RequestStatus


@dataclass
class ScheduledBatch:
    """What one step computes: each request's next num_new tokens."""

    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.requests)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        admission_batch: int = 1,
        sliding_window: int | None = None,
    ) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs}: must be >= 1")
        if max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens={max_num_batched_tokens}: must be >= 1")
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # While requests are decoding, admit new ones only once this many sequence slots are free:
        # a step that mixes in prefill cannot replay a decode CUDA graph, so admitting in groups
        # keeps most steps on the fast path. 1 = admit whenever a slot frees up.
        self.admission_batch = max(1, min(admission_batch, max_num_seqs))
        # When every attention layer has this window, blocks that left it are released early.
        self.sliding_window = sliding_window
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        block_size = self.blocks.block_size
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens_to_compute - req.num_computed_tokens, budget)
            # finishing: its last token is in flight. n == 0: a prompt-only request whose last chunk is
            # in flight; it is retired when that step is read back.
            if n <= 0 or req.finishing:
                i += 1
                continue
            # Most decode steps need no block: the request's blocks already hold its new tokens.
            if req.num_computed_tokens + n > len(req.block_table) * block_size:
                while not self.blocks.can_allocate(req, req.num_computed_tokens + n):
                    victim = self.running[-1]
                    self._preempt(victim, batch)
                    if victim is req:
                        break
                if req.status is not RequestStatus.RUNNING:
                    continue  # it preempted itself; the list shrank, i already points past it
                self.blocks.allocate(req, req.num_computed_tokens + n)
            batch.requests.append(req)
            batch.num_new_tokens.append(n)
            budget -= n
            i += 1
        # Preemptions only happen when blocks are short: admit nothing new in such a step.
        free_slots = self.max_num_seqs - len(self.running)
        decoding = any(r.num_computed_tokens >= r.num_prompt_tokens for r in self.running)
        if decoding and free_slots < min(self.admission_batch, len(self.waiting)):
            return batch
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not batch.preempted:
            req = self.waiting[0]
            cached = self.blocks.find_cached_prefix(req)
            computed = len(cached) * self.blocks.block_size
            n = min(req.num_tokens_to_compute - computed, budget)
            if not self.blocks.can_allocate(req, computed + n, cached):
                break
            self.waiting.popleft()
            self.blocks.admit(req, cached)
            if req.num_cached_tokens == NOT_ADMITTED:
                req.num_cached_tokens = computed
            self.blocks.allocate(req, computed + n)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            batch.requests.append(req)
            batch.num_new_tokens.append(n)
            budget -= n
        return batch

    def _preempt(self, req: Request, batch: ScheduledBatch) -> None:
        self.running.remove(req)
        self.blocks.free_request(req)
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        batch.preempted.append(req)

    def after_step(self, batch: ScheduledBatch) -> None:
        """Advance computed-token counts and hash the blocks that became full."""
        for req, n in zip(batch.requests, batch.num_new_tokens, strict=True):
            req.num_computed_tokens += n
            self.blocks.register_full_blocks(req, req.num_computed_tokens)
            if self.sliding_window is not None:
                # Later queries sit at or after the first position not yet computed and known (drafts
                # and tokens still being sampled may be rolled back); they see keys > q - window.
                next_query = min(req.num_computed_tokens, req.num_resolved_tokens)
                self.blocks.release_before(req, next_query - self.sliding_window + 1)

    def finish(self, req: Request) -> None:
        """Remove a finished (or aborted) request and release its blocks."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.blocks.free_request(req)
