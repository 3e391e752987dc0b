"""Owns the model on its device: loads it, sizes and allocates the KV cache, warms the kernels up
and captures the decode CUDA graphs; then, each step, turns a scheduled batch into flat tensors,
runs the model, and returns the logits rows the engine needs: one sampling row per request whose
computed tokens reach its end, and, for requests asking for prompt logprobs, one row per prompt
position in this chunk.

Pure-decode steps on CUDA replay a captured CUDA graph (engine/cuda_graphs.py); everything
else runs eagerly.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shardinfer.engine.config import EngineConfig, default_num_seqs
from shardinfer.engine.cuda_graphs import BUCKETS
from shardinfer.engine.device_copy import array_to_device, values_to_device
from shardinfer.engine.forward_context import PAD_BLOCK, AttentionMetadata, ForwardContext
from shardinfer.engine.heap import collect_dropped
from shardinfer.engine.input_fixup import InputFixup
from shardinfer.engine.kv_cache import allocate_kv_caches, plan_num_blocks
from shardinfer.engine.models.base import KVLayerSpec, Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.fp8 import check_fp8_device, resolve_quantization
from shardinfer.engine.models.registry import load_model
from shardinfer.engine.precompile import precompile, precompile_enabled
from shardinfer.engine.prompt_scores import PromptScores, score_rows, split_scores
from shardinfer.engine.request import Request
from shardinfer.engine.scheduler import ScheduledBatch
from shardinfer.engine.startup_phases import StartupPhases
from shardinfer.engine.step_peak import measure_step_peak
from shardinfer.kernels import ops
from shardinfer.kernels.compile_ahead import CompileAhead

logger = logging.getLogger(__name__)


@dataclass
class StepLogits:
    sample_requests: list[Request]
    sample_logits: torch.Tensor  # [S, V] float32: each request's rows, draft positions included
    sample_counts: list[int]  # rows per request: 1 + its draft tokens
    # request id -> its prompt positions scored this step (engine/prompt_scores.py)
    prompt_scores: dict[str, PromptScores]
    input_ids: torch.Tensor | None = None  # the step's flat input tokens on the device (drafts included)
    # Per sampling row: how far its position is behind the host's layout (input_fixup.py), or None.
    position_shift: torch.Tensor | None = None


@dataclass
class HostBatch:
    """A step's flat inputs as host arrays (numpy), before they move to the device."""

    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64
    query_start_loc: np.ndarray  # [B + 1] int32
    seq_lens: np.ndarray  # [B] int32
    block_tables: np.ndarray  # [B, max_blocks] int32, PAD_BLOCK padded
    prompt_lens: np.ndarray | None = None  # [B] int32; None: every row counts as a prompt row
    generated_only: bool = False  # with prompt_lens: every row is at or after its prompt's end


