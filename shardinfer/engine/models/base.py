"""What every model family implements, and the numerics settings its layers share.

A model sees one flat varlen batch per step (see engine/forward_context.py) and never
knows about requests, padding or the scheduler.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from shardinfer.engine.forward_context import ForwardContext
from shardinfer.engine.models.config import ModelConfig


@dataclass(frozen=True)
class Numerics:
    """Engine-wide numerics, fixed for an LLM's lifetime and shared by all its layers."""

    dtype: torch.dtype
    batch_invariant: bool = True
    # "fp8": linear layers hold FP8 weights (engine/models/fp8.py); None: dtype.
    quantization: str | None = None
    # With "fp8", the weights' scale layout: "block" (128x128 blocks) or "channel" (one per output
    # row), the checkpoint's own (registry.load_model sets it; quantising at load makes blocks).
    fp8_scales: str = "block"


@dataclass(frozen=True)
class KVLayerSpec:
    """One attention layer's cache: each entry is a tensor [num_blocks, block_size, *shape].

    Dense attention: entries ((Hk, D), (Hk, Dv)) for K and V. MLA: one entry
    ((kv_lora_rank + qk_rope_head_dim,),) holding the normalised latent and the rope key.
    """

    entries: tuple[tuple[int, ...], ...]
    sliding_window: int | None = None

    @property
    def values_per_token(self) -> int:
        return sum(math.prod(shape) for shape in self.entries)


class CausalLM(Protocol):
    config: ModelConfig

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """input_ids [T] int64, positions [T] int64 -> final hidden states [T, hidden]."""
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab] in float32."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Consume (checkpoint name, tensor) pairs; raise CheckpointError on a missing,
        unexpected or mis-shaped tensor."""
        ...

    def kv_cache_specs(self) -> list[KVLayerSpec]:
        """One spec per attention layer, in layer order (ForwardContext.kv_caches is indexed alike)."""
        ...
