"""Dense decoder-only transformers: Llama, Qwen2, Qwen3 and Mistral in one implementation.

They differ only in flags: attention biases (Qwen2, Llama's attention_bias), per-head q/k RMSNorm
before RoPE (Qwen3), a sliding attention window (Mistral; Qwen2 and Qwen3 with use_sliding_window,
see layer_windows), tied embeddings, and the RoPE scaling. Q/K/V and gate/up projections are
fused into one matmul each; the loader splits checkpoint tensors into their row ranges. FP8
block-scaled checkpoints load as engine/models/fp8.py describes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from shardinfer.engine.forward_context import ForwardContext
from shardinfer.engine.models.base import KVLayerSpec, Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.fp8 import WeightLoader, fp8_format, pair_fp8_weights
from shardinfer.engine.models.layers import (
    Linear,
    PreNormDecoderLayer,
    RMSNorm,
    SwiGLUMLP,
    embedding,
    logits_head,
)
from shardinfer.engine.models.rope import RopeTable
from shardinfer.errors import CheckpointError, ModelLoadError
from shardinfer.kernels import ops
from shardinfer.kernels.reference_fp8 import Fp8Activation

# Checkpoint tensors that carry no model state (old exports keep rope caches).
# DenseAttention runs its head norms, RoPE and K/V stores as ops.qkv_prologue (one launch on CUDA,
# the same bits); False runs them op by op, which bench/throughput.py --compare-unfused times against it.
FUSED_PROLOGUE = True

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


# transformers' values for configs that leave these keys out (Mistral, Qwen2 and Qwen3 configs).
DEFAULT_SLIDING_WINDOW = 4096
DEFAULT_MAX_WINDOW_LAYERS = 28


def layer_windows(config: ModelConfig) -> list[int | None]:
    """Each layer's attention window (None: full attention), read as transformers reads each family.

    Llama has no sliding attention: a `sliding_window` key in its config is ignored. Mistral uses
    `sliding_window` on every layer (`layer_types` is not a Mistral key). Qwen2 and Qwen3 use it only
    with `use_sliding_window` true, and then on the layers `layer_types` marks "sliding_attention",
    or, for configs written before `layer_types` existed, on layers from `max_window_layers` on.
    """
    hf, n = config.hf, config.num_hidden_layers
    if config.model_type == "mistral":
        return [_window(hf)] * n
    if config.model_type not in ("qwen2", "qwen3"):
        return [None] * n
    window = _window(hf) if hf.get("use_sliding_window", False) else None
    layer_types = hf.get("layer_types")
    if not layer_types:
        full_first = hf.get("max_window_layers")
        full_first = DEFAULT_MAX_WINDOW_LAYERS if full_first is None else int(full_first)
        layer_types = ["sliding_attention" if i >= full_first else "full_attention" for i in range(n)]
    if len(layer_types) != n:
        raise ModelLoadError(
            f"config.json layer_types has {len(layer_types)} entries but num_hidden_layers={n}: "
            "give one entry per layer"
        )
    return [window if t == "sliding_attention" else None for t in layer_types]


def _window(hf: dict[str, Any]) -> int | None:
    """`sliding_window` (transformers' default when absent; null or 0 means full attention)."""
    value = hf.get("sliding_window", DEFAULT_SLIDING_WINDOW)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ModelLoadError(
            f"config.json sliding_window={value!r} is not a window length: give a positive "
            "integer, or null for full attention"
        )
    return value or None


class DenseAttention(nn.Module):
    def __init__(
        self, config: ModelConfig, numerics: Numerics, layer_idx: int, window: int | None, rope: RopeTable
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.window = window
        self.rope = rope
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        qkv_bias = bool(config.hf.get("attention_bias", False)) or config.model_type == "qwen2"
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, qkv_bias, numerics)
        o_bias = bool(config.hf.get("attention_bias", False)) and config.model_type != "qwen2"
        self.o_proj = Linear(self.q_size, config.hidden_size, o_bias, numerics)
        self.qk_norm = config.model_type == "qwen3"
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, numerics)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, numerics)
        self.scale = self.head_dim**-0.5
        self.numerics = numerics

    def takes_fp8_input(self) -> bool:
        """The input feeds qkv_proj alone, so an FP8 qkv_proj can take it quantised (layers.py)."""
        return self.qkv_proj.takes_fp8_input()

    def forward(
        self, x: torch.Tensor | Fp8Activation, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        """x [T, hidden], float or quantised (takes_fp8_input)."""
        qkv = self.qkv_proj(x)
        t = qkv.shape[0]
        # (K, V), or for an FP8 cache (K, V, K scales, V scales); see engine/kv_cache.py.
        k_cache, v_cache, *scales = ctx.kv_caches[self.layer_idx]
        k_scale, v_scale = scales if scales else (None, None)
        # Head norms, RoPE and the cache stores: one launch on CUDA (the same bits as op by op).
        q = ops.qkv_prologue(
            qkv,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.q_norm.weight if self.qk_norm else None,
            self.k_norm.weight if self.qk_norm else None,
            self.q_norm.eps if self.qk_norm else 0.0,
            self.rope.cos,
            self.rope.sin,
            positions,
            k_cache,
            v_cache,
            ctx.attn.slot_mapping,
            k_scale,
            v_scale,
            fuse=FUSED_PROLOGUE,
        )
        meta = ctx.attn
        # Device tensors feed the kernel (and CUDA graphs); the CPU reference loops over host lists.
        qsl, lens = (
            (meta.query_start_loc, meta.seq_lens)
            if q.is_cuda
            else (meta.query_start_loc_cpu, meta.seq_lens_cpu)
        )
        out = ops.paged_attention(
            q,
            k_cache,
            v_cache,
            qsl,
            lens,
            meta.block_tables,
            self.scale,
            self.window,
            self.numerics.batch_invariant,
            max_seq_len=meta.max_seq_len,
            k_scale=k_scale,
            v_scale=v_scale,
            prompt_lens=meta.prompt_lens,
            generated_only=meta.generated_only,
        )
        return self.o_proj(out.reshape(t, self.q_size))


class DenseDecoderLayer(PreNormDecoderLayer):
    def __init__(
        self, config: ModelConfig, numerics: Numerics, layer_idx: int, window: int | None, rope: RopeTable
    ) -> None:
        super().__init__()
        self.self_attn = DenseAttention(config, numerics, layer_idx, window, rope)
        bias = bool(config.hf.get("mlp_bias", False))
        self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size, numerics, bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, numerics)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, numerics)


class DenseForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, numerics: Numerics, max_positions: int) -> None:
        super().__init__()
        act = config.hf.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ModelLoadError(
                f"hidden_act={act!r} is not supported for {config.architecture}; supported: silu"
            )
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        if kv_heads <= 0 or heads % kv_heads:
            # Grouped-query attention shares each K/V head among a whole number of query heads.
            raise ModelLoadError(
                f"config.json num_attention_heads={heads} is not a multiple of "
                f"num_key_value_heads={kv_heads}: is config.json the checkpoint's own?"
            )
        self.config = config
        self.numerics = numerics
        rope_dim = config.head_dim
        self.rope = RopeTable(
            rope_dim, config.rope_theta, config.rope_scaling, max_positions, config.max_position_embeddings
        )
        self.windows = layer_windows(config)
        self.embed_tokens = embedding(config.vocab_size, config.hidden_size, numerics.dtype)
        self.layers = nn.ModuleList(
            DenseDecoderLayer(config, numerics, i, self.windows[i], self.rope)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, numerics)
        self.lm_head = logits_head(config.hidden_size, config.vocab_size, numerics)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight  # type: ignore[assignment]

    def to_device(self, device: torch.device) -> None:
        self.to(device)
        self.rope.to(device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            x, residual = layer(x, residual, positions, ctx)
        x, _ = self.norm.add_and_norm(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.logits(hidden)

    def kv_cache_specs(self) -> list[KVLayerSpec]:
        shape = (self.config.num_key_value_heads, self.config.head_dim)
        return [KVLayerSpec((shape, shape), w) for w in self.windows]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        c = self.config
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        inter = c.intermediate_size
        fused = {  # checkpoint module -> (our module, rows)
            "self_attn.q_proj": ("self_attn.qkv_proj", slice(0, q)),
            "self_attn.k_proj": ("self_attn.qkv_proj", slice(q, q + kv)),
            "self_attn.v_proj": ("self_attn.qkv_proj", slice(q + kv, q + 2 * kv)),
            "mlp.gate_proj": ("mlp.gate_up_proj", slice(0, inter)),
            "mlp.up_proj": ("mlp.gate_up_proj", slice(inter, 2 * inter)),
        }
        expected = set(params)
        for ours, (fused_target, _rows) in fused.items():
            for name in params:
                if f".{fused_target}." in name:
                    expected.discard(name)
                    expected.add(name.replace(fused_target, ours))
        if c.tie_word_embeddings:
            expected.discard("lm_head.weight")
        loaded: set[str] = set()
        unexpected: list[str] = []
        fmt = fp8_format(c.hf)
        loader = WeightLoader(params, fmt, self.numerics.dtype)
        for name, tensor, scale in pair_fp8_weights(weights, fmt):
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            if c.tie_word_embeddings and name == "lm_head.weight":
                continue
            # Checkpoints nest the decoder under "model."; our modules sit at the top level.
            target, rows = name.removeprefix("model."), None
            for ours, (fused_name, fused_rows) in fused.items():
                if f".{ours}." in name:
                    target, rows = target.replace(ours, fused_name), fused_rows
                    break
            if target not in params:
                unexpected.append(name)
                continue
            loader.load(target, tensor, scale, name, rows)
            loaded.add(name.removeprefix("model."))
            scale_param = loader.scale_param(target)
            if scale_param is not None:  # its scale comes with it, or is made at load
                suffix = scale_param.removeprefix(target.removesuffix(".weight"))
                loaded.add(name.removeprefix("model.").removesuffix(".weight") + suffix)
        loader.finish()
        missing = sorted(expected - loaded)
        if unexpected:
            raise CheckpointError(
                f"checkpoint has tensors {unexpected[:5]}{'...' if len(unexpected) > 5 else ''} "
                f"that {c.architecture} does not use: is the architecture in config.json right?"
            )
        if missing:
            raise CheckpointError(
                f"checkpoint lacks tensors {missing[:5]}{'...' if len(missing) > 5 else ''} "
                f"required by {c.architecture}"
            )
