"""The ops the engine calls: the Triton kernel for CUDA tensors, the PyTorch reference otherwise.

Signatures follow reference.py. Kernel modules are imported on first CUDA use only, so a CPU
run never imports Triton. bmm_rows has no Triton kernel yet and always uses the reference
(cuBLAS under torch, made batch invariant by the reference's fixed row tiles).
"""

from __future__ import annotations

import functools

import torch

from shardinfer.kernels import reference, reference_fp8
from shardinfer.kernels._common import check_same_device, gpu_name
from shardinfer.kernels.reference import bmm_rows
from shardinfer.kernels.reference_fp8 import Fp8Activation
from shardinfer.kernels.top_logprob import TopLogprob, fill_reference

__all__ = [
    "Fp8Activation",
    "bmm_rows",
    "fused_add_rms_norm",
    "fused_add_rms_norm_fp8",
    "grouped_topk",
    "heads_matmul",
    "linear",
    "linear_fp8",
    "linear_fp8_prequantized",
    "mla_absorb_query",
    "mla_paged_attention",
    "mla_project_value",
    "moe_experts",
    "paged_attention",
    "rms_norm",
    "rms_norm_fp8",
    "rope_interleaved",
    "rope_neox",
    "sample",
    "sample_with_logprobs",
    "silu_and_mul",
    "silu_and_mul_fp8",
    "store_kv",
    "triton_available",
    "warm_up_matmuls",
]


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _use_triton(t: torch.Tensor) -> bool:
    return t.is_cuda and triton_available()


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    batch_invariant: bool = True,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """reference.linear (y = x @ weight.T + bias for x [..., K], weight [N, K]).

    On CUDA with batch_invariant, the fixed-tile Triton matmul (kernels/matmul.py) on x as
    [M, K] (the reference's row tiles would launch M / 32 GEMMs); otherwise the reference, which
    without batch invariance is plain F.linear (cuBLAS picks its fastest, batch-dependent plan).
    out_dtype=torch.float32 gives the result in x's dtype converted to float32, the Triton matmul
    writing it so in one pass.
    """
    if batch_invariant and _use_triton(x):
        from shardinfer.kernels.matmul import linear_batch_invariant

        flat = x.reshape(-1, x.shape[-1])
        y = linear_batch_invariant(flat, weight, bias, out_dtype)
        return y.view(*x.shape[:-1], weight.shape[0])
    y = reference.linear(x, weight, bias, batch_invariant)
    return y if out_dtype is None else y.to(out_dtype)


def linear_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    batch_invariant: bool = True,
) -> torch.Tensor:
    """reference_fp8.linear_fp8 (x [..., K] quantised per 1x128 group, weight [N, K] float8_e4m3fn
    with 128x128 block scales [ceil(N/128), ceil(K/128)] or per-channel scales [N]). On CUDA the
    Triton FP8 GEMM (kernels/fp8_matmul.py), batch invariant whatever `batch_invariant` says;
    elsewhere dequantise-then-matmul in float32.
    """
    if _use_triton(x):
        from shardinfer.kernels import fp8_matmul

        flat = x.reshape(-1, x.shape[-1])
        return fp8_matmul.linear_fp8(flat, weight, weight_scale, bias).view(*x.shape[:-1], weight.shape[0])
    return reference_fp8.linear_fp8(x, weight, weight_scale, bias, batch_invariant)


def linear_fp8_prequantized(
    x: Fp8Activation,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    batch_invariant: bool = True,
) -> torch.Tensor:
    """linear_fp8 on an input quantised already (by a fused norm or activation): y [..., N] in
    x.dtype, the same bits linear_fp8 gives for the float tensor x was quantised from. On CUDA the
    FP8 GEMM alone, at the tiling linear_fp8 would choose; elsewhere reference_fp8's
    dequantise-then-matmul."""
    if _use_triton(x.q):
        from shardinfer.kernels import fp8_matmul

        fp8_matmul.check_weight(weight, weight_scale, bias, x.q.shape[-1], x.dtype)
        check_same_device(x=x.q, x_scale=x.scale, weight=weight, weight_scale=weight_scale, bias=bias)
        n, k = weight.shape
        xq, xs = x.q.view(-1, k), x.scale.view(-1, x.scale.shape[-1])
        config = fp8_matmul.tile_config(n, k, xq.shape[0], gpu_name(x.q.device))
        y = fp8_matmul.linear_fp8_quantized(xq, xs, weight, weight_scale, bias, x.dtype, config)
        return y.view(*x.q.shape[:-1], n)
    return reference_fp8.linear_fp8_prequantized(x, weight, weight_scale, bias, batch_invariant)


