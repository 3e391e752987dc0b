"""CUDA graphs for pure-decode steps.

A decode step of B requests (one new token each) is captured once per bucket size B and then
replayed: static input buffers are refilled in place, the graph runs the whole model plus the
LM head, and the logits of the real rows are read back. Rows beyond the real batch (padding up
to the bucket) get slot SKIP_SLOT (their KV store is skipped), a one-token sequence and block 0, and
their logits are ignored. Attention sizes its chunk grid from max_model_len so one graph serves
any context length.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from shardinfer.engine.forward_context import SKIP_SLOT, AttentionMetadata, ForwardContext

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)


class DecodeGraphs:
    def __init__(self, model: Any, kv_caches: list[tuple[torch.Tensor, ...]], block_size: int,
                 max_model_len: int, max_batch: int, device: torch.device, batch_invariant: bool) -> None:
        self.model = model
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.sizes = [b for b in BUCKETS if b <= max_batch] or [1]
        if self.sizes[-1] < max_batch <= BUCKETS[-1]:
            self.sizes.append(max_batch)
        b_max = self.sizes[-1]
        self.max_blocks = -(-max_model_len // block_size)
        self.input_ids = torch.zeros(b_max, dtype=torch.int64, device=device)
        self.positions = torch.zeros(b_max, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((b_max,), SKIP_SLOT, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(b_max, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(b_max, self.max_blocks, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(b_max + 1, dtype=torch.int32, device=device)
        self.kv_caches = kv_caches
        self.batch_invariant = batch_invariant
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        # Host staging in pinned memory, two sets used in turn: with asynchronous scheduling the
        # copy out of one set may still be queued behind the running step while the next step
        # fills the other. (A set is reused only after the step that read it has completed.)
        self._staging = [self._new_staging(b_max) for _ in range(2)]
        self._turn = 0

    def _new_staging(self, b_max: int) -> dict[str, torch.Tensor]:
        return {"ids": torch.zeros(b_max, dtype=torch.int64).pin_memory(),
                "pos": torch.zeros(b_max, dtype=torch.int64).pin_memory(),
                "slots": torch.zeros(b_max, dtype=torch.int64).pin_memory(),
                "lens": torch.zeros(b_max, dtype=torch.int32).pin_memory(),
                "tables": torch.zeros(b_max, self.max_blocks, dtype=torch.int32).pin_memory()}

    def fits(self, batch_size: int) -> bool:
        return batch_size <= self.sizes[-1]

    def _forward(self, b: int) -> torch.Tensor:
        meta = AttentionMetadata(
            query_start_loc=self.query_start_loc[: b + 1], seq_lens=self.seq_lens[:b],
            block_tables=self.block_tables[:b], slot_mapping=self.slot_mapping[:b], block_size=self.block_size,
            max_query_len=1, max_seq_len=self.max_model_len, query_start_loc_cpu=[], seq_lens_cpu=[])
        ctx = ForwardContext(meta, self.kv_caches, self.batch_invariant)
        hidden = self.model(self.input_ids[:b], self.positions[:b], ctx)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for b in reversed(self.sizes):
                for _ in range(2):  # warm up: Triton compiles and autotunes outside the capture
                    self._forward(b)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.outputs[b] = self._forward(b)
                pool = graph.pool()
                self.graphs[b] = graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def run(self, host: Any, fixup: Any = None) -> torch.Tensor:
        n = len(host.seq_lens)
        b = next(s for s in self.sizes if s >= n)
        width = host.block_tables.shape[1]
        st = self._staging[self._turn]
        self._turn ^= 1
        st["ids"][:n] = torch.from_numpy(host.input_ids)
        st["pos"][:n] = torch.from_numpy(host.positions)
        st["slots"][:n] = torch.from_numpy(host.slot_mapping)
        st["lens"][:n] = torch.from_numpy(host.seq_lens)
        st["tables"][:n, :width] = torch.from_numpy(np.maximum(host.block_tables, 0))
        # Padding rows: skip the KV store, attend to one (ignored) key in block 0.
        st["slots"][n:b] = SKIP_SLOT
        st["lens"][n:b] = 1
        st["ids"][n:b] = 0
        st["pos"][n:b] = 0
        self.input_ids[:b].copy_(st["ids"][:b], non_blocking=True)
        self.positions[:b].copy_(st["pos"][:b], non_blocking=True)
        self.slot_mapping[:b].copy_(st["slots"][:b], non_blocking=True)
        self.seq_lens[:b].copy_(st["lens"][:b], non_blocking=True)
        self.block_tables[:b, :width].copy_(st["tables"][:b, :width], non_blocking=True)
        if fixup is not None:
            fixup.apply(self.input_ids)
        self.graphs[b].replay()
        return self.outputs[b][:n]
