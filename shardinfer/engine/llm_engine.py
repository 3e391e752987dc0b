"""The streaming engine: requests in with add_request(), one scheduled model step per step(),
finished outputs out. The pipeline drives it directly; `LLM` wraps it for whole batches.

    add_request -> Scheduler.waiting -> schedule() -> _launch: ModelRunner.execute() + sample on device
                -> _complete: read tokens back, check stops -> finished? -> RequestOutput

With asynchronous scheduling, step N's _launch happens before step N-1's _complete (docs/engine.md).
When step N samples rows that need N-1's tokens on the host (grammar masks, penalties), N-1's
_complete runs between step N's forward and its sampling instead: the forward is already queued.
With grammar rows, N-1's tokens are read back and accepted into the matchers first
(_read_back), N's masks are filled on a worker thread from then on, and the engine thread
meanwhile finishes N-1's bookkeeping, plans N's sampling, returns and schedules step N+1; N's
sampling is queued at the start of step N+1, before N+1's forward.
"""

from __future__ import annotations

import secrets
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from shardinfer.engine.block_manager import BlockManager
from shardinfer.engine.config import EngineConfig
from shardinfer.engine.device_copy import values_to_device
from shardinfer.engine.heap import collect_dropped, freeze_startup_heap
from shardinfer.engine.kv_cache import allocate_kv_caches, plan_num_blocks
from shardinfer.engine.model_runner import InputFixup, ModelRunner, StepLogits
from shardinfer.engine.models.base import Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.registry import load_model
from shardinfer.engine.ngram_drafter import propose
from shardinfer.engine.outputs import CompletionOutput, RequestOutput
from shardinfer.engine.prompt_checks import check_prompt
from shardinfer.engine.request import PLACEHOLDER, Request, RequestStatus
from shardinfer.engine.sampler import (
    DeviceSample,
    GrammarMasks,
    SampleResult,
    SamplingRow,
    sample_on_device,
    top_k_logprobs,
)
from shardinfer.engine.sampling_params import SamplingParams, checkpoint_sampling_defaults
from shardinfer.engine.scheduler import ScheduledBatch, Scheduler
from shardinfer.engine.stop_checker import check_stop
from shardinfer.engine.tokenizer import Tokenizer

if TYPE_CHECKING:
    from shardinfer.engine.structured import GrammarViolation

    # What _read_back hands _complete: the sampled tokens, the live rows (request, output slot or
    # DRAFTS, first row, rows) and, per grammar row's request, the matcher's refusal or None.
    Accepted = tuple[SampleResult, list[tuple[Request, int, int, int]], dict[int, GrammarViolation | None]]

# PendingStep.output_slots markers for rows that own no placeholder.
DRAFTS = -1
DISCARDED = -2


@dataclass
class PendingStep:
    """A launched step whose sampled tokens are still on the device."""

    requests: list[Request]  # the requests that sampled, in sampling-row order
    counts: list[int]  # sampling rows per request: 1, or 1 + its draft tokens
    # Where each one's placeholder sits in its output_token_ids (DRAFTS: drafts hold the slots;
    # DISCARDED: the request finished before this step sampled, so its row's token is dropped).
    output_slots: list[int]
    sampled: DeviceSample | None
    prompt_logits: dict[str, tuple[int, torch.Tensor]]
    batch: ScheduledBatch


@dataclass
class SamplingPlan:
    """A forward's sampling rows prepared on the host (placeholders already in place); what is
    left is the grammar masks and queueing the sampling itself."""

    step_logits: StepLogits
    batch: ScheduledBatch
    rows: list[SamplingRow]
    output_slots: list[int]
    constrained: list[tuple[Request, int]]  # (request, sampling row) that need a grammar mask
    masks: Future[GrammarMasks | None] | None = None  # a fill running on the mask thread


