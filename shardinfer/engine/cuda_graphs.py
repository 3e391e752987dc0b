"""CUDA graphs for decode steps.

A decode step of B requests with W new tokens each (W = 1: plain decoding; W = 1 + k: the
newest token and k speculative drafts to verify) is captured once per width W and bucket size B
and then replayed: static input buffers are refilled in place, the graph runs the whole model plus
the LM head, and the logits of the real rows are read back. Requests beyond the real batch
(padding up to the bucket) get slot SKIP_SLOT (their KV store is skipped), a W-token sequence
and block 0, and their logits are ignored. Attention sizes its chunk grid from max_model_len so
one graph serves any context length, and its result for a row does not depend on W (the kernels
are batch invariant), so a verify row gives the bits of a plain decode row.

Requests of one step may need fewer than W rows: one that may not draft (penalties, a grammar,
min_tokens not reached) or has fewer tokens left than the others' drafts. Such a step still
replays the graph of width W = the widest request: each request's n real tokens fill the back of
its W-row slot and the W - n rows in front of them are padding (KV store skipped, logits dropped).
Attention places a request's rows at the last W positions of its sequence, so the real rows keep
their own positions and the padding rows sit before them, attending only to keys already in the
cache. (Padding behind the real rows would make the attention tile read key slots past the
sequence, which hold whatever an earlier request left there: an invisible key's weight is zero,
but zero times a stale NaN is not.)

With an MTP drafter (`draft_layer`), each (W, B) also has a second graph: the checkpoint's MTP layer
over the step's rows, reading the main graph's hidden states, positions and attention metadata
where they lie, and token ids from its own static buffer. It runs after the step's sampling has
been queued (its input is the sampled token after each row), so it cannot join the main graph;
as a graph it costs one launch instead of the layer's dozens (draft_device.mtp_drafts).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from shardinfer.engine.forward_context import SKIP_SLOT, AttentionMetadata, ForwardContext

# Batch sizes a decode graph is captured for (up to max_num_seqs): every size up to 512, then four
# more up to 1024 for the batches of a large KV cache (config.default_num_seqs).
_SMALL_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
BUCKETS = (*_SMALL_BUCKETS, 640, 768, 896, 1024)


def pad_to_width(host: Any, w: int) -> tuple[Any, np.ndarray]:
    """The host batch laid out w rows per request (module docstring): real tokens at the back of
    each request's slot, padding rows in front of them (token 0 at the request's first new
    position, KV store skipped). Returns it and the real tokens' new rows."""
    counts = np.diff(host.query_start_loc)
    n, real = len(counts), len(host.input_ids)
    rows = np.repeat(np.arange(1, n + 1, dtype=np.int64) * w - host.query_start_loc[1:], counts) + np.arange(
        real
    )
    ids = np.zeros(n * w, dtype=host.input_ids.dtype)
    pos = np.repeat(host.positions[host.query_start_loc[:-1]], w)  # any valid position: rope only
    slots = np.full(n * w, SKIP_SLOT, dtype=host.slot_mapping.dtype)
    ids[rows], pos[rows], slots[rows] = host.input_ids, host.positions, host.slot_mapping
    qsl = np.arange(0, (n + 1) * w, w, dtype=host.query_start_loc.dtype)
    return replace(host, input_ids=ids, positions=pos, slot_mapping=slots, query_start_loc=qsl), rows


