"""One DeepSeek-V3 decoder block: pre-norm MLA, then pre-norm dense MLP or MoE.

Shared by the main stack and the multi-token-prediction (MTP) layer, whose block is an ordinary
decoder block with its own attention cache.
"""

from __future__ import annotations

from torch import nn

from shardinfer.engine.models.base import Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.deepseek_mla import DeepseekMLA
from shardinfer.engine.models.deepseek_moe import DeepseekMoE, moe_setting
from shardinfer.engine.models.layers import PreNormDecoderLayer, RMSNorm, SwiGLUMLP
from shardinfer.engine.models.rope import RopeTable


def is_moe_layer(config: ModelConfig, layer_idx: int) -> bool:
    """Layers from first_k_dense_replace on are MoE (every moe_layer_freq-th one, 1 for V3)."""
    hf = config.hf
    if not hf.get("n_routed_experts"):
        return False
    first_dense = int(moe_setting(hf, "first_k_dense_replace") or 0)
    freq = int(hf.get("moe_layer_freq") or 1)
    return layer_idx >= first_dense and layer_idx % freq == 0


class DeepseekDecoderLayer(PreNormDecoderLayer):
    def __init__(self, config: ModelConfig, numerics: Numerics, layer_idx: int, rope: RopeTable) -> None:
        super().__init__()
        self.self_attn = DeepseekMLA(config, numerics, layer_idx, rope)
        self.mlp: nn.Module = (
            DeepseekMoE(config, numerics)
            if is_moe_layer(config, layer_idx)
            else SwiGLUMLP(config.hidden_size, config.intermediate_size, numerics)
        )
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, numerics)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, numerics)