def warm_up_matmuls(weights: list[torch.Tensor], logits_weights: tuple[torch.Tensor, ...] = ()) -> int:
    """Compile the batch-invariant matmul's large-batch tilings for these weights now, rather than
    in the first long prefill step (kernels/matmul.py), and for the LM heads' weights their float32
    output's too; returns the number of tilings compiled."""
    from shardinfer.kernels.matmul import warm_up

    return warm_up(weights, logits_weights)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _use_triton(x):
        from shardinfer.kernels import rmsnorm

        return rmsnorm.rms_norm(x, weight, eps)
    return reference.rms_norm(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if _use_triton(x):
        from shardinfer.kernels import rmsnorm

        return rmsnorm.fused_add_rms_norm(x, residual, weight, eps)
    return reference.fused_add_rms_norm(x, residual, weight, eps)


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float) -> Fp8Activation:
    """rms_norm(x) as an FP8 linear's quantised input: on CUDA one kernel (rmsnorm.rms_norm_fp8),
    the bits of quantising rms_norm's output; elsewhere that composition with the references."""
    if _use_triton(x):
        from shardinfer.kernels import rmsnorm

        return Fp8Activation(*rmsnorm.rms_norm_fp8(x, weight, eps), x.dtype)
    return Fp8Activation(*reference_fp8.quantize_groups(reference.rms_norm(x, weight, eps)), x.dtype)