class LLMEngine:
    def __init__(self, model: str | Path, **kwargs: Any) -> None:
        self.config = EngineConfig.from_kwargs(str(model), **kwargs)
        cfg = self.config
        self.model_dir = Path(cfg.model)
        if not self.model_dir.is_dir():
            raise FileNotFoundError(f"model directory {cfg.model!r} does not exist: pass a local Hugging Face "
                                    "model directory (config.json, *.safetensors, tokenizer.json)")
        self.model_config = ModelConfig.from_dir(self.model_dir)
        self.device = cfg.torch_device
        if self.device.type == "cuda":
            # An engine dropped in a reference cycle gives its memory back before this one
            # loads weights and sizes its KV cache from the free memory (heap.py).
            collect_dropped()
            torch.cuda.empty_cache()
        self.dtype = cfg.torch_dtype
        self.tokenizer = Tokenizer(self.model_dir, self.model_config.eos_token_ids)
        self.generation_defaults = checkpoint_sampling_defaults(self.model_dir)
        limit = cfg.max_model_len or self.model_config.max_position_embeddings
        if limit > self.model_config.max_position_embeddings:
            raise ValueError(f"max_model_len={limit} exceeds the model's max_position_embeddings="
                             f"{self.model_config.max_position_embeddings}")
        self.numerics = Numerics(self.dtype, cfg.batch_invariant)
        self.model = load_model(self.model_dir, self.model_config, self.numerics, limit, self.device)
        specs = self.model.kv_cache_specs()
        if cfg.speculative_mtp:
            if not getattr(self.model, "num_mtp_layers", 0):
                raise ValueError(f"speculative_mtp=True but {self.model_config.architecture} at {cfg.model!r} has no "
                                 "MTP layer (num_nextn_predict_layers): use speculative_ngram_tokens instead")
            specs = specs + self.model.mtp_kv_cache_specs()  # MTP caches follow the main layers'
        num_blocks = plan_num_blocks(cfg, specs, self.device, self.dtype, limit)
        # No request may need more blocks than exist, or preemption could never make room for it.
        self.max_model_len = min(limit, num_blocks * cfg.block_size)
        self.kv_caches = allocate_kv_caches(specs, num_blocks, cfg.block_size, self.dtype, self.device)
        self.block_manager = BlockManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching)
        admission = cfg.admission_batch
        if admission is None:
            admission = max(1, cfg.max_num_seqs // 8) if self.device.type == "cuda" else 1
        windows = {spec.sliding_window for spec in specs}
        uniform_window = windows.pop() if len(windows) == 1 else None
        self.scheduler = Scheduler(self.block_manager, cfg.max_num_seqs, cfg.max_num_batched_tokens, admission,
                                   uniform_window)
        if self.device.type == "cuda" and cfg.batch_invariant:
            from shardinfer.engine.models.layers import Linear
            from shardinfer.kernels.matmul import warm_up

            # Compile the large-batch matmul tilings now, not in the first long prefill step.
            warm_up([m.weight for m in self.model.modules() if isinstance(m, Linear)])
        graphs = None
        # The MTP drafter continues from each step's hidden states, which decode graphs do not keep.
        if self.device.type == "cuda" and not cfg.enforce_eager and not cfg.speculative_mtp:
            from shardinfer.engine.cuda_graphs import DecodeGraphs

            graphs = DecodeGraphs(self.model, self.kv_caches, cfg.block_size, self.max_model_len, cfg.max_num_seqs,
                                  self.device, cfg.batch_invariant)
            graphs.capture()
        self.runner = ModelRunner(self.model, self.kv_caches, cfg.block_size, self.device, cfg.batch_invariant,
                                  graphs, keep_last_forward=cfg.speculative_mtp)
        # Drafting reads the newest token on the host, so speculative steps run synchronously.
        self.speculative = bool(cfg.speculative_ngram_tokens or cfg.speculative_mtp)
        self.async_scheduling = (cfg.async_scheduling if cfg.async_scheduling is not None
                                 else self.device.type == "cuda" and not self.speculative)
        self._pending: PendingStep | None = None
        # A step whose forward is queued and whose grammar masks are being filled on the mask
        # thread; its sampling is queued at the start of the next step().
        self._unsampled: SamplingPlan | None = None
        self._mask_thread: ThreadPoolExecutor | None = None
        self.requests: dict[str, Request] = {}
        self._arrivals = 0
        self.counters: dict[str, float] = {
            "prompt_tokens": 0, "generated_tokens": 0, "cached_tokens": 0, "steps": 0, "finished_requests": 0,
            "draft_tokens": 0, "accepted_draft_tokens": 0, "synchronous_steps": 0, "deferred_sampling_steps": 0,
            "grammar_mask_wait_s": 0.0}
        self._grammar_compiler: Any = None
        if self.device.type == "cuda":
            # Startup's objects live as long as the engine: no full collection walks them again
            # mid-run (heap.py). A CPU step is long next to such a pause, so CPU engines skip it.
            freeze_startup_heap()

    # -- requests -------------------------------------------------------------------------------
    def tokenize_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if prompt == "":
                raise ValueError("prompt is empty: give at least one character or token id")
            return self.tokenizer.encode(prompt)
        ids = [int(t) for t in prompt]
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is out of range: ids must be in [0, {vocab})")
        return ids

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                    prompt_logprobs_from: int = 1) -> None:
        """Queue one request (params.n must be 1). Raises ValueError for an unusable prompt or params,
        leaving every other request untouched.

        `prompt_logprobs_from` (with params.prompt_logprobs set): the first prompt position whose
        logprob is wanted; earlier entries stay None. Scoring a continuation after a shared context
        sets it to the context length, so the context may come from the prefix cache (the positions
        before the last context token need no logits) and only the continuation's logits are computed."""
        params = params if params is not None else self.default_params()
        if params.n != 1:
            raise ValueError(f"LLMEngine.add_request takes n=1 (got n={params.n}); LLM.generate expands n")
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in flight")
        ids = self.tokenize_prompt(prompt)
        check_prompt(ids, self.max_model_len)
        room = self.max_model_len - len(ids)
        max_tokens = min(params.max_tokens, room) if params.max_tokens is not None else room
        seed = params.seed if params.seed is not None else (self.config.seed or secrets.randbits(63))
        req = Request(request_id, ids, params, int(seed), max_tokens,
                      prompt=prompt if isinstance(prompt, str) else None)
        if params.so_args is not None:
            req.grammar = self.grammar_compiler().matcher(params.so_args)
        if params.prompt_logprobs is not None:
            if not 1 <= prompt_logprobs_from < len(ids):
                raise ValueError(f"prompt_logprobs_from={prompt_logprobs_from} is outside the prompt: it must be in "
                                 f"[1, {len(ids) - 1}] for a prompt of {len(ids)} tokens")
            req.prompt_logprobs = [None] * prompt_logprobs_from
            req.prompt_top_logprobs = [None] * prompt_logprobs_from
        self._arrivals += 1
        self.requests[request_id] = req
        self.scheduler.add(req)

    def grammar_compiler(self) -> Any:
        if self._grammar_compiler is None:
            from shardinfer.engine.structured import StructuredOutputCompiler

            # Mask threads: llguidance's own default, 80% of the CPUs the process may use (1 to 32),
            # is kept: from 4 CPUs, where matchers are independent and scale with threads, it
            # gives 3 or more; on 2 CPUs it gives 1 thread (and copies of one template), leaving
            # the other CPU to the engine thread, which on a CPU device runs the model too.
            self._grammar_compiler = StructuredOutputCompiler(
                str(self.tokenizer.path), list(self.tokenizer.eos_token_ids), self.model_config.vocab_size,
                independent_matchers=self.config.independent_matchers)
        return self._grammar_compiler

    def default_params(self) -> SamplingParams:
        return SamplingParams(**self.generation_defaults)

    def abort(self, request_id: str) -> RequestOutput | None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        self.scheduler.finish(req)
        req.finish(RequestStatus.FINISHED_ABORTED)
        if req.num_placeholders:  # tokens still being sampled are dropped with the request
            del req.output_token_ids[req.num_output_tokens - req.num_placeholders :]
            req.num_placeholders = 0
        req.output_text = self.tokenizer.decode(req.output_token_ids, req.params.skip_special_tokens)
        return self._output(req)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_unfinished(self) -> int:
        return self.scheduler.num_unfinished

    # -- one step -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; return the requests that finished.

        With asynchronous scheduling, step N is launched on the device before step N-1's
        sampled tokens are read back, so the host's bookkeeping of N-1 (and the scheduling and
        batch building of N) overlaps the device's work. Rows whose sampling needs N-1's tokens
        on the host (grammar masks, penalties) get them between N's forward and N's sampling, so
        that wait, the matchers' advance and the mask filling overlap N's forward. The masks are
        filled on a worker thread from the moment N-1's tokens are accepted, so the engine thread
        meanwhile finishes N-1's bookkeeping, plans N's sampling and schedules N+1; N's sampling
        is queued here, first thing in step N+1, before N+1's forward. Only prompt logprobs make
        a step wait for N-1 before its forward.
        """
        if self.speculative:
            self._add_drafts()
        batch = self.scheduler.schedule()
        if self.speculative:
            self._trim_drafts(batch)
        if self._unsampled is not None:
            plan, self._unsampled = self._unsampled, None
            assert self._pending is None and plan.masks is not None
            waited = time.perf_counter()
            masks = plan.masks.result()
            self.counters["grammar_mask_wait_s"] += time.perf_counter() - waited
            self._pending = self._launch_sampling(plan, masks)
        finished: list[RequestOutput] = []
        if self._pending is not None and (not self.async_scheduling or self._needs_host_tokens(batch)):
            if self.async_scheduling:
                self.counters["synchronous_steps"] += 1
            finished += self._complete(self._pending)
            self._pending = None
            if batch.requests and any(r.finishing or r.status.finished for r in batch.requests):
                batch = self._reschedule(batch)
        if not batch.requests:
            if self._pending is not None:
                finished += self._complete(self._pending)
                self._pending = None
            elif self.scheduler.has_unfinished() and not finished:
                raise RuntimeError("no request could be scheduled although some are waiting: the KV cache is "
                                   "too small for one request; raise the KV budget or lower max_model_len")
            return finished
        launched, completed = self._launch(batch)
        finished += completed
        if self._pending is not None:
            finished += self._complete(self._pending)
        if self.async_scheduling:
            self._pending = launched
        else:  # synchronous: the sampling is never left to a later step
            assert launched is not None
            self._pending = None
            finished += self._complete(launched)
        return finished

    def _reschedule(self, batch: ScheduledBatch) -> ScheduledBatch:
        """Drop requests that finished (or will) while the batch was being planned.

        Only reached when a step had to wait for the previous one; their blocks stay allocated
        until retirement, so the batch shrinks but stays valid."""
        keep = ScheduledBatch(preempted=batch.preempted)
        for req, n in zip(batch.requests, batch.num_new_tokens, strict=True):
            if not (req.finishing or req.status.finished):
                keep.requests.append(req)
                keep.num_new_tokens.append(n)
        return keep

    def _needs_host_tokens(self, batch: ScheduledBatch) -> bool:
        """Whether the previous step must be read back before this batch's forward: prompt
        logprobs track which positions were scored on the host, also across preemption."""
        return any(req.params.prompt_logprobs is not None for req in batch.requests)

    @staticmethod
    def _needs_tokens_to_sample(sampling: list[Request]) -> bool:
        """Whether a sampling row needs its request's in-flight token on the host: a grammar mask
        comes from the matcher that token advances, penalties count the tokens."""
        return any(req.num_placeholders and (req.grammar is not None or req.params.has_penalties)
                   for req in sampling)

    def _launch(self, batch: ScheduledBatch) -> tuple[PendingStep | None, list[RequestOutput]]:
        """Queue the batch's forward, then its sampling; return the launched step (None when its
        sampling waits for masks being filled: `_unsampled`) and the requests finished on the way.

        When a sampling row needs the pending step's tokens on the host, the pending step is
        completed in between, while the forward runs."""
        step_logits = self._forward(batch)
        finished: list[RequestOutput] = []
        constrained: list[tuple[Request, int]] | None = None  # None: chosen when planning
        masks: Future[GrammarMasks | None] | None = None
        if self._pending is not None and self._needs_tokens_to_sample(step_logits.sample_requests):
            self.counters["deferred_sampling_steps"] += 1
            pending, self._pending = self._pending, None
            accepted = None
            if self.async_scheduling and pending.sampled is not None:
                # The masks need only the tokens and the advanced matchers: start filling them
                # now, and do the rest of the pending step's bookkeeping and this step's planning
                # on this thread meanwhile, off the path from those tokens to this sampling.
                accepted = self._read_back(pending)
                constrained = self._constrained_rows(step_logits, accepted[2])
                if constrained:
                    masks = self._fill_on_mask_thread(constrained)
            finished = self._complete(pending, accepted)
        plan = self._plan_sampling(step_logits, batch, constrained)
        if masks is None and self.async_scheduling and plan.constrained and self._pending is None:
            # Nothing else touches the matchers until the next step() queues this sampling, so
            # the fill runs beside the engine thread's scheduling of that step.
            masks = self._fill_on_mask_thread(plan.constrained)
        if masks is not None:
            plan.masks = masks
            self._unsampled = plan
            return None, finished
        return self._launch_sampling(plan, self._grammar_masks(plan.constrained)), finished

    def _fill_on_mask_thread(self, constrained: list[tuple[Request, int]]) -> Future[GrammarMasks | None]:
        """Start filling the masks on the mask thread; returns once the fill has begun."""
        if self._mask_thread is None:
            self._mask_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardinfer-masks")
        started = threading.Event()

        def fill() -> GrammarMasks | None:
            started.set()
            return self._grammar_masks(constrained)

        future = self._mask_thread.submit(fill)
        # A thread waiting for the GIL gets it when the holder blocks, or else only after the
        # interpreter's switch interval (5 ms). The engine thread goes straight on to Python
        # bookkeeping, so the fill would start up to 5 ms late, all of it on the path to this
        # step's sampling. Blocking here hands the GIL over at once; the mask thread gives it
        # back as soon as it is inside llguidance's fill.
        started.wait()
        return future

    @staticmethod
    def _constrained_rows(step_logits: StepLogits, violations: dict[int, GrammarViolation | None]
                          ) -> list[tuple[Request, int]]:
        """(request, first sampling row) of the rows that need a grammar mask, decided as soon as
        the previous step's tokens are accepted: not for finished requests, finished grammars or
        matchers that refused their token. A request the previous step's other checks (stop
        strings, stop ids) are about to end still gets one; its row is discarded unsampled-for."""
        rows, first = [], 0
        for req, count in zip(step_logits.sample_requests, step_logits.sample_counts, strict=True):
            if (req.grammar is not None and not req.status.finished and not req.grammar.is_finished()
                    and violations.get(id(req)) is None):
                rows.append((req, first))
            first += count
        return rows

    def _forward(self, batch: ScheduledBatch) -> StepLogits:
        """Queue the batch's forward pass (inputs still on the device come from the pending step)."""
        for req, n in zip(batch.requests, batch.num_new_tokens, strict=True):
            if req.num_computed_tokens < req.num_prompt_tokens:
                self.counters["prompt_tokens"] += min(n, req.num_prompt_tokens - req.num_computed_tokens)
        fixup = self._input_fixup(batch)
        step_logits = self.runner.execute(batch, fixup)
        self.scheduler.after_step(batch)
        self.counters["steps"] += 1
        return step_logits

    def _plan_sampling(self, step_logits: StepLogits, batch: ScheduledBatch,
                       constrained: list[tuple[Request, int]] | None = None) -> SamplingPlan:
        """A forward's sampling rows, with a placeholder where each token will go.

        A request may have finished since its forward was queued (the previous step, completed in
        between, stopped it): its row is sampled without a mask and its token dropped."""
        reqs, counts = step_logits.sample_requests, step_logits.sample_counts
        rows: list[SamplingRow] = []
        slots: list[int] = []
        first_rows: list[int] = []
        for req, count in zip(reqs, counts, strict=True):
            first_rows.append(len(rows))
            # Row j scores the token at position (tokens before the drafts) + j.
            base = req.num_tokens - (count - 1)
            rows.extend(self._sampling_row(req, base + j) for j in range(count))
        if constrained is None:
            constrained = [(r, first_rows[i]) for i, r in enumerate(reqs)
                           if r.grammar is not None and not r.status.finished]
        for i, (req, count) in enumerate(zip(reqs, counts, strict=True)):
            if req.status.finished:
                slots.append(DISCARDED)
                continue
            if count > 1:  # drafts already hold this step's slots
                slots.append(DRAFTS)
                continue
            req.output_token_ids.append(PLACEHOLDER)
            req.num_placeholders += 1
            req.sample_slot = first_rows[i]
            slots.append(req.num_output_tokens - 1)
            if req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.max_model_len:
                req.finishing = True
        return SamplingPlan(step_logits, batch, rows, slots, constrained)

    def _launch_sampling(self, plan: SamplingPlan, grammar: GrammarMasks | None) -> PendingStep:
        """Queue the sampling of a planned step's rows (nothing waits for the device)."""
        logits = plan.step_logits
        sampled = None
        if plan.rows:
            sampled = sample_on_device(logits.sample_logits, plan.rows, grammar)
            sampled.stage()
        return PendingStep(logits.sample_requests, logits.sample_counts, plan.output_slots, sampled,
                           logits.prompt_logits, plan.batch)

    def _input_fixup(self, batch: ScheduledBatch) -> InputFixup | None:
        """Inputs that are the previous step's sampled tokens, not yet known on the host."""
        if self._pending is None or self._pending.sampled is None:
            return None
        rows: list[int] = []
        index: list[int] = []
        offset = 0
        for req, n in zip(batch.requests, batch.num_new_tokens, strict=True):
            offset += n
            if req.num_placeholders and req.num_computed_tokens + n == req.num_tokens:
                rows.append(offset - 1)
                index.append(req.sample_slot)
        return InputFixup(rows, index, self._pending.sampled.tokens) if rows else None

    def _read_back(self, step: PendingStep) -> Accepted:
        """Wait for a launched step's sampled tokens (its only host sync) and advance the grammar
        matchers of its live rows by them, in one batched call: all that the next step's masks
        need. The rest of the step's bookkeeping is `_complete`'s."""
        assert step.sampled is not None
        result = step.sampled.result()
        live: list[tuple[Request, int, int, int]] = []  # (request, output slot or DRAFTS, first row, rows)
        row = 0
        for i, req in enumerate(step.requests):
            first, row = row, row + step.counts[i]
            slot = step.output_slots[i]
            if slot == DISCARDED or req.status.finished or self.requests.get(req.request_id) is not req:
                continue  # aborted, or finished by an earlier token while this one was in flight
            live.append((req, slot, first, step.counts[i]))
        constrained = [(req, result.token_ids[first]) for req, slot, first, _ in live
                       if slot != DRAFTS and req.grammar is not None]
        violations = dict(zip((id(req) for req, _ in constrained),
                              self.grammar_compiler().accept_tokens([(req.grammar, t) for req, t in constrained])
                              if constrained else [], strict=True))
        return result, live, violations

    def _complete(self, step: PendingStep, accepted: Accepted | None = None) -> list[RequestOutput]:
        """Read a launched step's results back (its only host sync) and do the bookkeeping;
        `accepted`: what `_read_back` already did for it."""
        for request_id, (first, logits) in step.prompt_logits.items():
            req = self.requests.get(request_id)
            if req is not None:
                self._record_prompt_logprobs(req, first, logits)
        if step.sampled is None:
            if self.config.speculative_mtp:
                self._mtp_step(step.batch, [])
            return []
        result, live, violations = accepted if accepted is not None else self._read_back(step)
        finished: list[RequestOutput] = []
        drafting: list[Request] = []
        for req, slot, first, count in live:
            if slot == DRAFTS:
                self._verify_drafts(req, result, first, count - 1)
            else:
                req.output_token_ids[slot] = result.token_ids[first]
                req.num_placeholders -= 1
                self._accept_token(req, slot, result.logprobs[first], result.top_logprobs[first],
                                   advance_grammar=False, violation=violations.get(id(req)))
            if req.status.finished:
                finished.append(self._retire(req))
            else:
                self.block_manager.register_full_blocks(req, req.num_computed_tokens)
                drafting.append(req)
        if self.config.speculative_mtp:
            self._mtp_step(step.batch, drafting)
        return finished

    # -- speculative decoding (prompt-lookup drafts) ------------------------------------------------
    def _add_drafts(self) -> None:
        """Append n-gram drafts to decoding requests whose next token's sampling depends on nothing
        but (seed, position) and the logits."""
        k_max = self.config.speculative_ngram_tokens or 1
        for req in self.scheduler.running:
            mtp_draft, req.mtp_draft = req.mtp_draft, []
            p = req.params
            if (req.num_placeholders or req.finishing or req.num_computed_tokens + 1 != req.num_tokens
                    or req.grammar is not None or req.num_output_tokens < p.min_tokens or p.has_penalties):
                continue
            room = min(k_max, req.max_tokens - req.num_output_tokens - 1, self.max_model_len - req.num_tokens - 1)
            draft = mtp_draft[:room] if self.config.speculative_mtp else propose(req.all_token_ids, room)
            if draft:
                req.output_token_ids.extend(draft)
                req.num_placeholders += len(draft)
                req.num_draft_tokens = len(draft)
                self.counters["draft_tokens"] += len(draft)

    def _trim_drafts(self, batch: ScheduledBatch) -> None:
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

    def _mtp_step(self, batch: ScheduledBatch, drafting: list[Request]) -> None:
        """Run the MTP layer over this step's positions and draft each live request's next token.

        Row p pairs the main model's hidden state at p with the token at p + 1 (known now that the
        step's tokens are verified), fills the MTP layer's cache at p, and predicts the token at
        p + 2. A request's draft comes from its last computed position; the draft is chosen with the
        same sampling rule and (seed, position) noise the main model's token will use there, which
        keeps acceptance high for sampled requests too. Rows past a request's verified tokens (a
        rejected draft's position) get token 0: their outputs are unused and their cache entries
        are rewritten when the position is computed again.
        """
        if self.runner.last_forward is None:
            return
        input_ids, positions, ctx, hidden = self.runner.last_forward
        self.runner.last_forward = None
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
            draft_hidden = self.model.mtp_forward(nxt, positions, hidden, ctx)
            live = [r for r in drafting if id(r) in pick]
            if not live:
                return
            rows = values_to_device([pick[id(r)] for r in live], torch.long, input_ids.device)
            logits = self.model.mtp_compute_logits(draft_hidden[rows])
            picks = sample_on_device(logits, [self._sampling_row(r, r.num_tokens) for r in live]).result()
        for req, token in zip(live, picks.token_ids, strict=True):
            req.mtp_draft = [token]

    def _verify_drafts(self, req: Request, result: SampleResult, first: int, k: int) -> None:
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
            self._accept_token(req, slot, result.logprobs[first + j], result.top_logprobs[first + j])
            if req.status.finished or j == k or drafts[j] != token:
                break
            self.counters["accepted_draft_tokens"] += 1
        if not req.status.finished:
            # The newest token is not in the cache yet; everything before it is (drafts that matched).
            req.num_computed_tokens = req.num_tokens - 1

    def _sampling_row(self, req: Request, position: int) -> SamplingRow:
        p = req.params
        blocked: list[int] = []
        if req.num_output_tokens < p.min_tokens:
            blocked = list(p.stop_token_ids) + ([] if p.ignore_eos else list(self.tokenizer.eos_token_ids))
        # Penalties count the tokens known now: a copy, since the placeholder of the token this row
        # samples is appended before the sampling is queued (the other rows never read the list).
        outputs = list(req.output_token_ids) if p.has_penalties else req.output_token_ids
        return SamplingRow(p, req.seed, position, req.prompt_token_ids, outputs, blocked)

    def _grammar_masks(self, constrained: list[tuple[Request, int]]) -> GrammarMasks | None:
        """The next-token mask of each (request, sampling row), filled in one call on the compiler's threads."""
        if not constrained:
            return None
        from shardinfer.engine.structured import allocate_bitmask

        compiler = self.grammar_compiler()
        bitmask = allocate_bitmask(len(constrained), self.model_config.vocab_size,
                                   pin_memory=self.device.type == "cuda")
        compiler.fill_bitmasks([(req.grammar, j) for j, (req, _) in enumerate(constrained)], bitmask)
        return GrammarMasks(bitmask, [row for _, row in constrained])

    def _record_prompt_logprobs(self, req: Request, first: int, logits: torch.Tensor) -> None:
        lps = torch.log_softmax(logits.float(), dim=-1)
        targets = torch.tensor(req.prompt_token_ids[first + 1 : first + 1 + lps.shape[0]], dtype=torch.long,
                               device=lps.device)
        values = lps.gather(1, targets.view(-1, 1)).view(-1).tolist()
        k = req.params.prompt_logprobs or 0
        for i, v in enumerate(values):
            req.prompt_logprobs.append(v)
            req.prompt_top_logprobs.append(top_k_logprobs(lps[i], k) if k else None)

    def _accept_token(self, req: Request, slot: int, logprob: float, top: list[tuple[int, float]] | None,
                      advance_grammar: bool = True, violation: GrammarViolation | None = None) -> None:
        """Output token `slot` is now known: record it, advance the grammar, check for a stop.
        advance_grammar=False: the matcher already took the token in `_read_back`'s batched accept,
        and `violation` is its refusal, if any."""
        token = req.output_token_ids[slot]
        req.output_logprobs.append(logprob)
        if top is not None:
            req.output_top_logprobs.append(top)
        self.counters["generated_tokens"] += 1
        if req.grammar is not None:
            try:
                if violation is not None:
                    raise violation
                if advance_grammar:
                    req.grammar.accept(token)
            except RuntimeError as exc:  # the mask should make this impossible; fail the request, not the step
                req.error = f"structured output: {exc}"
                req.output_text = self.tokenizer.decode(req.output_token_ids[:slot], req.params.skip_special_tokens)
                del req.output_token_ids[slot + 1 :]
                req.num_placeholders = 0
                req.finish(RequestStatus.FINISHED_ERROR)
                return
        status, reason, text = check_stop(req, self.tokenizer, self.max_model_len, slot + 1)
        req.output_text = text
        if status is not None:
            # Tokens launched after this one (asynchronous scheduling) are discarded.
            del req.output_token_ids[slot + 1 :]
            req.num_placeholders = 0
            req.finish(status, reason)

    def _retire(self, req: Request) -> RequestOutput:
        self.scheduler.finish(req)
        self.requests.pop(req.request_id, None)
        self.counters["finished_requests"] += 1
        self.counters["cached_tokens"] += max(req.num_cached_tokens, 0)
        return self._output(req)

    def _output(self, req: Request) -> RequestOutput:
        p = req.params
        completion = CompletionOutput(
            index=0, text=req.output_text, token_ids=list(req.output_token_ids), logprobs=list(req.output_logprobs),
            top_logprobs=list(req.output_top_logprobs) if p.logprobs else None,
            finish_reason=req.status.value if req.status.finished else None, seed=req.seed,
            stop_reason=req.stop_reason, error=req.error)
        return RequestOutput(
            request_id=req.request_id, prompt=req.prompt, prompt_token_ids=list(req.prompt_token_ids),
            prompt_logprobs=list(req.prompt_logprobs) if p.prompt_logprobs is not None else None,
            prompt_top_logprobs=list(req.prompt_top_logprobs) if p.prompt_logprobs else None,
            outputs=[completion], num_cached_tokens=max(req.num_cached_tokens, 0),
            finished=req.status.finished, metrics={"preemptions": float(req.num_preemptions)})

    def stats(self) -> dict[str, float]:
        """Counters since the engine was built. With asynchronous scheduling, synchronous_steps
        counts steps whose forward waited for the previous step's tokens (prompt logprobs), and
        deferred_sampling_steps those that read the previous step back between their forward and
        their sampling (grammar masks, penalties); both stay 0 without it. grammar_mask_wait_s is
        the time the engine thread waited for grammar masks filled on the mask thread: the part of
        the fill that planning the next step did not hide."""
        out: dict[str, float] = {k: float(v) for k, v in self.counters.items()}
        out["prefix_cache_hit_rate"] = self.block_manager.prefix_hit_rate
        out["preemptions"] = float(self.scheduler.num_preemptions)
        out["kv_blocks"] = float(self.block_manager.num_blocks)
        return out

