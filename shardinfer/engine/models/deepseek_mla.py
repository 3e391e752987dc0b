"""DeepSeek multi-head latent attention (MLA) over the paged latent cache.

Projections (checkpoint names): the query is `q_proj(x)`, or with a query LoRA
`q_b_proj(q_a_layernorm(q_a_proj(x)))`, split per head into a no-position part (qk_nope_head_dim)
and a rotary part (qk_rope_head_dim). `kv_a_proj_with_mqa(x)` gives the KV latent
(kv_lora_rank, normalised by kv_a_layernorm) and one rotary key shared by all heads.
`kv_b_proj` [H * (nope + v), kv_lora_rank] decompresses the latent into per-head no-position keys
(W_UK) and values (W_UV); we never apply it to the cache but fold W_UK into the query and apply
W_UV to the attention output (see kernels/reference_mla.py).

RoPE pairs adjacent dimensions (`rope_interleave`, the default and DeepSeek's layout) or halves.
The softmax scale is qk_head_dim^-0.5, times mscale^2 with mscale = 0.1 * mscale_all_dim *
ln(factor) + 1 when YaRN scaling sets mscale_all_dim; YaRN's cos/sin attention factor
(mscale / mscale_all_dim, 1.0 for DeepSeek-V3) is in the rope table.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from shardinfer.engine.forward_context import ForwardContext
from shardinfer.engine.models.base import KVLayerSpec, Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.layers import Linear, RMSNorm
from shardinfer.engine.models.rope import RopeTable, yarn_mscale
from shardinfer.kernels import ops
from shardinfer.kernels.reference_fp8 import Fp8Activation

# The latent norms use RMSNorm's default epsilon in both the official and transformers code,
# not config.rms_norm_eps.
LATENT_NORM_EPS = 1e-6


def mla_softmax_scale(qk_head_dim: int, rope_scaling: dict[str, Any] | None) -> float:
    """qk_head_dim^-0.5, times YaRN's mscale(factor, mscale_all_dim)^2 when the config sets mscale_all_dim."""
    scale = qk_head_dim**-0.5
    if rope_scaling and rope_scaling.get("rope_type", "default") != "default":
        mscale_all_dim = rope_scaling.get("mscale_all_dim") or 0
        if mscale_all_dim:
            m = yarn_mscale(float(rope_scaling["factor"]), float(mscale_all_dim))
            scale *= m * m
    return scale


class MLADims:
    """The head dimensions of one MLA layer, read once from config.json."""

    def __init__(self, config: ModelConfig) -> None:
        hf = config.hf
        self.num_heads = config.num_attention_heads
        self.q_lora_rank: int | None = int(hf["q_lora_rank"]) if hf.get("q_lora_rank") else None
        self.kv_lora_rank = int(hf["kv_lora_rank"])
        self.qk_nope_head_dim = int(hf["qk_nope_head_dim"])
        self.qk_rope_head_dim = int(hf["qk_rope_head_dim"])
        self.v_head_dim = int(hf["v_head_dim"])
        self.qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim

    def kv_spec(self) -> KVLayerSpec:
        return KVLayerSpec(((self.kv_lora_rank + self.qk_rope_head_dim,),))


