"""The flat (varlen) batch one model step sees, and the KV cache it reads and writes.

A step packs every scheduled request's new tokens into one token axis:

    tokens:     [ r0 t0..t4 | r1 t0 | r2 t0..t2 ]      T = 9 new tokens
    query_start_loc = [0, 5, 6, 9]                     (B + 1)
    seq_lens        = [ctx0 + 5, ctx1 + 1, ctx2 + 3]   keys each request attends to after the store
    block_tables    = [B, max_blocks] int32, PAD_BLOCK padded; block b of request i holds its
                      positions [b * block_size, (b + 1) * block_size)
    slot_mapping    = [T] int64, block_id * block_size + offset: where each new token's KV goes
                      (SKIP_SLOT: a CUDA graph's padding row, whose KV store the kernel skips)
    prompt_lens     = [B] int32, each request's prompt length: rows at or after it are generated
                      tokens, which attention may compute with a kernel of their own
    generated_only  = every row is a generated token's (a decode step): the prompt rows' kernels
                      need not run at all

Positions are absolute (the request's token index), so RoPE, sampling noise and the causal
mask never depend on how the request was chunked or batched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

PAD_BLOCK = -1  # a block-table entry past the request's blocks
SKIP_SLOT = -1  # a slot_mapping entry whose KV is not stored (kernels/kv_store.py skips it)


@dataclass
class AttentionMetadata:
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, max_blocks] int32
    slot_mapping: torch.Tensor  # [T] int64
    block_size: int
    max_query_len: int
    max_seq_len: int
    # Host copies: the reference path loops over requests and must not sync per request.
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    # [B] int32 on the device, or None (every row is computed as a prompt row). Which kernel
    # computes a row must depend only on its request and position (kernels/paged_attention_fma.py).
    prompt_lens: torch.Tensor | None = None
    # Every row is at or after its request's prompt length (the host checked it): with
    # prompt_lens, attention may launch the generated rows' kernel alone.
    generated_only: bool = False


class RopeRows(Protocol):
    """A rotary table whose rows for given positions can be looked up (models/rope.RopeTable)."""

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass
class ForwardContext:
    """Everything a model's forward needs beyond token ids and positions."""

    attn: AttentionMetadata
    # One entry per attention layer, indexed by the layer's global index. Dense layers hold
    # (k_cache, v_cache), each [num_blocks, block_size, num_kv_heads, head_dim]; MLA layers
    # hold one tensor [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim].
    kv_caches: list[tuple[torch.Tensor, ...]]
    batch_invariant: bool = True
    # rope_rows' lookups of this forward: table id -> (positions, cos, sin).
    _rope_rows: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, init=False, repr=False
    )

    def rope_rows(self, table: RopeRows, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """table.lookup(positions), gathered once per forward and table and shared by every layer
        that asks with the same positions tensor (two gathers a step instead of two a layer). The
        positions are kept with the rows, so a later call with another tensor (the MTP layer's)
        looks its own rows up."""
        hit = self._rope_rows.get(id(table))
        if hit is not None and hit[0] is positions:
            return hit[1], hit[2]
        cos, sin = table.lookup(positions)
        self._rope_rows[id(table)] = (positions, cos, sin)
        return cos, sin
