"""DeepSeek-V3 multi-token prediction (MTP) layers, used as a speculative-decoding drafter.

The checkpoint stores `num_nextn_predict_layers` MTP layers after the main ones, as
`model.layers.{num_hidden_layers + k}.*`: `enorm`, `hnorm`, `eh_proj` [H, 2H], one ordinary decoder
block (self_attn, mlp, input/post_attention_layernorm), `shared_head.norm`, `shared_head.head`,
and usually a copy of `embed_tokens` (when a copy is absent the main model's embedding and
lm_head are used).

Draft step for position i (attending over the MTP layer's own latent cache at positions <= i):

    x    = eh_proj([enorm(embed(t_{i+1})) ; hnorm(h_i)])      h_i: main model's final hidden at i
    y    = shared_head.norm(block(x))                          (the residual stream's final norm)
    logits(t_{i+2}) = shared_head.head(y)

`h_i` is what `DeepseekV3ForCausalLM.forward` returns (after the final norm, as vLLM feeds it);
`y` has the same form, so chaining the layer k times drafts k tokens.
"""

from __future__ import annotations

import torch
from torch import nn

from shardinfer.engine.forward_context import ForwardContext
from shardinfer.engine.models.base import Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.deepseek_block import DeepseekDecoderLayer
from shardinfer.engine.models.layers import Linear, RMSNorm
from shardinfer.engine.models.rope import RopeTable


class SharedHead(nn.Module):
    def __init__(self, config: ModelConfig, numerics: Numerics) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, numerics)
        # Filled from `shared_head.head.weight` when the checkpoint has it, else the main lm_head.
        self.head: Linear | None = None


class MTPLayer(nn.Module):
    def __init__(self, config: ModelConfig, numerics: Numerics, layer_idx: int, rope: RopeTable) -> None:
        super().__init__()
        h = config.hidden_size
        self.enorm = RMSNorm(h, config.rms_norm_eps, numerics)
        self.hnorm = RMSNorm(h, config.rms_norm_eps, numerics)
        self.eh_proj = Linear(2 * h, h, False, numerics)
        self.block = DeepseekDecoderLayer(config, numerics, layer_idx, rope)
        self.shared_head = SharedHead(config, numerics)
        self.embed_tokens: nn.Embedding | None = None  # a checkpoint copy, else the main embedding

    def forward(
        self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        """embeds [T, H] (embedding of t_{i+1}), hidden [T, H] (h_i) -> normed draft hidden [T, H]."""
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))
        x, residual = self.block(x, None, positions, ctx)
        y, _ = self.shared_head.norm.add_and_norm(x, residual)
        return y