class DeepseekMLA(nn.Module):
    def __init__(self, config: ModelConfig, numerics: Numerics, layer_idx: int, rope: RopeTable) -> None:
        super().__init__()
        d = MLADims(config)
        self.d = d
        self.layer_idx = layer_idx  # index into ForwardContext.kv_caches
        self.rope = rope
        self.numerics = numerics
        self.interleaved = bool(config.hf.get("rope_interleave", True))
        bias = bool(config.hf.get("attention_bias", False))
        hidden, heads = config.hidden_size, d.num_heads
        if d.q_lora_rank is None:
            self.q_proj = Linear(hidden, heads * d.qk_head_dim, False, numerics)
        else:
            self.q_a_proj = Linear(hidden, d.q_lora_rank, bias, numerics)
            self.q_a_layernorm = RMSNorm(d.q_lora_rank, LATENT_NORM_EPS, numerics)
            self.q_b_proj = Linear(d.q_lora_rank, heads * d.qk_head_dim, False, numerics)
        self.kv_a_proj_with_mqa = Linear(hidden, d.kv_lora_rank + d.qk_rope_head_dim, bias, numerics)
        self.kv_a_layernorm = RMSNorm(d.kv_lora_rank, LATENT_NORM_EPS, numerics)
        self.kv_b_proj = Linear(
            d.kv_lora_rank, heads * (d.qk_nope_head_dim + d.v_head_dim), False, numerics, quantizable=False
        )  # absorbed into the query and output in float
        self.o_proj = Linear(heads * d.v_head_dim, hidden, bias, numerics)
        self.scale = mla_softmax_scale(d.qk_head_dim, config.rope_scaling)
        # Absorbed views of kv_b_proj, rebuilt by absorb_weights() after loading.
        self.register_buffer("w_uk", torch.empty(0), persistent=False)
        self.register_buffer("w_uv_t", torch.empty(0), persistent=False)
        # The same per-head weights as [N, K] rows, the layout the Triton matmul takes (CUDA path).
        self.register_buffer("w_uk_nk", torch.empty(0), persistent=False)
        self.register_buffer("w_uv_nk", torch.empty(0), persistent=False)

    def absorb_weights(self) -> None:
        """Split kv_b_proj into W_UK [H, nope, R] and W_UV^T [H, R, v] for the absorbed form."""
        d = self.d
        w = self.kv_b_proj.weight.data.view(d.num_heads, d.qk_nope_head_dim + d.v_head_dim, d.kv_lora_rank)
        self.w_uk = w[:, : d.qk_nope_head_dim].contiguous()
        self.w_uv_t = w[:, d.qk_nope_head_dim :].transpose(1, 2).contiguous()
        self.w_uk_nk = self.w_uk.transpose(1, 2).contiguous()
        self.w_uv_nk = w[:, d.qk_nope_head_dim :].contiguous()

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return ops.rope_interleaved(x, cos, sin) if self.interleaved else ops.rope_neox(x, cos, sin)

    def takes_fp8_input(self) -> bool:
        """The input feeds the query's first projection and kv_a_proj_with_mqa alone, so when both
        are FP8 they take it quantised once, by the norm before (layers.py)."""
        first = self.q_proj if self.d.q_lora_rank is None else self.q_a_proj
        return first.takes_fp8_input() and self.kv_a_proj_with_mqa.takes_fp8_input()

    def forward(
        self, x: torch.Tensor | Fp8Activation, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        """x [T, hidden], float or quantised (takes_fp8_input)."""
        d, bi = self.d, self.numerics.batch_invariant
        if d.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm.norm_for(self.q_a_proj(x), self.q_b_proj))
        t = q.shape[0]
        q = q.view(t, d.num_heads, d.qk_head_dim)
        q_nope, q_pe = q[..., : d.qk_nope_head_dim], q[..., d.qk_nope_head_dim :]
        kv = self.kv_a_proj_with_mqa(x)
        latent = self.kv_a_layernorm(kv[:, : d.kv_lora_rank])
        k_pe = kv[:, d.kv_lora_rank :].unsqueeze(1)  # one rotary key shared by all heads
        cos, sin = ctx.rope_rows(self.rope, positions)
        q_pe = self._rope(q_pe, cos, sin)
        k_pe = self._rope(k_pe, cos, sin).squeeze(1)

        # (cache,), or for an FP8 cache (cache, scales); see engine/kv_cache.py.
        cache, *scales = ctx.kv_caches[self.layer_idx]
        cache_scale = scales[0] if scales else None
        ops.store_kv(
            cache, torch.cat([latent, k_pe.to(latent.dtype)], dim=-1), ctx.attn.slot_mapping, cache_scale
        )
        q_latent = ops.mla_absorb_query(q_nope, self.w_uk, self.w_uk_nk, bi)
        o_latent = _paged_mla(q_latent, q_pe, cache, ctx, self.scale, bi, cache_scale)
        o = ops.mla_project_value(o_latent, self.w_uv_t, self.w_uv_nk, bi)
        return self.o_proj(o.reshape(t, d.num_heads * d.v_head_dim))


def _paged_mla(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    ctx: ForwardContext,
    scale: float,
    batch_invariant: bool,
    cache_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """ops.mla_paged_attention: the Triton kernel on CUDA (batch invariant by construction), the
    reference elsewhere."""
    a = ctx.attn
    # Device tensors feed the kernel (and CUDA graphs); the CPU reference loops over host lists.
    qsl, lens = (
        (a.query_start_loc, a.seq_lens) if q_latent.is_cuda else (a.query_start_loc_cpu, a.seq_lens_cpu)
    )
    return ops.mla_paged_attention(
        q_latent,
        q_pe,
        cache,
        qsl,
        lens,
        a.block_tables,
        scale,
        batch_invariant,
        max_seq_len=a.max_seq_len,
        cache_scale=cache_scale,
    )
