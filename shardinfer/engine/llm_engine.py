"""The streaming engine: requests in with add_request(), one scheduled model step per step(),
finished outputs out. The pipeline drives it directly; `LLM` wraps it for whole batches.

    add_request -> Scheduler.waiting -> schedule() -> ModelRunner.execute() -> sample()
                -> append token, check stops -> finished? -> RequestOutput
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import torch

from shardinfer.engine.block_manager import BlockManager
from shardinfer.engine.config import EngineConfig
from shardinfer.engine.kv_cache import allocate_kv_caches, bytes_per_block, kv_budget_bytes
from shardinfer.engine.model_runner import ModelRunner
from shardinfer.engine.models.base import Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.registry import load_model
from shardinfer.engine.outputs import CompletionOutput, RequestOutput
from shardinfer.engine.request import Request, RequestStatus
from shardinfer.engine.sampler import GrammarMasks, SamplingRow, sample, top_k_logprobs
from shardinfer.engine.sampling_params import SamplingParams
from shardinfer.engine.scheduler import Scheduler
from shardinfer.engine.stop_checker import check_stop
from shardinfer.engine.tokenizer import Tokenizer


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
        self.dtype = cfg.torch_dtype
        self.tokenizer = Tokenizer(self.model_dir, self.model_config.eos_token_ids)
        self.generation_defaults = _generation_defaults(self.model_dir)
        limit = cfg.max_model_len or self.model_config.max_position_embeddings
        if limit > self.model_config.max_position_embeddings:
            raise ValueError(f"max_model_len={limit} exceeds the model's max_position_embeddings="
                             f"{self.model_config.max_position_embeddings}")
        self.numerics = Numerics(self.dtype, cfg.batch_invariant)
        self.model = load_model(self.model_dir, self.model_config, self.numerics, limit, self.device)
        specs = self.model.kv_cache_specs()
        per_block = bytes_per_block(specs, cfg.block_size, self.dtype)
        if cfg.num_kv_blocks is not None:
            num_blocks = cfg.num_kv_blocks
        else:
            num_blocks = kv_budget_bytes(self.device, cfg.kv_cache_memory_bytes, cfg.gpu_memory_utilization) // per_block
        if num_blocks < 2:
            raise ValueError(f"the KV cache budget holds {num_blocks} block(s) of {per_block} bytes: "
                             "raise kv_cache_memory_bytes / gpu_memory_utilization")
        # No request may need more blocks than exist, or preemption could never make room for it.
        self.max_model_len = min(limit, num_blocks * cfg.block_size)
        self.kv_caches = allocate_kv_caches(specs, num_blocks, cfg.block_size, self.dtype, self.device)
        self.block_manager = BlockManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching)
        admission = cfg.admission_batch
        if admission is None:
            admission = max(1, cfg.max_num_seqs // 8) if self.device.type == "cuda" else 1
        self.scheduler = Scheduler(self.block_manager, cfg.max_num_seqs, cfg.max_num_batched_tokens, admission)
        graphs = None
        if self.device.type == "cuda" and not cfg.enforce_eager:
            from shardinfer.engine.cuda_graphs import DecodeGraphs

            graphs = DecodeGraphs(self.model, self.kv_caches, cfg.block_size, self.max_model_len, cfg.max_num_seqs,
                                  self.device, cfg.batch_invariant)
            graphs.capture()
        self.runner = ModelRunner(self.model, self.kv_caches, cfg.block_size, self.device, cfg.batch_invariant,
                                  graphs)
        self.requests: dict[str, Request] = {}
        self._arrivals = 0
        self.counters = {"prompt_tokens": 0, "generated_tokens": 0, "cached_tokens": 0, "steps": 0,
                         "finished_requests": 0}
        self._grammar_compiler: Any = None

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

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None) -> None:
        """Queue one request (params.n must be 1). Raises ValueError for an unusable prompt or params,
        leaving every other request untouched."""
        params = params if params is not None else self.default_params()
        if params.n != 1:
            raise ValueError(f"LLMEngine.add_request takes n=1 (got n={params.n}); LLM.generate expands n")
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in flight")
        ids = self.tokenize_prompt(prompt)
        if not ids:
            raise ValueError("prompt is empty after tokenization: give at least one token")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens; max_model_len={self.max_model_len} leaves no room "
                             "to generate: shorten the prompt or raise max_model_len")
        room = self.max_model_len - len(ids)
        max_tokens = min(params.max_tokens, room) if params.max_tokens is not None else room
        seed = params.seed if params.seed is not None else (self.config.seed or secrets.randbits(63))
        req = Request(request_id, ids, params, int(seed), max_tokens,
                      prompt=prompt if isinstance(prompt, str) else None, arrival_index=self._arrivals)
        if params.so_args is not None:
            req.grammar = self.grammar_compiler().matcher(params.so_args)
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = [None]
            req.prompt_top_logprobs = [None]
        self._arrivals += 1
        self.requests[request_id] = req
        self.scheduler.add(req)

    def grammar_compiler(self) -> Any:
        if self._grammar_compiler is None:
            from shardinfer.engine.structured import StructuredOutputCompiler

            self._grammar_compiler = StructuredOutputCompiler(
                str(self.tokenizer.path), list(self.tokenizer.eos_token_ids), self.model_config.vocab_size)
        return self._grammar_compiler

    def default_params(self) -> SamplingParams:
        return SamplingParams(**self.generation_defaults)

    def abort(self, request_id: str) -> RequestOutput | None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        self.scheduler.finish(req)
        req.finish(RequestStatus.FINISHED_ABORTED)
        req.output_text = self.tokenizer.decode(req.output_token_ids, req.params.skip_special_tokens)
        return self._output(req)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_unfinished(self) -> int:
        return self.scheduler.num_unfinished

    # -- one step -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch.requests:
            if self.scheduler.has_unfinished():
                raise RuntimeError("no request could be scheduled although some are waiting: the KV cache is "
                                   "too small for one request; raise the KV budget or lower max_model_len")
            return []
        for req, n in zip(batch.requests, batch.num_new_tokens, strict=True):
            if req.num_computed_tokens < req.num_prompt_tokens:
                self.counters["prompt_tokens"] += min(n, req.num_prompt_tokens - req.num_computed_tokens)
        step_logits = self.runner.execute(batch)
        self.scheduler.after_step(batch)
        self.counters["steps"] += 1
        for request_id, (first, logits) in step_logits.prompt_logits.items():
            self._record_prompt_logprobs(self.requests[request_id], first, logits)
        finished: list[RequestOutput] = []
        if step_logits.sample_requests:
            rows = [self._sampling_row(r) for r in step_logits.sample_requests]
            result = sample(step_logits.sample_logits, rows, self._grammar_masks(step_logits.sample_requests))
            for i, req in enumerate(step_logits.sample_requests):
                self._append_token(req, result.token_ids[i], result.logprobs[i], result.top_logprobs[i])
                if req.status.finished:
                    finished.append(self._retire(req))
        return finished

    def _sampling_row(self, req: Request) -> SamplingRow:
        p = req.params
        blocked: list[int] = []
        if req.num_output_tokens < p.min_tokens:
            blocked = list(p.stop_token_ids) + ([] if p.ignore_eos else list(self.tokenizer.eos_token_ids))
        return SamplingRow(p, req.seed, req.num_tokens, req.prompt_token_ids, req.output_token_ids, blocked,
                           req.grammar is not None)

    def _grammar_masks(self, reqs: list[Request]) -> GrammarMasks | None:
        """Every constrained request's next-token mask, filled in one call on the compiler's threads."""
        rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if not rows:
            return None
        from shardinfer.engine.structured import allocate_bitmask

        compiler = self.grammar_compiler()
        bitmask = allocate_bitmask(len(rows), self.model_config.vocab_size, pin_memory=self.device.type == "cuda")
        compiler.fill_bitmasks([(reqs[i].grammar, j) for j, i in enumerate(rows)], bitmask)
        return GrammarMasks(bitmask, rows)

    def _record_prompt_logprobs(self, req: Request, first: int, logits: torch.Tensor) -> None:
        lps = torch.log_softmax(logits.float(), dim=-1)
        targets = torch.tensor(req.prompt_token_ids[first + 1 : first + 1 + lps.shape[0]], dtype=torch.long,
                               device=lps.device)
        values = lps.gather(1, targets.view(-1, 1)).view(-1).tolist()
        k = req.params.prompt_logprobs or 0
        for i, v in enumerate(values):
            req.prompt_logprobs.append(v)
            req.prompt_top_logprobs.append(top_k_logprobs(lps[i], k) if k else None)

    def _append_token(self, req: Request, token: int, logprob: float,
                      top: list[tuple[int, float]] | None) -> None:
        req.output_token_ids.append(token)
        req.output_logprobs.append(logprob)
        if top is not None:
            req.output_top_logprobs.append(top)
        self.counters["generated_tokens"] += 1
        if req.grammar is not None:
            try:
                req.grammar.accept(token)
            except RuntimeError as exc:  # the mask should make this impossible; fail the request, not the step
                req.error = f"structured output: {exc}"
                req.output_text = self.tokenizer.decode(req.output_token_ids[:-1], req.params.skip_special_tokens)
                req.finish(RequestStatus.FINISHED_ERROR)
                return
        status, reason, text = check_stop(req, self.tokenizer, self.max_model_len)
        req.output_text = text
        if status is not None:
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
        out: dict[str, float] = {k: float(v) for k, v in self.counters.items()}
        out["prefix_cache_hit_rate"] = self.block_manager.prefix_hit_rate
        out["preemptions"] = float(self.scheduler.num_preemptions)
        out["kv_blocks"] = float(self.block_manager.num_blocks)
        return out


def _generation_defaults(model_dir: Path) -> dict[str, Any]:
    """Sampling defaults from generation_config.json (used when a caller passes no SamplingParams)."""
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    keep = {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"}
    out = {k: raw[k] for k in keep if raw.get(k) is not None}
    if raw.get("do_sample") is False:
        out["temperature"] = 0.0
    return out
