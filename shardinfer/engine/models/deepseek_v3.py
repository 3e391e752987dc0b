"""DeepSeek-V3 (and its family: R1, V3.1, Moonlight-style configs) and DeepSeek-V2 on the engine.

Multi-head latent attention over a latent paged cache (deepseek_mla.py), sigmoid group-limited
MoE with shared experts after `first_k_dense_replace` dense layers (deepseek_moe.py), the optional
multi-token-prediction layers as a draft model (deepseek_mtp.py), and FP8 block-scaled
checkpoints, kept in FP8 or dequantised at load (fp8.py). DeepSeek-V2 is the same network with softmax routing
(plain or group-limited by each group's best expert) and no MTP layer. Checkpoint names are Hugging Face's; routed experts
may be stored one tensor per expert (the released checkpoints) or stacked
(`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import cast

import torch
from torch import nn

from shardinfer.engine.forward_context import ForwardContext
from shardinfer.engine.models.base import KVLayerSpec, Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.deepseek_block import DeepseekDecoderLayer
from shardinfer.engine.models.deepseek_mla import DeepseekMLA, MLADims
from shardinfer.engine.models.deepseek_moe import moe_setting
from shardinfer.engine.models.deepseek_mtp import MTPLayer
from shardinfer.engine.models.fp8 import WeightLoader, dequantize_fp8, fp8_format, pair_fp8_weights
from shardinfer.engine.models.layers import RMSNorm, embedding, logits_head
from shardinfer.engine.models.rope import RopeTable
from shardinfer.errors import CheckpointError, ModelLoadError

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.*)$")
_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
# Parts of an MTP layer that live outside its decoder block.
_MTP_OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.")
_MTP_COPIES = ("embed_tokens.weight", "shared_head.head.weight")


class DeepseekV3Model(nn.Module):
    def __init__(self, config: ModelConfig, numerics: Numerics, rope: RopeTable) -> None:
        super().__init__()
        self.embed_tokens = embedding(config.vocab_size, config.hidden_size, numerics.dtype)
        self.layers = nn.ModuleList(
            DeepseekDecoderLayer(config, numerics, i, rope) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, numerics)


class DeepseekV3ForCausalLM(nn.Module):
    """The CausalLM for `DeepseekV3ForCausalLM` checkpoints; `forward` returns final-normed hidden states."""

    def __init__(self, config: ModelConfig, numerics: Numerics, max_positions: int) -> None:
        super().__init__()
        hf = config.hf
        act = hf.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ModelLoadError(
                f"hidden_act={act!r} is not supported for {config.architecture}; supported: silu"
            )
        for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if not hf.get(key):
                raise ModelLoadError(f"config.json of {config.architecture} lacks MLA setting {key!r}")
        self.config = config
        self.numerics = numerics
        self.dims = MLADims(config)
        self.fp8 = fp8_format(hf)
        self.rope = RopeTable(
            self.dims.qk_rope_head_dim,
            config.rope_theta,
            config.rope_scaling,
            max_positions,
            config.max_position_embeddings,
        )
        self.model = DeepseekV3Model(config, numerics, self.rope)
        self.lm_head = logits_head(config.hidden_size, config.vocab_size, numerics)
        if config.tie_word_embeddings:
            self.lm_head.weight = cast(nn.Parameter, self.model.embed_tokens.weight)
        n_mtp = int(hf.get("num_nextn_predict_layers") or 0)
        # Built for every announced MTP layer; load_weights drops them if the checkpoint has none.
        self.mtp = nn.ModuleList(
            MTPLayer(config, numerics, config.num_hidden_layers + k, self.rope) for k in range(n_mtp)
        )

    # ---- CausalLM protocol -------------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        residual: torch.Tensor | None = None
        for layer in self.model.layers:
            x, residual = layer(x, residual, positions, ctx)
        x, _ = self.model.norm.add_and_norm(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.logits(hidden)

    def kv_cache_specs(self) -> list[KVLayerSpec]:
        """One latent cache per main layer: kv_lora_rank + qk_rope_head_dim values per token."""
        return [self.dims.kv_spec() for _ in range(self.config.num_hidden_layers)]

    def to_device(self, device: torch.device) -> None:
        if device.type == "cuda":
            r, dr = self.dims.kv_lora_rank, self.dims.qk_rope_head_dim
            if r > 1024 or r & (r - 1) or dr < 16 or dr & (dr - 1):
                raise ModelLoadError(
                    f"kv_lora_rank={r}, qk_rope_head_dim={dr}: the CUDA MLA kernel needs powers "
                    "of two with kv_lora_rank <= 1024 and qk_rope_head_dim >= 16 (DeepSeek-V2/V3 "
                    "use 512 and 64); run this checkpoint with device='cpu'"
                )
        self.to(device)
        self.rope.to(device)

    # ---- multi-token prediction (draft model) ------------------------------------------------

    @property
    def num_mtp_layers(self) -> int:
        return len(self.mtp)

    def mtp_kv_cache_specs(self) -> list[KVLayerSpec]:
        """Caches of the MTP layers; they sit at ForwardContext.kv_caches[num_hidden_layers + k]."""
        return [self.dims.kv_spec() for _ in range(self.num_mtp_layers)]

    def mtp_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        ctx: ForwardContext,
        index: int = 0,
    ) -> torch.Tensor:
        """One draft step of MTP layer `index` for a varlen batch.

        Row i pairs hidden[i] = the main model's `forward` output at position positions[i] with
        input_ids[i] = the token at position positions[i] + 1; the row is stored in, and attends
        over, the MTP layer's cache at positions[i] (same slot mapping as the main step).
        Returns the draft hidden [T, H]: feed it to `mtp_compute_logits` for the logits of the
        token at positions[i] + 2, or back in as `hidden` to draft one position further.
        """
        if not 0 <= index < self.num_mtp_layers:
            raise ValueError(
                f"MTP layer index {index} out of range: this checkpoint has "
                f"{self.num_mtp_layers} MTP layer(s)"
            )
        layer = self._mtp_layer(index)
        embed = layer.embed_tokens if layer.embed_tokens is not None else self.model.embed_tokens
        return layer(embed(input_ids), hidden, positions, ctx)

    def _mtp_layer(self, index: int) -> MTPLayer:
        return cast(MTPLayer, self.mtp[index])

    def mtp_compute_logits(self, draft_hidden: torch.Tensor, index: int = 0) -> torch.Tensor:
        head = self._mtp_layer(index).shared_head.head
        return (head if head is not None else self.lm_head).logits(draft_hidden)

    # ---- loading -----------------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        filled = {name: torch.zeros(p.shape[:-1], dtype=torch.bool) for name, p in params.items()}
        unexpected: list[str] = []
        loader = WeightLoader(params, self.fp8, self.numerics.dtype)
        for name, tensor, scale in pair_fp8_weights(weights, self.fp8):
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            if self.config.tie_word_embeddings and name == "lm_head.weight":
                continue
            target = self._target_name(name)
            if target is None:
                unexpected.append(name)
                continue
            if scale is not None and self.fp8 is not None and target.endswith(_MTP_COPIES):
                tensor = dequantize_fp8(tensor, scale, self.fp8, self.numerics.dtype)
            if self._load_mtp_copy(target, tensor):
                continue
            param_name, index = self._split_target(target)
            if param_name not in params:
                unexpected.append(name)
                continue
            for filled_name, filled_index in loader.load(param_name, tensor, scale, name, index):
                where = (
                    filled_index
                    if isinstance(filled_index, tuple)
                    else (filled_index,)
                    if filled_index
                    else ()
                )
                filled[filled_name][where[: filled[filled_name].ndim]] = True
        loader.finish()
        if unexpected:
            keys = "num_hidden_layers, num_nextn_predict_layers"
            if any(".mlp." in name for name in unexpected):  # a layer's MLP is not the kind config.json says
                keys += ", first_k_dense_replace, moe_layer_freq, n_shared_experts"
            raise CheckpointError(
                f"checkpoint has tensors {unexpected[:5]}{'...' if len(unexpected) > 5 else ''} "
                f"that {self.config.architecture} does not use: is config.json the "
                f"checkpoint's own ({keys})?"
            )
        self._drop_absent_mtp_layers(filled)
        missing = sorted(n for n, mask in filled.items() if not bool(mask.all()))
        if missing:
            raise CheckpointError(
                f"checkpoint lacks tensors for {missing[:5]}{'...' if len(missing) > 5 else ''} "
                f"required by {self.config.architecture}"
            )
        for module in self.modules():
            if isinstance(module, DeepseekMLA):
                module.absorb_weights()

    def _target_name(self, name: str) -> str | None:
        """Checkpoint name -> our parameter path (before fused/stacked splitting); None if foreign."""
        m = _LAYER.match(name)
        if m is None or int(m.group(1)) < self.config.num_hidden_layers:
            return name
        k = int(m.group(1)) - self.config.num_hidden_layers
        if k >= self.num_mtp_layers:
            return None
        rest = m.group(2)
        return f"mtp.{k}.{rest}" if rest.startswith(_MTP_OWN) else f"mtp.{k}.block.{rest}"

    def _load_mtp_copy(self, target: str, tensor: torch.Tensor) -> bool:
        """MTP layers may carry their own embedding / head copies; they are created on arrival."""
        m = re.match(r"^mtp\.(\d+)\.(embed_tokens|shared_head\.head)\.weight$", target)
        if m is None:
            return False
        layer = self._mtp_layer(int(m.group(1)))
        h, v = self.config.hidden_size, self.config.vocab_size
        if tuple(tensor.shape) != (v, h):
            raise CheckpointError(f"MTP tensor {target!r} has shape {tuple(tensor.shape)}, expected {(v, h)}")
        with torch.device(tensor.device):  # made where the weights already are: no host detour
            if m.group(2) == "embed_tokens":
                layer.embed_tokens = embedding(v, h, self.numerics.dtype)
                layer.embed_tokens.weight.copy_(tensor)
            else:
                layer.shared_head.head = logits_head(h, v, self.numerics)
                layer.shared_head.head.weight.copy_(tensor)
        return True

    def _split_target(self, target: str) -> tuple[str, tuple[int | slice, ...]]:
        """Map fused/stacked checkpoint tensors onto (parameter, index into it)."""
        m = _EXPERT.match(target)
        if m is not None:
            prefix, expert, proj = m.group(1), int(m.group(2)), m.group(3)
            inter = int(self.config.hf["moe_intermediate_size"])
            if proj == "down_proj":
                return f"{prefix}.w_down", (expert,)
            rows = slice(0, inter) if proj == "gate_proj" else slice(inter, 2 * inter)
            return f"{prefix}.w_gate_up", (expert, rows)
        if target.endswith(".mlp.experts.gate_up_proj"):
            return target[: -len("gate_up_proj")] + "w_gate_up", ()
        if target.endswith(".mlp.experts.down_proj"):
            return target[: -len("down_proj")] + "w_down", ()
        for proj, half in (("gate_proj", 0), ("up_proj", 1)):
            suffix = f".{proj}.weight"
            if target.endswith(suffix) and (".mlp." in target):
                hf = self.config.hf
                inter = (
                    int(hf["moe_intermediate_size"]) * int(moe_setting(hf, "n_shared_experts") or 0)
                    if ".shared_experts." in target
                    else self.config.intermediate_size
                )
                return target[: -len(suffix)] + ".gate_up_proj.weight", (
                    slice(half * inter, (half + 1) * inter),
                )
        return target, ()

    def _drop_absent_mtp_layers(self, filled: dict[str, torch.Tensor]) -> None:
        """Keep the MTP layers the checkpoint fills completely; none at all is fine (MTP off)."""
        keep = 0
        for k in range(self.num_mtp_layers):
            masks = [mask for name, mask in filled.items() if name.startswith(f"mtp.{k}.")]
            if not any(bool(mask.any()) for mask in masks):
                break
            keep = k + 1
        for k in range(keep, self.num_mtp_layers):
            if any(bool(mask.any()) for name, mask in filled.items() if name.startswith(f"mtp.{k}.")):
                raise CheckpointError(
                    f"checkpoint has MTP layer {self.config.num_hidden_layers + k} but not "
                    f"layer {self.config.num_hidden_layers + keep}: MTP layers must be contiguous"
                )
        del self.mtp[keep:]
        for name in [n for n in filled if n.startswith("mtp.") and int(n.split(".")[1]) >= keep]:
            del filled[name]


class DeepseekV2ForCausalLM(DeepseekV3ForCausalLM):
    """`DeepseekV2ForCausalLM` checkpoints (V2, V2-Lite, V2.5): MLA plus softmax-routed MoE.

    The architecture differences are all read from config.json (see deepseek_moe.RoutingConfig),
    so the class exists only to name the architecture."""