def build_host_batch(batch: ScheduledBatch, block_size: int, prompt_lens: bool = False) -> HostBatch:
    """Flat inputs for the batch. Per request only list slicing happens in Python; every per-token
    quantity is computed by numpy over the whole batch (this runs on the host once per step, and
    with asynchronous scheduling its time is what the device step has to cover). prompt_lens:
    also each request's prompt length (a pass over the requests; only where attention uses it)."""
    reqs = batch.requests
    b = len(reqs)
    counts = np.fromiter(batch.num_new_tokens, dtype=np.int64, count=b)
    starts = np.fromiter((r.num_computed_tokens for r in reqs), dtype=np.int64, count=b)
    qsl = np.zeros(b + 1, dtype=np.int32)
    np.cumsum(counts, out=qsl[1:])
    n_total = int(qsl[-1])
    seq_lens = (starts + counts).astype(np.int32)
    # Block tables: one flat read of every table, scattered into a PAD_BLOCK padded [B, max_blocks] array.
    table_lens = np.fromiter((len(r.block_table) for r in reqs), dtype=np.int64, count=b)
    max_blocks = int(table_lens.max()) if b else 0
    tables = np.full((b, max_blocks), PAD_BLOCK, dtype=np.int32)
    flat_blocks = np.fromiter(
        itertools.chain.from_iterable(r.block_table for r in reqs),
        dtype=np.int64,
        count=int(table_lens.sum()),
    )
    table_rows = np.repeat(np.arange(b), table_lens)
    table_cols = np.arange(flat_blocks.size) - np.repeat(np.cumsum(table_lens) - table_lens, table_lens)
    tables[table_rows, table_cols] = flat_blocks
    # Per token: its request row and position; slot = physical block * block_size + offset.
    token_rows = np.repeat(np.arange(b), counts)
    pos = np.arange(n_total, dtype=np.int64) - np.repeat(qsl[:-1].astype(np.int64) - starts, counts)
    slots = tables[token_rows, pos // block_size].astype(np.int64) * block_size + pos % block_size
    ids = np.fromiter(
        itertools.chain.from_iterable(
            r.token_slice(s, s + n)
            for r, s, n in zip(reqs, starts.tolist(), batch.num_new_tokens, strict=True)
        ),
        dtype=np.int64,
        count=n_total,
    )
    if not prompt_lens:
        return HostBatch(ids, pos, slots, qsl, seq_lens, tables)
    lens = np.fromiter((r.num_prompt_tokens for r in reqs), dtype=np.int32, count=b)
    return HostBatch(ids, pos, slots, qsl, seq_lens, tables, lens, bool((starts >= lens).all()))


def _fma_may_apply(model_config: ModelConfig) -> bool:
    """Whether generated rows of this model's attention may take the FMA kernel (kernels/
    paged_attention_fma.py): its switch is on and its shape fits. Imported here, on CUDA only."""
    from shardinfer.kernels import paged_attention, paged_attention_fma

    return paged_attention.FMA_GENERATED_ROWS and paged_attention_fma.may_apply(
        model_config.head_dim, model_config.num_attention_heads, model_config.num_key_value_heads
    )


class ModelRunner:
    def __init__(
        self,
        config: EngineConfig,
        model_dir: Path,
        model_config: ModelConfig,
        max_model_len: int,
        phases: StartupPhases | None = None,
    ) -> None:
        """Load the model and build everything it runs with. `max_model_len` is the longest sequence
        asked for; `self.max_model_len` may be shorter, when the KV cache cannot hold that many tokens.
        Each set-up phase is timed into `phases` (engine/startup_phases.py)."""
        cfg = config
        self.device = cfg.torch_device
        self.dtype = cfg.torch_dtype
        self.block_size = cfg.block_size
        self.batch_invariant = cfg.batch_invariant
        phases = phases if phases is not None else StartupPhases()
        if self.device.type == "cuda":
            # An engine dropped in a reference cycle gives its memory back before this one
            # loads weights and sizes its KV cache from the free memory (heap.py).
            collect_dropped()
            torch.cuda.empty_cache()
        self.vocab_size = model_config.vocab_size
        self.numerics = Numerics(
            self.dtype, cfg.batch_invariant, resolve_quantization(cfg.quantization, model_config.hf)
        )
        check_fp8_device(self.device, cfg.quantization, self.numerics.quantization, cfg.kv_cache_dtype)
        compile_ahead = (
            self.device.type == "cuda" and precompile_enabled()
        )  # a bad setting fails before the load
        with phases.phase("model_load_s"):
            # An expert-parallel rank loads and keeps its own expert slots (engine/parallel/sharding.py).
            if cfg.parallel_size > 1:
                from shardinfer.engine.parallel.group import current_group
                from shardinfer.engine.parallel.sharding import attach_experts, rank_expert_slots

                group = current_group(cfg.parallel_size)
                self.model = load_model(
                    model_dir,
                    model_config,
                    self.numerics,
                    max_model_len,
                    self.device,
                    rank_expert_slots(group, model_config.num_hidden_layers),
                )
                self.parallel_experts = attach_experts(self.model, group)
            else:
                self.model = load_model(model_dir, model_config, self.numerics, max_model_len, self.device)
        specs = self.model.kv_cache_specs()
        use_mtp = cfg.speculative_mode == "mtp"
        if use_mtp:
            if not getattr(self.model, "num_mtp_layers", 0):
                raise ValueError(
                    f"speculative='mtp' but {model_config.architecture} at {cfg.model!r} has no "
                    "MTP layer (num_nextn_predict_layers): use speculative='ngram' instead"
                )
            specs = specs + self.model.mtp_kv_cache_specs()  # MTP caches follow the main layers'
        self.kv_specs: list[KVLayerSpec] = specs
        self.kv_fp8 = cfg.kv_cache_dtype == "fp8"
        # Each step carries its requests' prompt lengths only where attention may use them (the
        # FMA kernel for generated rows, on an FP8 cache on CUDA): building them costs host time.
        self.sends_prompt_lens = self.device.type == "cuda" and self.kv_fp8 and _fma_may_apply(model_config)
        self.max_model_len = max_model_len
        # Speculative steps verify 1 + k rows per request, k up to the draft depth (fewer near a
        # request's max_tokens, or where a draft budget chooses fewer): one graph per width.
        self.graph_widths = list(range(1, 2 + cfg.draft_depth))
        step_peak = 0
        if self.device.type == "cuda" and cfg.num_kv_blocks is None and cfg.kv_cache_memory_bytes is None:
            with phases.phase("step_peak_s"):
                step_peak = measure_step_peak(
                    self, cfg.token_budget, cfg.num_seqs * self.graph_widths[-1], compile_ahead
                )
        self.step_peak_bytes = step_peak
        with phases.phase("kv_sizing_s"):
            self.num_blocks = plan_num_blocks(cfg, specs, self.device, self.dtype, max_model_len, step_peak)
            # No request may need more blocks than exist, or preemption could never make room for it.
            self.max_model_len = min(max_model_len, self.kv_cache_tokens)
            self.kv_caches = allocate_kv_caches(
                specs, self.num_blocks, cfg.block_size, self.dtype, self.device, self.kv_fp8
            )
        # The batch cap in effect: as given, or the device's default for this cache (config.py).
        self.num_seqs: int = cfg.max_num_seqs or default_num_seqs(
            self.device.type, self.kv_cache_tokens, self.max_model_len
        )
        if cfg.max_num_seqs is None:
            logger.info(
                "max_num_seqs unset: %d sequences a step for a KV cache of %d tokens",
                self.num_seqs,
                self.kv_cache_tokens,
            )
        # The last step's inputs and hidden states, for a draft model that continues from them;
        # kept only when asked (keep_last_forward), else they would pin the device memory of the
        # last step's hidden states. The MTP layer also gets its own graphs (cuda_graphs.py).
        self.keep_last_forward = use_mtp
        self.graphs: Any = None  # a DecodeGraphs, or None
        if self.device.type == "cuda" and not cfg.enforce_eager:
            with phases.phase("graph_capture_s"):  # the graphs' static buffers
                self.graphs = self._decode_graphs(self.num_seqs)
            if self.num_seqs > BUCKETS[-1]:
                logger.warning(
                    "max_num_seqs=%d: decode CUDA graphs are captured up to %d rows, so steps with "
                    "more run eagerly, several times slower; set max_num_seqs to at most %d",
                    self.num_seqs,
                    BUCKETS[-1],
                    BUCKETS[-1],
                )
        self.compiled_ahead: CompileAhead | None = None
        if compile_ahead:
            with phases.phase("precompile_s"):
                self.compiled_ahead = precompile(self, self.graphs, cfg.token_budget)
        # The warm-up only compiles; compiling ahead ran it already (without launching anything).
        if self.device.type == "cuda" and cfg.batch_invariant and self.compiled_ahead is None:
            with phases.phase("warm_up_s"):
                self.warm_up()
        if self.graphs is not None:
            with phases.phase("graph_capture_s"):
                self.graphs.capture()
        self.last_step_graphed = False
        self.last_step_width = 0  # tokens per request of the last graphed step (0: eager)
        self.last_forward: tuple[torch.Tensor, torch.Tensor, ForwardContext, torch.Tensor] | None = None

    @property
    def kv_cache_tokens(self) -> int:
        """The tokens the KV cache holds (every block full)."""
        return self.num_blocks * self.block_size

    def warm_up(self) -> None:
        """Compile the large-batch matmul tilings now, not in the first long prefill step."""
        from shardinfer.engine.models.layers import Linear

        linears = [m for m in self.model.modules() if isinstance(m, Linear)]
        heads = tuple(m.weight for m in linears if m.writes_logits)
        ops.warm_up_matmuls([m.weight for m in linears], heads)

    def _decode_graphs(self, max_num_seqs: int) -> Any:
        """The decode graphs' static buffers; captured later (DecodeGraphs.capture)."""
        from shardinfer.engine.cuda_graphs import DecodeGraphs

        return DecodeGraphs(
            self.model,
            self.kv_caches,
            self.block_size,
            self.max_model_len,
            max_num_seqs,
            self.device,
            self.batch_invariant,
            self.graph_widths,
            draft_layer=self.keep_last_forward,
            prompt_lens=self.sends_prompt_lens,
        )

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        return array_to_device(a, self.device)

    def _prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor, ForwardContext]:
        return self.device_inputs(build_host_batch(batch, self.block_size, self.sends_prompt_lens))

    def device_inputs(self, host: HostBatch) -> tuple[torch.Tensor, torch.Tensor, ForwardContext]:
        """(input ids, positions, forward context) of a host batch, on the model's device."""
        meta = AttentionMetadata(
            query_start_loc=self._to_device(host.query_start_loc),
            seq_lens=self._to_device(host.seq_lens),
            block_tables=self._to_device(host.block_tables),
            slot_mapping=self._to_device(host.slot_mapping),
            block_size=self.block_size,
            max_query_len=int(np.diff(host.query_start_loc).max(initial=0)),
            max_seq_len=int(host.seq_lens.max()),
            query_start_loc_cpu=host.query_start_loc.tolist(),
            seq_lens_cpu=host.seq_lens.tolist(),
            prompt_lens=None if host.prompt_lens is None else self._to_device(host.prompt_lens),
            generated_only=host.generated_only,
        )
        ctx = ForwardContext(meta, self.kv_caches, self.batch_invariant)
        return self._to_device(host.input_ids), self._to_device(host.positions), ctx

    @staticmethod
    def decode_width(batch: ScheduledBatch, generated_only: bool = False) -> int:
        """The CUDA graph width that runs the batch, or 0 (eager): every request decodes (its newest
        token and its drafts) and none scores prompt positions. The width is the widest request's;
        narrower ones are padded (cuda_graphs.pad_to_width). generated_only: a graph holds only
        generated tokens' rows (ModelRunner.sends_prompt_lens: their attention kernel then runs
        alone), so a step computing a prompt's last token (after a prefix-cache hit or a chunked
        prompt) runs eager."""
        if not batch.requests:
            return 0
        w = max(batch.num_new_tokens)
        for r, n in zip(batch.requests, batch.num_new_tokens, strict=True):
            if (
                r.num_computed_tokens + n != r.num_tokens
                or r.num_draft_tokens != n - 1
                or (r.wants_prompt_logprobs and not r.prompt_logprobs_done)
                or (generated_only and r.num_computed_tokens < r.num_prompt_tokens)
            ):
                return 0
        return w

    @torch.inference_mode()
    def idle_forward(self) -> None:
        """An expert-parallel rank with nothing to run this step: its MoE layers' exchanges with no
        rows of its own, so the rows other ranks route to its experts are computed."""
        from shardinfer.engine.parallel.sharding import idle_forward, moe_shape

        top_k, hidden = moe_shape(self.model)
        idle_forward(self.parallel_experts, top_k, hidden, self.dtype, self.device)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch, fixup: InputFixup | None = None) -> StepLogits:
        width = self.decode_width(batch, self.sends_prompt_lens) if self.graphs is not None else 0
        if width and self.graphs.fits(len(batch), width):
            host = build_host_batch(batch, self.block_size, self.sends_prompt_lens)
            logits, input_ids, shift = self.graphs.run(host, fixup, width)
            self.last_step_graphed = True
            self.last_step_width = width
            if self.keep_last_forward:
                self.last_forward = self.graphs.forward_state(len(batch), width)
            step = StepLogits(list(batch.requests), logits, list(batch.num_new_tokens), {}, input_ids)
            step.position_shift = shift
            return step
        self.last_step_graphed = False
        self.last_step_width = 0
        input_ids, positions, ctx = self._prepare(batch)
        shift = None
        if fixup is not None:
            a = ctx.attn
            shift = fixup.apply(
                input_ids, positions, a.seq_lens, a.slot_mapping, a.block_tables, self.block_size
            )
            if fixup.shifted and not input_ids.is_cuda:  # the reference kernels read host copies
                a.seq_lens_cpu = a.seq_lens.tolist()
        hidden = self.model(input_ids, positions, ctx)
        if self.keep_last_forward:
            self.last_forward = (input_ids, positions, ctx, hidden)
        sample_rows: list[int] = []
        sample_reqs: list[Request] = []
        counts: list[int] = []
        prompt_rows: list[tuple[Request, int, int, int]] = []  # req, first row, first position, count
        offset = 0
        for req, n in zip(batch.requests, batch.num_new_tokens, strict=True):
            start = req.num_computed_tokens
            if start + n == req.num_tokens:
                # One row per drafted position too: row j samples the token after position start+n-1-k+j.
                k = req.num_draft_tokens
                sample_rows.extend(range(offset + n - 1 - k, offset + n))
                sample_reqs.append(req)
                counts.append(k + 1)
            if req.wants_prompt_logprobs and not req.prompt_logprobs_done:
                # Logits at position p score prompt token p + 1; only positions not yet scored.
                first = max(start, len(req.prompt_logprobs) - 1, 0)
                last = min(start + n, req.num_prompt_tokens - 1)
                if last > first:
                    prompt_rows.append((req, offset + first - start, first, last - first))
            offset += n
        sample_logits = self.model.compute_logits(
            hidden[values_to_device(sample_rows, torch.long, hidden.device)]
        )
        prompt_scores: dict[str, PromptScores] = {}
        if prompt_rows:
            rows = [r for (_, r0, _, c) in prompt_rows for r in range(r0, r0 + c)]
            targets = [
                t
                for (req, _, first, c) in prompt_rows
                for t in req.prompt_token_ids[first + 1 : first + 1 + c]
            ]
            top_k = max(req.params.prompt_logprobs or 0 for (req, _, _, _) in prompt_rows)
            scored = score_rows(self.model.compute_logits, hidden, rows, targets, top_k, self.vocab_size)
            firsts = [first for (_, _, first, _) in prompt_rows]
            score_counts = [c for (_, _, _, c) in prompt_rows]
            for (req, _, _, _), scores in zip(
                prompt_rows, split_scores(firsts, score_counts, *scored), strict=True
            ):
                prompt_scores[req.request_id] = scores
        step = StepLogits(sample_reqs, sample_logits, counts, prompt_scores, input_ids)
        step.position_shift = shift
        return step
