"""Plain-PyTorch reference of multi-head latent attention (MLA) in the weight-absorbed form.

The paged cache holds, per token, one row [kv_lora_rank + qk_rope_head_dim]: the normalised KV
latent c followed by the roped shared key k_pe. Per-head keys and values are never materialised:

    k_h = [W_UK_h c ; k_pe]        v_h = W_UV_h c
    q_h . k_h = (W_UK_h^T q_nope_h) . c + q_pe_h . k_pe       (absorb W_UK into the query)
    o_h = W_UV_h (sum_j p_hj c_j)                              (apply W_UV after attention)

so attention is multi-query attention with one 576-wide key head (512 + 64 at full size) whose
first kv_lora_rank columns double as the value. We run it through `reference.attend_chunked`
(one KV head, query rows = positions x heads): split-KV by fixed chunks of absolute positions,
so a query's result does not depend on its batch, on how its request was chunked, or on whether
its prefix came from the prefix cache. Prefill uses the same absorbed form for the same reason.
"""

from __future__ import annotations

import torch

from shardinfer.kernels import reference as ops


def mla_absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor, batch_invariant: bool = True) -> torch.Tensor:
    """q_nope [T, H, Dn] x w_uk [H, Dn, R] -> per-head latent queries [T, H, R]."""
    out = ops.bmm_rows(q_nope.transpose(0, 1), w_uk, batch_invariant)  # [H, T, R]
    return out.transpose(0, 1)


def mla_project_value(
    o_latent: torch.Tensor, w_uv_t: torch.Tensor, batch_invariant: bool = True
) -> torch.Tensor:
    """o_latent [T, H, R] x w_uv_t [H, R, Dv] (W_UV transposed per head) -> [T, H, Dv]."""
    out = ops.bmm_rows(o_latent.transpose(0, 1), w_uv_t, batch_invariant)  # [H, T, Dv]
    return out.transpose(0, 1)


def mla_paged_attention(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    query_start_loc: list[int],
    seq_lens: list[int],
    block_tables: torch.Tensor,
    scale: float,
    batch_invariant: bool = True,
    cache_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Varlen causal absorbed MLA over the paged latent cache (this step's rows already stored).

    q_latent [T, H, R], q_pe [T, H, Dr]; cache [num_blocks, block_size, R + Dr]; query_start_loc
    [B + 1] and seq_lens [B] host lists; block_tables [B, max_blocks]. The new tokens of request i
    are the last (query_start_loc[i+1] - query_start_loc[i]) of its seq_lens[i] positions.
    Returns the attention-weighted latent [T, H, R] in q_latent's dtype. An FP8 cache comes with
    cache_scale [num_blocks, block_size, groups of 128 of R + Dr] (reference.store_kv).
    """
    t, heads, rank = q_latent.shape
    block_size, width = cache.shape[1], cache.shape[2]
    q = torch.cat([q_latent, q_pe.to(q_latent.dtype)], dim=-1)  # [T, H, R + Dr]
    out = q_latent.new_empty(t, heads, rank)
    for qs, qe, blocks, positions in ops.paged_sequences(query_start_loc, seq_lens, block_tables, block_size):
        rows = ops.cache_rows(cache, blocks, cache_scale, q_latent.dtype).reshape(
            1, -1, width
        )  # [1, S, R + Dr]
        lq = qe - qs
        # Every head of every new position becomes one query row of the single latent KV head.
        qi = q[qs:qe].reshape(1, lq * heads, width)
        o = ops.attend_chunked(
            qi,
            rows,
            rows[..., :rank],
            positions.repeat_interleave(heads),
            int(positions[-1]) + 1,
            scale,
            batch_invariant=batch_invariant,
        )
        out[qs:qe] = o.view(lq, heads, rank).to(q_latent.dtype)
    return out