class DecodeGraphs:
    def __init__(
        self,
        model: Any,
        kv_caches: list[tuple[torch.Tensor, ...]],
        block_size: int,
        max_model_len: int,
        max_batch: int,
        device: torch.device,
        batch_invariant: bool,
        widths: list[int] | None = None,
        draft_layer: bool = False,
        prompt_lens: bool = False,
    ) -> None:
        """prompt_lens: steps carry their requests' prompt lengths (ModelRunner.sends_prompt_lens);
        only then does a static buffer hold them, and then every replayed row is a generated
        token's (ModelRunner.decode_width), so attention launches the generated rows' kernel alone."""
        self.model = model
        self.draft_layer = draft_layer
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.sizes = [b for b in BUCKETS if b <= max_batch] or [1]
        if self.sizes[-1] < max_batch <= BUCKETS[-1]:
            self.sizes.append(max_batch)
        b_max = self.sizes[-1]
        self.widths = widths or [1]
        t_max = b_max * max(self.widths)
        self.max_blocks = -(-max_model_len // block_size)
        self.input_ids = torch.zeros(t_max, dtype=torch.int64, device=device)
        self.positions = torch.zeros(t_max, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((t_max,), SKIP_SLOT, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(b_max, dtype=torch.int32, device=device)
        # Padding requests count as generated rows (prompt length 0): whichever kernel they take,
        # their results are dropped.
        self.prompt_lens = torch.zeros(b_max, dtype=torch.int32, device=device) if prompt_lens else None
        self.block_tables = torch.zeros(b_max, self.max_blocks, dtype=torch.int32, device=device)
        self.query_start_locs = {
            w: torch.arange(0, (b_max + 1) * w, w, dtype=torch.int32, device=device) for w in self.widths
        }
        self.kv_caches = kv_caches
        self.batch_invariant = batch_invariant
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (width, bucket) -> graph
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.hidden: dict[tuple[int, int], torch.Tensor] = {}
        # (width, bucket) -> measured replay time, for the draft budget (draft_budget.py); only
        # measured when there is more than one width to choose from.
        self.replay_ms: dict[tuple[int, int], float] = {}
        # The MTP layer's graphs (module docstring): its token ids in, its draft hidden states out.
        self.draft_ids = torch.zeros(t_max if draft_layer else 0, dtype=torch.int64, device=device)
        self.draft_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.draft_hidden: dict[tuple[int, int], torch.Tensor] = {}
        # The last replay: its (width, bucket), and where its real rows went when it was padded
        # (row i of the host batch -> row last_rows[i] of the graph's layout; None: not padded).
        self.last_key: tuple[int, int] | None = None
        self.last_rows: np.ndarray | None = None
        # Host staging in pinned memory, two sets used in turn: with asynchronous scheduling the
        # copy out of one set may still be queued behind the running step while the next step
        # fills the other. (A set is reused only after the step that read it has completed.)
        self._staging = [self._new_staging(b_max, t_max) for _ in range(2)]
        self.real_rows = torch.zeros(t_max, dtype=torch.int64, device=device)  # a padded step's real rows
        self._turn = 0

    def _new_staging(self, b_max: int, t_max: int) -> dict[str, torch.Tensor]:
        return {
            "ids": torch.zeros(t_max, dtype=torch.int64).pin_memory(),
            "pos": torch.zeros(t_max, dtype=torch.int64).pin_memory(),
            "slots": torch.zeros(t_max, dtype=torch.int64).pin_memory(),
            "rows": torch.zeros(t_max, dtype=torch.int64).pin_memory(),
            "lens": torch.zeros(b_max, dtype=torch.int32).pin_memory(),
            "plens": torch.zeros(b_max, dtype=torch.int32).pin_memory(),
            "tables": torch.zeros(b_max, self.max_blocks, dtype=torch.int32).pin_memory(),
        }

    def fits(self, batch_size: int, width: int = 1) -> bool:
        return batch_size <= self.sizes[-1] and width in self.widths

    def context(self, b: int, w: int) -> ForwardContext:
        """The forward context over the static buffers of bucket b at width w."""
        meta = AttentionMetadata(
            query_start_loc=self.query_start_locs[w][: b + 1],
            seq_lens=self.seq_lens[:b],
            block_tables=self.block_tables[:b],
            slot_mapping=self.slot_mapping[: b * w],
            block_size=self.block_size,
            max_query_len=w,
            max_seq_len=self.max_model_len,
            query_start_loc_cpu=[],
            seq_lens_cpu=[],
            prompt_lens=None if self.prompt_lens is None else self.prompt_lens[:b],
            generated_only=self.prompt_lens is not None,
        )
        return ForwardContext(meta, self.kv_caches, self.batch_invariant)

    def _forward(self, b: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.model(self.input_ids[: b * w], self.positions[: b * w], self.context(b, w))
        return hidden, self.model.compute_logits(hidden)

    def _draft_forward(self, b: int, w: int) -> torch.Tensor:
        return self.model.mtp_forward(
            self.draft_ids[: b * w], self.positions[: b * w], self.hidden[w, b], self.context(b, w)
        )

    @torch.inference_mode()
    def run_each_bucket(self) -> None:
        """Each (width, bucket)'s forward once, eagerly and without capturing: the passes capture()
        begins with, for engine/precompile.py to compile ahead."""
        for w in sorted(self.widths, reverse=True):
            self.seq_lens.fill_(w)
            for b in reversed(self.sizes):
                hidden, _ = self._forward(b, w)
                if self.draft_layer:
                    self.model.mtp_forward(
                        self.draft_ids[: b * w], self.positions[: b * w], hidden, self.context(b, w)
                    )

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for w in sorted(self.widths, reverse=True):
                # Padding requests hold w tokens at positions 0..w-1 (a valid causal layout).
                self.seq_lens.fill_(w)
                for b in reversed(self.sizes):
                    # One eager pass first: every kernel this bucket launches is compiled (or loaded
                    # from Triton's cache) and every lazy allocation made outside the capture; a
                    # second pass would find nothing left to do.
                    self._forward(b, w)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        self.hidden[w, b], self.outputs[w, b] = self._forward(b, w)
                    pool = graph.pool()
                    self.graphs[w, b] = graph
                    if self.draft_layer:
                        graph.replay()  # real hidden states for the draft layer's eager pass
                        self._draft_forward(b, w)
                        draft = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(draft, pool=pool, stream=stream):
                            self.draft_hidden[w, b] = self._draft_forward(b, w)
                        self.draft_graphs[w, b] = draft
                if len(self.widths) > 1:
                    for b in self.sizes:
                        replays = [self.graphs[w, b]] + (
                            [self.draft_graphs[w, b]] if self.draft_layer else []
                        )
                        self.replay_ms[w, b] = self._time_replay(replays, stream)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    @staticmethod
    def _time_replay(
        graphs: list[torch.cuda.CUDAGraph], stream: torch.cuda.Stream, repeats: int = 3
    ) -> float:
        """Milliseconds per replay of a step's graphs in turn (after one untimed round), at the
        capture's tiny contexts: what it measures is the weights' and the rows' share of a step,
        which sets the headroom."""
        for graph in graphs:
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(repeats):
            for graph in graphs:
                graph.replay()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) / repeats

    def _bucket(self, n: int) -> int:
        return next(s for s in self.sizes if s >= n)

    def forward_state(
        self, n: int, w: int
    ) -> tuple[torch.Tensor, torch.Tensor, ForwardContext, torch.Tensor]:
        """The last replay's (input ids, positions, context, hidden states), padding rows included:
        what a draft model continuing from this step reads (valid until the next replay)."""
        b = self._bucket(n)
        return (self.input_ids[: b * w], self.positions[: b * w], self.context(b, w), self.hidden[w, b])

    def run(
        self, host: Any, fixup: Any = None, w: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Replay the graph of width w for the host batch (requests of at most w tokens each, module
        docstring); returns (logits, input ids) of the real rows, in the host batch's row order, and the
        fixup's position shift of each sampling row (InputFixup.apply; None without one)."""
        if self.prompt_lens is not None and not host.generated_only:
            raise RuntimeError("a decode graph was asked to run a prompt row; the runner keeps those eager")
        n = len(host.seq_lens)
        b = self._bucket(n)
        t, tb = n * w, b * w
        width = host.block_tables.shape[1]
        st = self._staging[self._turn]
        self._turn ^= 1
        padded = bool((np.diff(host.query_start_loc) != w).any())
        real = len(host.input_ids)
        if padded:
            host, rows = pad_to_width(host, w)
            st["rows"][:real] = torch.from_numpy(rows)
            if fixup is not None:
                fixup = fixup.spread(rows.tolist(), t, w)
        st["ids"][:t] = torch.from_numpy(host.input_ids)
        st["pos"][:t] = torch.from_numpy(host.positions)
        st["slots"][:t] = torch.from_numpy(host.slot_mapping)
        st["lens"][:n] = torch.from_numpy(host.seq_lens)
        st["tables"][:n, :width] = torch.from_numpy(np.maximum(host.block_tables, 0))
        # Padding requests: skip the KV store, attend to w (ignored) keys in block 0.
        st["slots"][t:tb] = SKIP_SLOT
        st["lens"][n:b] = w
        st["ids"][t:tb] = 0
        st["pos"][t:tb] = 0
        self.input_ids[:tb].copy_(st["ids"][:tb], non_blocking=True)
        self.positions[:tb].copy_(st["pos"][:tb], non_blocking=True)
        self.slot_mapping[:tb].copy_(st["slots"][:tb], non_blocking=True)
        self.seq_lens[:b].copy_(st["lens"][:b], non_blocking=True)
        if self.prompt_lens is not None:
            st["plens"][:n] = torch.from_numpy(host.prompt_lens)
            st["plens"][n:b] = 0
            self.prompt_lens[:b].copy_(st["plens"][:b], non_blocking=True)
        self.block_tables[:b, :width].copy_(st["tables"][:b, :width], non_blocking=True)
        sample_shift = None
        if fixup is not None:
            sample_shift = fixup.apply(
                self.input_ids,
                self.positions,
                self.seq_lens,
                self.slot_mapping,
                self.block_tables,
                self.block_size,
            )
        self.graphs[w, b].replay()
        self.last_key = (w, b)
        self.last_rows = rows if padded else None
        if not padded:
            return self.outputs[w, b][:t], self.input_ids[:t], sample_shift
        keep = self.real_rows[:real]
        keep.copy_(st["rows"][:real], non_blocking=True)
        return self.outputs[w, b][keep], self.input_ids[keep], sample_shift

    def run_draft_layer(self, ids: torch.Tensor) -> torch.Tensor:
        """Replay the MTP layer's graph of the last replay's (width, bucket) over `ids` (on the
        device, one per row of that replay's layout, padding included); returns its draft hidden
        states, one row per row of the layout (valid until that graph's next replay)."""
        if not self.draft_layer or self.last_key is None:
            raise RuntimeError(
                "no draft-layer graph to replay: built without draft_layer, or before any replay"
            )
        w, b = self.last_key
        self.draft_ids[: b * w].copy_(ids)
        self.draft_graphs[w, b].replay()
        return self.draft_hidden[w, b]
