"""The demo model: transformers' DeepseekV3ForCausalLM as the main model plus one MTP module.

The MTP module follows DeepSeek-V3's layout (it is stored as decoder layer `num_hidden_layers`):
for sequence position j it builds `eh_proj(cat[enorm(embed(t[j+1])), hnorm(h[j])])`, where `h[j]` is the
main model's output at j *after* its final norm (the hidden state its head reads), runs one decoder block (same structure as a
main MoE block) causally over positions 0..j at rotary position j, then `shared_head.norm` and the output
head, predicting t[j+2]. The embedding and the head are the main model's; the head is also written under
`shared_head.head` because DeepSeek-V3 checkpoints carry it there.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mdl


def model_config_dict(vocab_size: int, bos: int, eos: int, pad: int, max_positions: int) -> dict[str, Any]:
    """The config.json contents, in DeepSeek-V3's own key spelling (valid for old and new transformers)."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": vocab_size,
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "n_shared_experts": 1,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_group": 4,
        "topk_group": 2,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "q_lora_rank": 96,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 32,
        "v_head_dim": 32,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "rope_interleave": True,
        "max_position_embeddings": max_positions,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


def hf_config(raw: dict[str, Any]) -> DeepseekV3Config:
    """Build the transformers config from config.json keys, passing only what this version accepts.

    Newer transformers declare fields (strict dataclass) and spell RoPE as `rope_parameters`; older ones
    take `rope_theta`/`rope_scaling`. Loading from a directory handles both; building in memory must too.
    """
    cfg = DeepseekV3Config()
    known = set(vars(cfg)) | set(getattr(DeepseekV3Config, "__dataclass_fields__", {}))
    known |= set(inspect.signature(DeepseekV3Config.__init__).parameters)
    kwargs = {k: v for k, v in raw.items() if k in known and k not in ("rope_theta", "rope_scaling")}
    if "rope_parameters" in known:
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": raw["rope_theta"]}
    else:
        kwargs["rope_theta"] = raw["rope_theta"]
        kwargs["rope_scaling"] = None
    if "num_mtp_layers" in known:
        kwargs["num_mtp_layers"] = raw["num_nextn_predict_layers"]
    return DeepseekV3Config(**kwargs)


class MTPLayer(nn.Module):
    """One DeepSeek-V3 multi-token-prediction module (parameter names match the checkpoint layout)."""

    def __init__(self, config: DeepseekV3Config, layer_idx: int) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.enorm = mdl.DeepseekV3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.hnorm = mdl.DeepseekV3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        # layer_idx >= first_k_dense_replace, so the block is an MoE block like the main model's last ones.
        self.block = mdl.DeepseekV3DecoderLayer(config, layer_idx)
        self.head_norm = mdl.DeepseekV3RMSNorm(hidden, eps=config.rms_norm_eps)

    def forward(
        self,
        main: DeepseekV3ForCausalLM,
        next_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Logits for t[j+2] from next_ids = t[1:L] and hidden = h[0:L-1] (final-normed main output)."""
        emb = main.model.embed_tokens(next_ids)
        x = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(hidden)], dim=-1))
        cos_sin = main.model.rotary_emb(x, position_ids)
        seq = x.shape[1]
        mask = torch.full((seq, seq), float("-inf"), device=x.device, dtype=x.dtype).triu(1)
        x = self.block(
            x, attention_mask=mask[None, None], position_ids=position_ids, position_embeddings=cos_sin
        )
        if isinstance(x, tuple):  # older transformers return (hidden,) tuples from decoder layers
            x = x[0]
        return main.lm_head(self.head_norm(x))


def main_hidden_and_logits(
    main: DeepseekV3ForCausalLM, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(final-normed hidden states, logits) for a [B, L] batch without padding.

    The MTP layer reads the main model's output *after* its final norm, as vLLM and transformers'
    MTP drafter feed it (what `DeepseekV3Model.forward` returns as `last_hidden_state`).
    """
    hidden = main.model(input_ids=ids, use_cache=False).last_hidden_state
    return hidden, main.lm_head(hidden)


def export_state_dict(main: DeepseekV3ForCausalLM, mtp: MTPLayer) -> dict[str, torch.Tensor]:
    """Tensors under DeepSeek-V3 checkpoint names: per-expert weights, MTP as layer num_hidden_layers.

    Router weights and the score-correction bias stay float32 (as transformers keeps them); the rest is bf16.
    """
    out: dict[str, torch.Tensor] = {}
    for name, t in list(main.state_dict().items()) + [
        (f"model.layers.{main.config.num_hidden_layers}.{k}", v) for k, v in _mtp_names(mtp).items()
    ]:
        if name.endswith("mlp.experts.gate_up_proj"):
            inter = t.shape[1] // 2
            prefix = name[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :inter]
                out[f"{prefix}{e}.up_proj.weight"] = t[e, inter:]
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    keep_fp32 = ("mlp.gate.weight", "e_score_correction_bias")
    return {
        k: (v.float() if k.endswith(keep_fp32) else v.to(torch.bfloat16)).contiguous().clone()
        for k, v in out.items()
    }


def _mtp_names(mtp: MTPLayer) -> dict[str, torch.Tensor]:
    names: dict[str, torch.Tensor] = {}
    for k, v in mtp.state_dict().items():
        if k.startswith("block."):
            names[k[len("block.") :]] = v
        elif k.startswith("head_norm."):
            names["shared_head.norm." + k[len("head_norm.") :]] = v
        else:
            names[k] = v
    return names


def add_shared_head(tensors: dict[str, torch.Tensor], main: DeepseekV3ForCausalLM) -> None:
    layer = main.config.num_hidden_layers
    tensors[f"model.layers.{layer}.shared_head.head.weight"] = (
        main.lm_head.weight.detach().to(torch.bfloat16).contiguous().clone()
    )


def load_mtp(tensors: dict[str, torch.Tensor], config: DeepseekV3Config) -> MTPLayer:
    """Rebuild the MTP module from checkpoint tensors (the inverse of export_state_dict)."""
    layer = config.num_hidden_layers
    prefix = f"model.layers.{layer}."
    mtp = MTPLayer(config, layer)
    sd = mtp.state_dict()
    experts = config.n_routed_experts
    for key in sd:
        if key.startswith("head_norm."):
            src = prefix + "shared_head.norm." + key[len("head_norm.") :]
            sd[key] = tensors[src]
        elif key.startswith("block.mlp.experts."):
            leaf = key[len("block.mlp.experts.") :]
            base = prefix + "mlp.experts."
            if leaf == "gate_up_proj":
                sd[key] = torch.stack(
                    [
                        torch.cat(
                            [tensors[f"{base}{e}.gate_proj.weight"], tensors[f"{base}{e}.up_proj.weight"]]
                        )
                        for e in range(experts)
                    ]
                )
            elif leaf == "down_proj":
                sd[key] = torch.stack([tensors[f"{base}{e}.down_proj.weight"] for e in range(experts)])
            else:
                sd[key] = tensors[base + leaf]
        elif key.startswith("block."):
            sd[key] = tensors[prefix + key[len("block.") :]]
        else:
            sd[key] = tensors[prefix + key]
    mtp.load_state_dict({k: v.float() for k, v in sd.items()})
    return mtp
