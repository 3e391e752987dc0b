"""The streaming engine: requests in with add_request(), one scheduled model step per step(),
finished outputs out. The pipeline drives it directly; `LLM` wraps it for whole batches.

A step is three moves: schedule, run (`_launch`: the forward, then its sampling, queued on the
device), postprocess (`_complete`: read the tokens back, accept them, check stops, retire). The
engine owns the requests and the order of those moves; the rooms it calls are

    ModelRunner       the model on its device: KV cache, warm-up, CUDA graphs, forward passes
    sampler           the sampling-row plan and the sampling itself
    GrammarMaskFiller structured-output masks, on a mask thread when the overlap allows
    OutputProcessor   accepting tokens, stop checks, prompt logprobs, RequestOutputs
    Drafter           speculative decoding: drafts before the step, verification after it

With asynchronous scheduling the engine runs one step behind the device: step N is launched
before step N-1 is completed, and N-1 travels from one step() to the next as `in_flight`
(engine/in_flight.py). When step N samples rows that need N-1's tokens on the host (grammar
masks, penalties), N-1 is completed between N's forward and N's sampling instead: the forward
is already queued. With grammar rows, N-1's tokens are read back and accepted into the matchers
first, N's masks are filled on the mask thread from then on, and the engine thread meanwhile
finishes N-1's bookkeeping, plans N's sampling, returns and schedules step N+1; N's sampling is
queued at the start of step N+1, before N+1's forward (docs/engine.md).
"""

from __future__ import annotations

import logging
import secrets
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardinfer.engine.block_manager import BlockManager
from shardinfer.engine.config import EngineConfig
from shardinfer.engine.draft_budget import DraftBudget
from shardinfer.engine.draft_device import count_accepted, mtp_drafts
from shardinfer.engine.drafting import Drafter
from shardinfer.engine.grammar_masks import GrammarMaskFiller, constrained_rows
from shardinfer.engine.heap import freeze_startup_heap
from shardinfer.engine.host_threads import limit_host_threads
from shardinfer.engine.in_flight import InFlightStep
from shardinfer.engine.model_runner import ModelRunner, StepLogits
from shardinfer.engine.models.config import ModelConfig, model_directory
from shardinfer.engine.output_processor import OutputProcessor
from shardinfer.engine.outputs import RequestOutput
from shardinfer.engine.prompt_checks import check_prompt, check_stop_token_ids, length_fix, tokenize_prompt
from shardinfer.engine.request import Request
from shardinfer.engine.sampler import DRAFTS, GrammarMasks, SamplingPlan, plan_sampling, sample_on_device
from shardinfer.engine.sampling_params import SamplingParams, checkpoint_sampling_defaults
from shardinfer.engine.scheduler import ScheduledBatch, Scheduler
from shardinfer.engine.startup_phases import StartupPhases, device_sync, init_device
from shardinfer.engine.step_timer import StepTimer
from shardinfer.engine.tokenizer import Tokenizer

if TYPE_CHECKING:
    from shardinfer.engine.output_processor import Accepted


logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, model: str | Path, **kwargs: Any) -> None:
        started = time.monotonic()
        self.config = EngineConfig.from_kwargs(str(model), **kwargs)
        cfg = self.config
        self.model_dir = model_directory(cfg.model)
        self.model_config = ModelConfig.from_dir(self.model_dir)
        self.device = cfg.torch_device
        self.dtype = cfg.torch_dtype
        phases = StartupPhases(sync=device_sync(self.device))
        limit = cfg.max_model_len or self.model_config.max_position_embeddings
        if limit > self.model_config.max_position_embeddings:
            raise ValueError(
                f"max_model_len={limit} exceeds the model's max_position_embeddings="
                f"{self.model_config.max_position_embeddings}"
            )
        # The tokenizer loads on a thread while the device starts and the weights stream in: it needs
        # neither, and the weight reads wait on the file system, not on the interpreter.
        with ThreadPoolExecutor(1, thread_name_prefix="tokenizer-load") as pool:
            tokenizer = pool.submit(self._load_tokenizer, phases)
            if self.device.type == "cuda":
                with phases.phase("device_init_s"):
                    init_device(self.device)
            self.runner = ModelRunner(cfg, self.model_dir, self.model_config, limit, phases)
            self.tokenizer, self.generation_defaults = tokenizer.result()
        self.numerics = self.runner.numerics
        self.model = self.runner.model
        self.kv_caches = self.runner.kv_caches
        self.max_model_len = self.runner.max_model_len
        # A KV cache too small for `limit` tokens caps max_model_len; a too-long prompt's error then
        # says so, since raising max_model_len would not help.
        self.max_model_len_asked = limit
        self.length_fix = length_fix(limit, self.max_model_len, self.runner.num_blocks, cfg.block_size)
        if self.max_model_len < limit:
            log = logger.warning if cfg.max_model_len is not None else logger.info
            log(
                "max_model_len is %d, not %d: the KV cache holds %d blocks of %d tokens",
                self.max_model_len,
                limit,
                self.runner.num_blocks,
                cfg.block_size,
            )
        with phases.phase("block_table_s"):
            self.block_manager = BlockManager(
                self.runner.num_blocks,
                cfg.block_size,
                cfg.enable_prefix_caching,
                split_generated=self.runner.sends_prompt_lens,
            )
        admission = cfg.admission_batch
        if admission is None:
            admission = max(1, self.runner.num_seqs // 8) if self.device.type == "cuda" else 1
        windows = {spec.sliding_window for spec in self.runner.kv_specs}
        uniform_window = windows.pop() if len(windows) == 1 else None
        self.scheduler = Scheduler(
            self.block_manager, self.runner.num_seqs, cfg.token_budget, admission, uniform_window
        )
        self.requests: dict[str, Request] = {}
        self._arrivals = 0
        self.counters: dict[str, float] = {
            "prompt_tokens": 0,
            "generated_tokens": 0,
            "cached_tokens": 0,
            "steps": 0,
            "finished_requests": 0,
            "draft_tokens": 0,
            "accepted_draft_tokens": 0,
            "padded_draft_tokens": 0,
            "graphed_verify_steps": 0,
            "graphed_mtp_steps": 0,
            "draft_depth_sum": 0,
            "draft_depth_steps": 0,
            "speculation_off_steps": 0,
            "timed_draft_steps": 0,
            "draft_probe_steps": 0,
            "synchronous_steps": 0,
            "deferred_sampling_steps": 0,
            "grammar_mask_wait_s": 0.0,
        }
        self.grammar_masks = GrammarMaskFiller(
            self.tokenizer.path,
            list(self.tokenizer.eos_token_ids),
            self.model_config.vocab_size,
            cfg.independent_matchers,
            pin_memory=self.device.type == "cuda",
        )
        self.outputs = OutputProcessor(
            self.tokenizer, self.max_model_len, self.requests, self.grammar_masks, self.counters
        )
        self.speculative = cfg.speculative_mode != "off"
        self.drafter = (
            Drafter(
                cfg, self.scheduler, self.outputs, self.max_model_len, self.counters, self._draft_budget()
            )
            if self.speculative
            else None
        )
        self.async_scheduling = (
            cfg.async_scheduling if cfg.async_scheduling is not None else self.device.type == "cuda"
        )
        # Device time of the pure decode steps, measured while the engine runs, for the draft
        # budget's step-time estimates (step_timer.py). CUDA only: elsewhere nothing times a step.
        self.step_timer: StepTimer | None = None
        # With the timer, the wall time from one step() to the next is charged to the timed step
        # launched in the first (draft_budget.observe_paced); the clock is replaceable for tests.
        self.pace_clock = time.perf_counter
        self._paced: tuple[float, tuple[int, int]] | None = None  # (step() entry, launched key)
        self._launched_key: tuple[int, int] | None = None
        if self.drafter is not None and self.drafter.budget.scheduled and self.device.type == "cuda":
            self.step_timer = StepTimer()
        # The step launched but not yet completed (asynchronous scheduling only).
        self.in_flight: InFlightStep | None = None
        if self.device.type == "cuda":
            # Startup's objects live as long as the engine: no full collection walks them again
            # mid-run (heap.py). A CPU step is long next to such a pause, so CPU engines skip it.
            with phases.phase("heap_freeze_s"):
                freeze_startup_heap()
            # After the build, whose CPU work (loading, quantising) may use every thread.
            limit_host_threads(self.device)
        # Seconds per start-up phase, in the order they ran, and the whole build (engine/startup_phases.py).
        self.startup_phases: dict[str, float] = {**phases.seconds, "total_s": time.monotonic() - started}

    def _draft_budget(self) -> DraftBudget:
        """The confidence schedule over the verify graphs' measured step times (draft_budget.py)."""
        graphs = self.runner.graphs
        drafter = self.config.speculative_mode
        if self.config.speculative_budget != "confidence" or graphs is None:
            return DraftBudget(self.config.draft_depth, None, None, drafter)
        return DraftBudget(self.config.draft_depth, graphs.replay_ms, graphs.sizes, drafter)

    def _load_tokenizer(self, phases: StartupPhases) -> tuple[Tokenizer, dict[str, Any]]:
        started = time.monotonic()
        tokenizer = Tokenizer(self.model_dir, self.model_config.eos_token_ids)
        defaults = checkpoint_sampling_defaults(self.model_dir)
        phases.add("tokenizer_s", time.monotonic() - started)  # overlapped: not part of the build's sum
        return tokenizer, defaults

    # -- requests -------------------------------------------------------------------------------
    def tokenize_prompt(self, prompt: str | list[int]) -> list[int]:
        return tokenize_prompt(self.tokenizer, self.model_config.vocab_size, prompt)

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        prompt_logprobs_from: int = 1,
    ) -> None:
        """Queue one request (params.n must be 1). Raises ValueError for an unusable prompt or params,
        leaving every other request untouched.

        `prompt_logprobs_from` (with params.prompt_logprobs set): the first prompt position whose
        logprob is wanted; earlier entries stay None. Scoring a continuation after a shared context
        sets it to the context length, so the context may come from the prefix cache (the positions
        before the last context token need no logits) and only the continuation's logits are computed.

        params.max_tokens=0 makes a prompt-only request: every prompt token but the last is fed,
        the last is only scored, nothing is sampled, and it finishes ("length") with no output
        tokens once its prompt logprobs are in. Its prompt may hold max_model_len + 1 tokens."""
        params = params if params is not None else self.default_params()
        if params.n != 1:
            raise ValueError(f"LLMEngine.add_request takes n=1 (got n={params.n}); LLM.generate expands n")
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in flight")
        ids = self.tokenize_prompt(prompt)
        prompt_only = params.max_tokens == 0
        check_prompt(ids, self.max_model_len, self.length_fix, prompt_only=prompt_only)
        check_stop_token_ids(params.stop_token_ids, self.model_config.vocab_size)
        room = self.max_model_len - len(ids)
        max_tokens = min(params.max_tokens, room) if params.max_tokens is not None else room
        if prompt_only:  # its prompt may pass max_model_len by the one token it never feeds
            max_tokens = 0
        seed = params.seed if params.seed is not None else (self.config.seed or secrets.randbits(63))
        req = Request(
            request_id, ids, params, int(seed), max_tokens, prompt=prompt if isinstance(prompt, str) else None
        )
        if params.so_args is not None:
            req.grammar = self.grammar_compiler().matcher(params.so_args)
        if params.prompt_logprobs is not None:
            # The first token has no logprob, so a one-token prompt's are [None], as in vLLM.
            last = max(1, len(ids) - 1)
            if not 1 <= prompt_logprobs_from <= last:
                raise ValueError(
                    f"prompt_logprobs_from={prompt_logprobs_from} is outside the prompt: it must be in "
                    f"[1, {last}] for a prompt of {len(ids)} tokens"
                )
            req.prompt_logprobs = [None] * prompt_logprobs_from
            req.prompt_top_logprobs = [None] * prompt_logprobs_from
        self._arrivals += 1
        self.requests[request_id] = req
        self.scheduler.add(req)

    def grammar_compiler(self) -> Any:
        return self.grammar_masks.compiler()

    def default_params(self) -> SamplingParams:
        """The checkpoint's sampling defaults (generation_config.json); a bad value there is named as
        the file's, not as one the caller passed."""
        try:
            return SamplingParams(**self.generation_defaults)
        except ValueError as exc:
            raise ValueError(
                f"{exc} (from {str(self.model_dir / 'generation_config.json')!r}, the checkpoint's "
                "sampling defaults: fix the file, or pass SamplingParams explicitly)"
            ) from None

    def abort(self, request_id: str) -> RequestOutput | None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        self.scheduler.finish(req)
        return self.outputs.abort(req)

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
        entered = self._charge_pace()
        if self.drafter is not None:
            self._read_step_times()
            self.drafter.add_drafts()
        batch = self.scheduler.schedule()
        if self.drafter is not None:
            self.drafter.trim_drafts(batch)
        previous, self.in_flight = self.in_flight, None
        if previous is not None and previous.unsampled is not None:
            previous = self._sample_after_masks(previous.unsampled)
        finished: list[RequestOutput] = []
        if previous is not None and (
            not self.async_scheduling
            or self._needs_host_tokens(batch)
            or previous.pending_chunk_mismatch(batch)
        ):
            if self.async_scheduling:
                self.counters["synchronous_steps"] += 1
            finished += self._complete(previous)
            previous = None
            if batch.requests and (
                self.speculative or any(r.finishing or r.status.finished for r in batch.requests)
            ):
                batch = self._reschedule(batch)
        if not batch.requests:
            if previous is not None:
                finished += self._complete(previous)
            elif self.scheduler.has_unfinished() and not finished:
                raise RuntimeError(
                    "no request could be scheduled although some are waiting: the KV cache is "
                    "too small for one request; raise the KV budget or lower max_model_len"
                )
            return finished
        self._launched_key = None
        launched, previous, completed = self._launch(batch, previous)
        if entered is not None and self._launched_key is not None:
            self._paced = (entered, self._launched_key)
        finished += completed
        if previous is not None:
            finished += self._complete(previous)
        if self.async_scheduling:
            self.in_flight = launched
        else:  # synchronous: the sampling is never left to a later step
            assert launched.unsampled is None
            finished += self._complete(launched)
        return finished

    def _charge_pace(self) -> float | None:
        """Charge the wall time since the previous step() to the timed step it launched; returns
        this step's entry time (None without a step timer)."""
        if self.step_timer is None or self.drafter is None:
            return None
        now = self.pace_clock()
        if self._paced is not None:
            started, (width, batch) = self._paced
            self.drafter.budget.observe_paced(width, batch, (now - started) * 1000.0)
            self._paced = None
        return now

    def _read_step_times(self) -> None:
        """Fold the timed steps the device has finished into the draft budget (never waits)."""
        if self.step_timer is None or self.drafter is None:
            return
        for (width, batch), ms in self.step_timer.poll():
            self.drafter.budget.observe(width, batch, ms)
            self.counters["timed_draft_steps"] += 1

    def _sample_after_masks(self, plan: SamplingPlan) -> InFlightStep:
        """Queue the sampling that waited for masks filled on the mask thread."""
        assert plan.masks is not None
        waited = time.perf_counter()
        masks = plan.masks.result()
        self.counters["grammar_mask_wait_s"] += time.perf_counter() - waited
        return self._launch_sampling(plan, masks)

    def _reschedule(self, batch: ScheduledBatch) -> ScheduledBatch:
        """Drop requests that finished (or will) while the batch was being planned, and fit the
        others to their tokens now known (rejected drafts of the previous step are gone).

        Only reached when a step had to wait for the previous one; their blocks stay allocated
        until retirement, so the batch shrinks but stays valid."""
        keep = ScheduledBatch(preempted=batch.preempted)
        for req, n in zip(batch.requests, batch.num_new_tokens, strict=True):
            n = min(n, req.num_tokens_to_compute - req.num_computed_tokens)
            if not (req.finishing or req.status.finished) and n > 0:
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
        return any(
            req.num_placeholders and (req.grammar is not None or req.params.has_penalties) for req in sampling
        )

    def _launch(
        self, batch: ScheduledBatch, previous: InFlightStep | None
    ) -> tuple[InFlightStep, InFlightStep | None, list[RequestOutput]]:
        """Queue the batch's forward, then its sampling, unless it waits for masks being filled
        on the mask thread (then the next step() queues it). Returns the launched step, the
        previous one if it is still to be completed, and the requests finished on the way.

        When a sampling row needs the previous step's tokens on the host, that step is completed
        in between, while the forward runs.

        With a step timer, a pure decode step (keyed by the width of the graph the runner replays
        for it: its widest request's) whose forward and sampling are queued back to back is timed
        on the device, from before its forward to after its sampling and drafting; a step that
        waits for the host in between (the previous step's tokens, grammar masks) is not, its time
        would include the wait."""
        timer = self.step_timer
        runner = self.runner
        width = runner.decode_width(batch, runner.sends_prompt_lens) if timer is not None else 0
        started = timer.start() if timer is not None and width else None
        step_logits = self._forward(batch, previous)
        finished: list[RequestOutput] = []
        constrained: list[tuple[Request, int]] | None = None  # None: chosen when planning
        masks: Future[GrammarMasks | None] | None = None
        if previous is not None and self._needs_tokens_to_sample(step_logits.sample_requests):
            self.counters["deferred_sampling_steps"] += 1
            accepted = None
            if self.async_scheduling and previous.sampled is not None:
                # The masks need only the tokens and the advanced matchers: start filling them
                # now, and do the rest of the previous step's bookkeeping and this step's planning
                # on this thread meanwhile, off the path from those tokens to this sampling.
                accepted = self.outputs.read_back(previous)
                constrained = constrained_rows(step_logits, accepted[2])
                if constrained:
                    masks = self.grammar_masks.fill_on_mask_thread(constrained)
            finished = self._complete(previous, accepted)
            previous = None
            started = None
            # The host copy now has the previous step's outcome: positions need no correction.
            step_logits.position_shift = None
        plan = plan_sampling(
            step_logits, batch, self.tokenizer.eos_token_ids, self.max_model_len, constrained
        )
        if masks is None and self.async_scheduling and plan.constrained and previous is None:
            # Nothing else touches the matchers until the next step() queues this sampling, so
            # the fill runs beside the engine thread's scheduling of that step.
            masks = self.grammar_masks.fill_on_mask_thread(plan.constrained)
        if masks is not None:
            plan.masks = masks
            return InFlightStep.waiting_for_masks(plan), previous, finished
        launched = self._launch_sampling(plan, self.grammar_masks.fill(plan.constrained))
        if timer is not None and started is not None:
            timer.stop(started, (width, len(batch)))
            self._launched_key = (width, len(batch))
        return launched, previous, finished

    def _forward(self, batch: ScheduledBatch, previous: InFlightStep | None) -> StepLogits:
        """Queue the batch's forward pass (inputs still on the device come from the previous step)."""
        for req, n in zip(batch.requests, batch.num_new_tokens, strict=True):
            if req.num_computed_tokens < req.num_prompt_tokens:
                self.counters["prompt_tokens"] += min(n, req.num_prompt_tokens - req.num_computed_tokens)
        fixup = previous.input_fixup(batch) if previous is not None else None
        step_logits = self.runner.execute(batch, fixup)
        if self.runner.last_step_width > 1:
            self.counters["graphed_verify_steps"] += 1
        self.scheduler.after_step(batch)
        self.counters["steps"] += 1
        return step_logits

    def _launch_sampling(self, plan: SamplingPlan, grammar: GrammarMasks | None) -> InFlightStep:
        """Queue the sampling of a planned step's rows (nothing waits for the device)."""
        sampled = None
        logits = plan.step_logits
        if plan.rows:
            sampled = sample_on_device(logits.sample_logits, plan.rows, grammar, logits.position_shift)
            if any(c > 1 for c in logits.sample_counts):
                count_accepted(logits, plan.batch, sampled)
        if (
            self.drafter is not None
            and self.drafter.use_mtp
            and mtp_drafts(
                self.runner, logits, plan.batch, sampled, plan.newest_positions, self.drafter.mtp_depth
            )
        ):
            self.counters["graphed_mtp_steps"] += 1
        if sampled is not None:
            sampled.stage()
        return InFlightStep.launched(plan, sampled)

    def _complete(self, step: InFlightStep, accepted: Accepted | None = None) -> list[RequestOutput]:
        """Read a launched step's results back (its only host sync) and do the bookkeeping;
        `accepted`: what OutputProcessor.read_back already did for it."""
        finished = self._record_prompt_logprobs(step)
        if step.sampled is None:
            return finished
        result, live, violations = accepted if accepted is not None else self.outputs.read_back(step)
        index = {id(r): i for i, r in enumerate(step.requests)} if self.drafter is not None else {}
        for req, slot, first, count in live:
            if slot == DRAFTS:
                assert self.drafter is not None
                i = index[id(req)]
                confidence = step.draft_confidence[i] if step.draft_confidence else None
                self.drafter.verify(req, result, i, first, count, confidence)
            else:
                # This step's slot is the request's first placeholder (a slot index planned
                # earlier may have moved back with an earlier step's rejected drafts).
                slot = req.num_output_tokens - req.num_placeholders
                self.outputs.accept_sampled(req, slot, result, first, violations.get(id(req)))
                if self.drafter is not None and not req.status.finished:
                    self.drafter.after_plain_step(req, result, index[id(req)])
            if req.status.finished:
                finished.append(self._retire(req))
            else:
                self.block_manager.register_full_blocks(req, req.num_computed_tokens)
        return finished

    def _record_prompt_logprobs(self, step: InFlightStep) -> list[RequestOutput]:
        """Record the step's prompt logprobs; retire the prompt-only requests they complete (nothing
        else ends those: they never sample)."""
        finished: list[RequestOutput] = []
        for request_id, scores in step.prompt_scores.items():
            req = self.requests.get(request_id)
            if req is None:
                continue
            self.outputs.record_prompt_logprobs(req, scores)
            if req.prompt_only and req.prompt_logprobs_done:
                self.outputs.finish_prompt_only(req)
                finished.append(self._retire(req))
        return finished

    def _retire(self, req: Request) -> RequestOutput:
        self.scheduler.finish(req)
        self.requests.pop(req.request_id, None)
        self.counters["finished_requests"] += 1
        self.counters["cached_tokens"] += req.cached_prompt_tokens
        return self.outputs.output(req)

    def stats(self) -> dict[str, float]:
        """Counters since the engine was built, and its build: max_num_seqs (the batch cap in effect,
        given or the engine's default), engine_start_s (the constructor's seconds) and, where it
        compiled kernels ahead (engine/precompile.py), compiled_ahead_variants and compiled_ahead_s.
        With asynchronous scheduling, synchronous_steps counts steps whose forward waited for the
        previous step's tokens (prompt logprobs), and deferred_sampling_steps those that read the
        previous step back between their forward and their sampling (grammar masks, penalties);
        both stay 0 without it. grammar_mask_wait_s is the time the engine thread waited for
        grammar masks filled on the mask thread: the part of the fill that planning the next step
        did not hide.

        With speculative decoding: draft_tokens verified (padded_draft_tokens of them fillers),
        accepted_draft_tokens, draft_acceptance_rate, draft_acceptance_p<j> (the share of
        requests whose first j drafts were all accepted, where j were drafted), and over the steps
        where some request could draft: mean_draft_depth (the depth the budget chose,
        draft_budget.py), mean_draft_tokens_per_step (the draft tokens verified: the budget's total
        over the batch) and speculation_off_share (the share where it chose no drafts at all);
        timed_draft_steps (steps whose device time the budget measured; CUDA only),
        draft_probe_steps (steps that verified one draft each to keep the acceptance estimates
        learning while the schedule had the requests skip proposing), graphed_verify_steps and, with
        MTP drafts, graphed_mtp_steps (steps whose MTP layer ran as a CUDA graph)."""
        out: dict[str, float] = {k: float(v) for k, v in self.counters.items()}
        out["prefix_cache_hit_rate"] = self.block_manager.prefix_hit_rate
        out["preemptions"] = float(self.scheduler.num_preemptions)
        out["max_num_seqs"] = float(self.scheduler.max_num_seqs)  # the cap in effect (ModelRunner.num_seqs)
        out["kv_blocks"] = float(self.block_manager.num_blocks)
        out["engine_start_s"] = float(self.startup_phases.get("total_s", 0.0))
        ahead = self.runner.compiled_ahead
        if ahead is not None:
            out["compiled_ahead_variants"] = float(ahead.variants)
            out["compiled_ahead_s"] = float(self.startup_phases.get("precompile_s", 0.0))
        if self.drafter is not None:
            steps = out.pop("draft_depth_steps")
            out["mean_draft_depth"] = out.pop("draft_depth_sum") / steps if steps else 0.0
            out["mean_draft_tokens_per_step"] = out["draft_tokens"] / steps if steps else 0.0
            out["speculation_off_share"] = out.pop("speculation_off_steps") / steps if steps else 0.0
            drafted = out["draft_tokens"]
            out["draft_acceptance_rate"] = out["accepted_draft_tokens"] / drafted if drafted else 0.0
            for j, rate in enumerate(self.drafter.budget.acceptance_by_position(), start=1):
                if rate is not None:
                    out[f"draft_acceptance_p{j}"] = rate
        else:
            for name in (
                "draft_depth_sum",
                "draft_depth_steps",
                "speculation_off_steps",
                "timed_draft_steps",
                "draft_probe_steps",
            ):
                del out[name]
        return out