def fused_add_rms_norm_fp8(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[Fp8Activation, torch.Tensor]:
    """fused_add_rms_norm with the normalised output quantised as rms_norm_fp8 does; the sum (the
    residual stream) is returned in x's dtype as there."""
    if _use_triton(x):
        from shardinfer.kernels import rmsnorm

        q, s, summed = rmsnorm.fused_add_rms_norm_fp8(x, residual, weight, eps)
        return Fp8Activation(q, s, x.dtype), summed
    out, summed = reference.fused_add_rms_norm(x, residual, weight, eps)
    return Fp8Activation(*reference_fp8.quantize_groups(out), x.dtype), summed


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if _use_triton(x):
        from shardinfer.kernels import activation

        return activation.silu_and_mul(x)
    return reference.silu_and_mul(x)


def silu_and_mul_fp8(x: torch.Tensor) -> Fp8Activation:
    """silu_and_mul(x) as an FP8 linear's quantised input (as rms_norm_fp8): on CUDA one kernel
    (activation.silu_and_mul_fp8), elsewhere the composition with the references."""
    if _use_triton(x):
        from shardinfer.kernels import activation

        return Fp8Activation(*activation.silu_and_mul_fp8(x), x.dtype)
    return Fp8Activation(*reference_fp8.quantize_groups(reference.silu_and_mul(x)), x.dtype)


def rope_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    if _use_triton(x):
        from shardinfer.kernels import rope

        return rope.rope_neox(x, cos, sin)
    return reference.rope_neox(x, cos, sin)


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    if _use_triton(x):
        from shardinfer.kernels import rope

        return rope.rope_interleaved(x, cos, sin)
    return reference.rope_interleaved(x, cos, sin)


def store_kv(
    cache: torch.Tensor, values: torch.Tensor, slot_mapping: torch.Tensor, scale: torch.Tensor | None = None
) -> None:
    """reference.store_kv; `scale` beside an FP8 cache quantises each token's values on the way in.
    On CUDA, slots of -1 are skipped; the reference needs every slot valid."""
    if _use_triton(cache):
        from shardinfer.kernels import kv_store

        if scale is not None:
            kv_store.store_kv_fp8(cache, scale, values, slot_mapping)
        else:
            kv_store.store_kv(cache, values, slot_mapping)
        return
    reference.store_kv(cache, values, slot_mapping, scale)


def _as_int32(v: list[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v.to(device=device, dtype=torch.int32)
    return torch.tensor(v, dtype=torch.int32, device=device)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: list[int] | torch.Tensor,
    seq_lens: list[int] | torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    batch_invariant: bool = True,
    max_seq_len: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    prompt_lens: torch.Tensor | None = None,
    generated_only: bool = False,
) -> torch.Tensor:
    """reference.paged_attention; pass device int32 tensors (and max_seq_len) on CUDA to avoid copies.

    The Triton kernel is batch invariant whatever `batch_invariant` says. An FP8 cache comes with
    its scales (k_scale, v_scale). prompt_lens [B] (each request's prompt length, a device
    tensor): on CUDA, lets generated tokens' rows take their own kernel where it applies
    (kernels/paged_attention_fma.py); the reference ignores it. generated_only: every row is a
    generated token's (AttentionMetadata.generated_only), so only that kernel need run.
    """
    if _use_triton(q):
        from shardinfer.kernels import paged_attention as pa

        if max_seq_len is None and not isinstance(seq_lens, torch.Tensor):
            max_seq_len = max(seq_lens, default=0)
        return pa.paged_attention(
            q,
            k_cache,
            v_cache,
            _as_int32(query_start_loc, q.device),
            _as_int32(seq_lens, q.device),
            block_tables.to(torch.int32),
            scale,
            sliding_window,
            max_seq_len=max_seq_len,
            k_scale=k_scale,
            v_scale=v_scale,
            prompt_lens=None if prompt_lens is None else _as_int32(prompt_lens, q.device),
            generated_only=generated_only,
        )
    qsl = query_start_loc.tolist() if isinstance(query_start_loc, torch.Tensor) else query_start_loc
    sl = seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else seq_lens
    return reference.paged_attention(
        q, k_cache, v_cache, qsl, sl, block_tables, scale, sliding_window, batch_invariant, k_scale, v_scale
    )


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """Filtered Gumbel-max sampling (see kernels/sampling.py). On CUDA the kernel draws the noise
    itself; elsewhere pass `noise` [B, V] from the engine's gumbel_noise(seeds, positions, V)."""
    if _use_triton(logits):
        from shardinfer.kernels import sampling

        return sampling.sample(logits, temperature, top_k, top_p, min_p, seeds, positions)
    if noise is None:
        raise ValueError(
            "sample: noise is None on a non-CUDA device; pass noise [B, V] from "
            "engine.sampling_noise.gumbel_noise(seeds, positions, vocab_size)"
        )
    from shardinfer.kernels import reference_sampling

    return reference_sampling.sample(logits, temperature, top_k, top_p, min_p, noise)


def sample_with_logprobs(
    raw: torch.Tensor,
    x: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    filtered: bool,
    noise: torch.Tensor | None = None,
    top: TopLogprob | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token [B] int64, logprob [B] float32, lse [B] float32): `sample` on x, and the chosen
    token's log-probability under the RAW logits (raw[token] - logsumexp(raw), lse per row).
    `top`, if given, receives each row's top-1 token and logprob under the raw logits
    (kernels/top_logprob.py).

    filtered: some row has top_k / top_p / min_p. On CUDA a step without filters samples with
    the row-split kernel (kernels/sampling_split.py), which picks the token the filtered kernel
    would; with filters the filtered kernel chooses and the split kernel only adds the logprobs.
    """
    if _use_triton(x):
        from shardinfer.kernels import sampling_split

        if not filtered:
            return sampling_split.sample(raw, x, temperature, seeds, positions, top=top)
        tokens = sample(x, temperature, top_k, top_p, min_p, seeds, positions)
        return (tokens, *sampling_split.logprobs_of(raw, tokens, top=top))
    tokens = sample(x, temperature, top_k, top_p, min_p, seeds, positions, noise).to(x.device)
    lse = torch.logsumexp(raw, dim=-1)
    if top is not None:
        fill_reference(top, raw, lse)
    return tokens, raw.gather(1, tokens.view(-1, 1)).view(-1) - lse, lse


def mla_paged_attention(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    query_start_loc: list[int] | torch.Tensor,
    seq_lens: list[int] | torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    batch_invariant: bool = True,
    max_seq_len: int | None = None,
    cache_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """reference_mla.mla_paged_attention; pass device int32 tensors (and max_seq_len) on CUDA to avoid copies.

    On CUDA the absorbed-MLA kernel (always batch invariant), given q_pe made contiguous so that
    every call sees the same strides.
    """
    if _use_triton(q_latent):
        from shardinfer.kernels import mla_decode

        if max_seq_len is None and not isinstance(seq_lens, torch.Tensor):
            max_seq_len = max(seq_lens, default=0)
        return mla_decode.mla_paged_attention(
            q_latent,
            q_pe.contiguous(),
            cache,
            _as_int32(query_start_loc, q_latent.device),
            _as_int32(seq_lens, q_latent.device),
            block_tables.to(torch.int32),
            scale,
            max_seq_len=max_seq_len,
            cache_scale=cache_scale,
        )
    from shardinfer.kernels import reference_mla

    qsl = query_start_loc.tolist() if isinstance(query_start_loc, torch.Tensor) else query_start_loc
    sl = seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else seq_lens
    return reference_mla.mla_paged_attention(
        q_latent, q_pe, cache, qsl, sl, block_tables, scale, batch_invariant, cache_scale
    )


def moe_experts(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    batch_invariant: bool = True,
    w_gate_up_scale: torch.Tensor | None = None,
    w_down_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """reference_moe.moe_experts; on CUDA the fused grouped-GEMM kernel (always batch invariant).
    FP8 experts come with their block scales (reference_moe.moe_experts_fp8, kernels/fp8_moe.py)."""
    if w_gate_up_scale is not None and w_down_scale is not None:
        if _use_triton(x):
            from shardinfer.kernels import fp8_moe

            return fp8_moe.fused_moe_fp8(
                x.contiguous(),
                topk_ids,
                topk_weights.float().contiguous(),
                w_gate_up,
                w_gate_up_scale,
                w_down,
                w_down_scale,
            )
        from shardinfer.kernels import reference_moe

        return reference_moe.moe_experts_fp8(
            x, topk_ids, topk_weights, w_gate_up, w_gate_up_scale, w_down, w_down_scale, batch_invariant
        )
    if _use_triton(x):
        from shardinfer.kernels import moe

        return moe.fused_moe(x.contiguous(), topk_ids, topk_weights.float().contiguous(), w_gate_up, w_down)
    from shardinfer.kernels import reference_moe

    return reference_moe.moe_experts(x, topk_ids, topk_weights, w_gate_up, w_down, batch_invariant)


def grouped_topk(
    router_logits: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    top_k: int,
    n_group: int = 1,
    topk_group: int = 1,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    scoring_func: str = "sigmoid",
) -> tuple[torch.Tensor, torch.Tensor]:
    """reference_moe.grouped_topk (DeepSeek expert routing); on CUDA the Triton routing kernel
    (kernels/moe_routing.py)."""
    if _use_triton(router_logits):
        from shardinfer.kernels import moe_routing

        return moe_routing.grouped_topk(
            router_logits,
            e_score_correction_bias,
            top_k,
            n_group,
            topk_group,
            renormalize,
            routed_scaling_factor,
            scoring_func,
        )
    from shardinfer.kernels import reference_moe

    return reference_moe.grouped_topk(
        router_logits,
        e_score_correction_bias,
        top_k,
        n_group,
        topk_group,
        renormalize,
        routed_scaling_factor,
        scoring_func,
    )


def heads_matmul(x: torch.Tensor, w: torch.Tensor, w_nk: torch.Tensor, batch_invariant: bool) -> torch.Tensor:
    """Per-head products x[:, h] @ w[h]: x [T, H, K], w [H, K, N], w_nk = w^T per head [H, N, K] -> [T, H, N].

    Batch invariant: the per-head Triton matmul (kernels/heads_matmul.py), one launch for all
    heads that reads x through its strides and each head's weight once (the CPU reference's row
    tiles would copy the weights once per tile). Otherwise cuBLAS's batched GEMM on w.
    """
    if not batch_invariant:
        return torch.bmm(x.transpose(0, 1), w).transpose(0, 1)
    from shardinfer.kernels.heads_matmul import heads_matmul as heads_matmul_kernel

    return heads_matmul_kernel(x, w_nk)


def mla_absorb_query(
    q_nope: torch.Tensor, w_uk: torch.Tensor, w_uk_nk: torch.Tensor, batch_invariant: bool = True
) -> torch.Tensor:
    """reference_mla.mla_absorb_query (q_nope [T, H, Dn] x w_uk [H, Dn, R] -> [T, H, R]); on CUDA
    heads_matmul, given w_uk_nk = w_uk^T per head [H, R, Dn]."""
    if q_nope.is_cuda:
        return heads_matmul(q_nope, w_uk, w_uk_nk, batch_invariant)
    from shardinfer.kernels import reference_mla

    return reference_mla.mla_absorb_query(q_nope, w_uk, batch_invariant)


def mla_project_value(
    o_latent: torch.Tensor, w_uv_t: torch.Tensor, w_uv_nk: torch.Tensor, batch_invariant: bool = True
) -> torch.Tensor:
    """reference_mla.mla_project_value (o_latent [T, H, R] x w_uv_t [H, R, Dv] -> [T, H, Dv]); on
    CUDA heads_matmul, given w_uv_nk = w_uv_t^T per head [H, Dv, R]."""
    if o_latent.is_cuda:
        return heads_matmul(o_latent, w_uv_t, w_uv_nk, batch_invariant)
    from shardinfer.kernels import reference_mla

    return reference_mla.mla_project_value(o_latent, w_uv_t, batch_invariant)


def qkv_prologue(
    qkv: torch.Tensor,
    n_q: int,
    n_kv: int,
    head_dim: int,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    eps: float,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    fuse: bool = True,
) -> torch.Tensor:
    """A dense attention layer's head norms (q_norm / k_norm, or neither), rotate-half RoPE and K/V
    cache stores from its QKV projection [T, (n_q + 2 n_kv) * head_dim]; returns q [T, n_q, head_dim].
    On CUDA one launch (kernels/qkv_prologue.py, the unfused ops' bits, for the head dims the engine
    fuses); elsewhere, or with fuse=False, the ops one by one."""
    if fuse and _use_triton(qkv):
        from shardinfer.kernels import qkv_prologue as fused

        if fused.fusable(head_dim):
            return fused.qkv_prologue(
                qkv,
                n_q,
                n_kv,
                head_dim,
                q_norm,
                k_norm,
                eps,
                cos_table,
                sin_table,
                positions,
                k_cache,
                v_cache,
                slot_mapping,
                k_scale,
                v_scale,
            )
    t = qkv.shape[0]
    q = qkv[:, : n_q * head_dim].reshape(t, n_q, head_dim)
    k = qkv[:, n_q * head_dim : (n_q + n_kv) * head_dim].reshape(t, n_kv, head_dim)
    v = qkv[:, (n_q + n_kv) * head_dim :].reshape(t, n_kv, head_dim)
    if q_norm is not None and k_norm is not None:
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    cos, sin = cos_table[positions], sin_table[positions]
    q, k = rope_neox(q, cos, sin), rope_neox(k, cos, sin)
    store_kv(k_cache, k, slot_mapping, k_scale)
    store_kv(v_cache, v, slot_mapping, v_scale)
    return q
