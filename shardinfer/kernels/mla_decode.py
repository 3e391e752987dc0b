"""Multi-head latent attention (MLA) over the paged latent cache, in the weight-absorbed form.

    q_latent [T, H, R]   q_nope folded through W_UK: one R-wide (512) query per head
    q_pe     [T, H, Dr]  roped part of the query (64)
    cache    [num_blocks, block_size, R + Dr]: per token [latent c | roped shared key k_pe]
    out      [T, H, R]   sum_j p_hj c_j (the caller applies W_UV afterwards)

    score_hj = (q_latent_h . c_j + q_pe_h . k_pe_j) * scale

This is multi-query attention with a single 576-wide key head whose first R columns are also
the value, so it runs on paged_attention's two-phase, fixed-chunk machinery (same causal
varlen semantics, same batch invariance argument): each key tile is loaded once and used both
as K (two dots, latent and rope) and, transposed in registers, as V. A tile holds BLOCK_M
(token, head) rows; with 16 heads (the moe-16b shape) a decode token fills one tile exactly.
Semantics = reference_mla.mla_paged_attention; only rounding differs.
"""

from __future__ import annotations

import torch

from shardinfer.kernels import paged_attention as pa
from shardinfer.kernels._common import FLOAT_DTYPES, check_same_device, check_tensor, fail, next_pow2

MLA_BLOCK_M = 16
MLA_BLOCK_N = 32


def mla_paged_attention(q_latent: torch.Tensor, q_pe: torch.Tensor, cache: torch.Tensor,
                        query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                        scale: float, max_seq_len: int | None = None, kv_chunk: int = pa.KV_CHUNK,
                        block_m: int = MLA_BLOCK_M, block_n: int = MLA_BLOCK_N, num_warps: int = 8,
                        num_stages: int = 2) -> torch.Tensor:
    """Causal absorbed MLA of a flat varlen batch; returns the latent output [T, H, R] in q's dtype.

    q_latent [T, H, R] and q_pe [T, H, Dr] of one float dtype, last dims contiguous; cache
    [num_blocks, block_size, R + Dr] contiguous, same dtype; query_start_loc [B + 1], seq_lens [B],
    block_tables [B, max_blocks] int32 on the same device. R <= 1024 and Dr must be powers of two
    (512 and 64 for DeepSeek-V3). Tile config and kv_chunk fix the rounding: keep them constant.
    """
    check_tensor("q_latent", q_latent, dtypes=FLOAT_DTYPES, ndim=3, last_dim_contiguous=True)
    check_tensor("q_pe", q_pe, dtypes=(q_latent.dtype,), ndim=3, last_dim_contiguous=True)
    check_tensor("cache", cache, dtypes=(q_latent.dtype,), ndim=3, contiguous=True)
    t, h, r = q_latent.shape
    dr = q_pe.shape[-1]
    if tuple(q_pe.shape[:2]) != (t, h):
        raise fail("q_pe.shape", tuple(q_pe.shape), f"need ({t}, {h}, Dr) like q_latent")
    if cache.shape[-1] != r + dr:
        raise fail("cache.shape[-1]", cache.shape[-1], f"need R + Dr = {r + dr}")
    if r > 1024 or next_pow2(r) != r or dr < 1 or next_pow2(dr) != dr:
        raise fail("(R, Dr)", (r, dr), "need powers of two with R <= 1024")
    if block_m not in (16, 32, 64):
        raise fail("block_m", block_m, "need 16, 32 or 64")
    empty_k = cache.view(cache.shape[0], cache.shape[1], 1, cache.shape[2])
    # Reuse the dense launcher's checks on the index tensors (one KV head, D = R + Dr).
    pa._check(torch.empty(0, h, r + dr, dtype=q_latent.dtype, device=q_latent.device), empty_k, empty_k,
              query_start_loc, seq_lens, block_tables, None, kv_chunk, max_seq_len)
    check_same_device(q_latent=q_latent, q_pe=q_pe, cache=cache)
    strides = (cache.stride(0), cache.stride(1), 0)
    return pa.launch(q_latent, q_pe, cache, cache, strides, strides, 1, r, r, query_start_loc, seq_lens,
                     block_tables, scale, None, max_seq_len, kv_chunk, block_m, block_n, num_warps, num_stages)
