"""Turns a scheduled batch into flat tensors, runs the model, and returns the logits rows the
engine needs: one sampling row per request whose computed tokens reach its end, and, for
requests asking for prompt logprobs, one row per prompt position in this chunk."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from shardinfer.engine.forward_context import AttentionMetadata, ForwardContext
from shardinfer.engine.request import Request
from shardinfer.engine.scheduler import ScheduledBatch


@dataclass
class StepLogits:
    sample_requests: list[Request]
    sample_logits: torch.Tensor  # [S, V] float32
    # request -> (first prompt position p whose logits are given, logits [n, V] predicting p+1...)
    prompt_logits: dict[str, tuple[int, torch.Tensor]]


class ModelRunner:
    def __init__(self, model: Any, kv_caches: list[tuple[torch.Tensor, ...]], block_size: int,
                 device: torch.device, batch_invariant: bool) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.batch_invariant = batch_invariant

    def _prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor, ForwardContext]:
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        qsl = [0]
        seq_lens: list[int] = []
        bs = self.block_size
        for req, n in zip(batch.requests, batch.num_new_tokens, strict=True):
            start = req.num_computed_tokens
            ids.extend(req.all_token_ids[start : start + n])
            for p in range(start, start + n):
                pos.append(p)
                slots.append(req.block_table[p // bs] * bs + p % bs)
            qsl.append(qsl[-1] + n)
            seq_lens.append(start + n)
        max_blocks = max(len(r.block_table) for r in batch.requests)
        table = torch.full((len(batch.requests), max_blocks), -1, dtype=torch.int32)
        for i, req in enumerate(batch.requests):
            table[i, : len(req.block_table)] = torch.tensor(req.block_table, dtype=torch.int32)
        dev = self.device
        meta = AttentionMetadata(
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=table.to(dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_size=bs,
            max_query_len=max(batch.num_new_tokens),
            max_seq_len=max(seq_lens),
            query_start_loc_cpu=qsl,
            seq_lens_cpu=seq_lens,
        )
        ctx = ForwardContext(meta, self.kv_caches, self.batch_invariant)
        return (torch.tensor(ids, dtype=torch.int64, device=dev), torch.tensor(pos, dtype=torch.int64, device=dev),
                ctx)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> StepLogits:
        input_ids, positions, ctx = self._prepare(batch)
        hidden = self.model(input_ids, positions, ctx)
        sample_rows: list[int] = []
        sample_reqs: list[Request] = []
        prompt_rows: list[tuple[Request, int, int, int]] = []  # req, first row, first position, count
        offset = 0
        for req, n in zip(batch.requests, batch.num_new_tokens, strict=True):
            start = req.num_computed_tokens
            if start + n == req.num_tokens:
                sample_rows.append(offset + n - 1)
                sample_reqs.append(req)
            if req.wants_prompt_logprobs and not req.prompt_logprobs_done:
                # Logits at position p score prompt token p + 1; only positions not yet scored.
                first = max(start, len(req.prompt_logprobs) - 1, 0)
                last = min(start + n, req.num_prompt_tokens - 1)
                if last > first:
                    prompt_rows.append((req, offset + first - start, first, last - first))
            offset += n
        rows = sample_rows + [r for (_, r0, _, c) in prompt_rows for r in range(r0, r0 + c)]
        logits = self.model.compute_logits(hidden[torch.tensor(rows, dtype=torch.long, device=hidden.device)])
        sample_logits = logits[: len(sample_rows)]
        prompt_logits: dict[str, tuple[int, torch.Tensor]] = {}
        cursor = len(sample_rows)
        for req, _r0, first, count in prompt_rows:
            prompt_logits[req.request_id] = (first, logits[cursor : cursor + count])
            cursor += count
        return StepLogits(sample_reqs, sample_logits, prompt_logits)
