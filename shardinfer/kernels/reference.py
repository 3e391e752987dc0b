"""Plain-PyTorch reference ops: the CPU path, and the oracle every Triton kernel is tested against.

Batch invariance: with `batch_invariant=True` a row's result must not depend on which other rows
share the call. CPU GEMM libraries pick blockings by problem shape, so the same row can round
differently at M=1 and M=100. We therefore run every row-parallel matmul in fixed tiles of
ROW_TILE rows (the last one zero-padded): each tile is one GEMM of one fixed shape, and a row's
result is the same whichever tile or slot it lands in. Attention splits keys into fixed chunks of
KV_CHUNK absolute positions and merges them with an online softmax in chunk order, so a query's
result does not depend on how its request was chunked, batched or prefix-cached.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

ROW_TILE = 32
KV_CHUNK = 256


def _pad_rows(x: torch.Tensor, multiple: int) -> torch.Tensor:
    pad = (-x.shape[-2]) % multiple
    if pad == 0:
        return x
    return torch.cat([x, x.new_zeros(*x.shape[:-2], pad, x.shape[-1])], dim=-2)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, batch_invariant: bool = True
) -> torch.Tensor:
    """y = x @ weight.T + bias for x [..., K], weight [N, K]."""
    if not batch_invariant:
        return F.linear(x, weight, bias)
    lead = x.shape[:-1]
    flat = x.reshape(-1, x.shape[-1])
    m = flat.shape[0]
    if m == 0:
        return F.linear(x, weight, bias)
    tiles = _pad_rows(flat, ROW_TILE).view(-1, ROW_TILE, flat.shape[-1])
    out = torch.stack([F.linear(t, weight, bias) for t in tiles.unbind(0)]).view(-1, weight.shape[0])
    return out[:m].reshape(*lead, weight.shape[0])


def bmm_rows(a: torch.Tensor, b: torch.Tensor, batch_invariant: bool = True) -> torch.Tensor:
    """Batched a [H, M, K] @ b [H, K, N] with each output row independent of M."""
    if not batch_invariant:
        return torch.matmul(a, b)
    h, m, k = a.shape
    tiles = _pad_rows(a, ROW_TILE).view(h, -1, ROW_TILE, k)
    n_tiles = tiles.shape[1]
    # One fixed-shape [ROW_TILE, K] x [K, N] product per (head, tile); bmm over an explicit batch
    # is much faster on CPU than matmul's broadcasting path.
    rhs = b.unsqueeze(1).expand(h, n_tiles, k, b.shape[-1]).reshape(h * n_tiles, k, b.shape[-1])
    out = torch.bmm(tiles.reshape(h * n_tiles, ROW_TILE, k), rhs).view(h, -1, b.shape[-1])
    return out[:, :m]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in float32, cast back to x's dtype."""
    xf = x.float()
    var = xf.pow(2).mean(-1, keepdim=True)
    return (weight.float() * (xf * torch.rsqrt(var + eps))).to(x.dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): the pre-norm block's add-then-normalise."""
    if residual is not None:
        x = x + residual
    return rms_norm(x, weight, eps), x


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + exp(-x)), element by element.

    torch.sigmoid and F.silu on the CPU round an element differently in the vectorised body of
    a loop and in its scalar tail, so a value would depend on the tensor's size and the element's
    place in it. exp and IEEE division are the same in both, so this form is batch invariant.
    """
    return 1.0 / (1.0 + torch.exp(-x))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2I] = [gate | up] -> silu(gate) * up [..., I] (silu through `sigmoid` above)."""
    gate, up = x.chunk(2, dim=-1)
    return gate * sigmoid(gate) * up


def rope_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE. x [T, H, D_rot], cos/sin [T, D_rot // 2] (float32)."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved-pair RoPE (DeepSeek's layout): pairs (x[2i], x[2i+1]). x [T, H, D_rot]."""
    xf = x.float()
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2).to(x.dtype)


def store_kv(
    cache: torch.Tensor, values: torch.Tensor, slot_mapping: torch.Tensor, scale: torch.Tensor | None = None
) -> None:
    """Write values [T, ...] into cache [num_blocks, block_size, ...] at flat slots [T].

    With `scale` (an FP8 cache, see reference_fp8.quantize_groups) each token's values are
    quantised in groups of 128 along the last dim and their scales go to scale [num_blocks,
    block_size, ..., groups] at the same slots.
    """
    flat = cache.view(-1, *cache.shape[2:])
    keep = slot_mapping >= 0  # a negative slot (SKIP_SLOT, as kv_store.py) is not written
    if not bool(keep.all()):
        slot_mapping, values = slot_mapping[keep], values[keep]
    if scale is None:
        flat.index_copy_(0, slot_mapping, values.to(cache.dtype))
        return
    from shardinfer.kernels.reference_fp8 import quantize_groups

    q, s = quantize_groups(values)
    # Through byte views: the CPU has no float8 index_copy.
    flat.view(torch.uint8).index_copy_(0, slot_mapping, q.view(torch.uint8))
    scale.view(-1, *scale.shape[2:]).index_copy_(0, slot_mapping, s)


def cache_rows(
    cache: torch.Tensor, blocks: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """cache[blocks] in dtype; an FP8 cache dequantised with its scales (what the kernels read)."""
    if scale is None:
        return cache[blocks]
    from shardinfer.kernels.reference_fp8 import dequantize_groups

    return dequantize_groups(cache.view(torch.uint8)[blocks].view(cache.dtype), scale[blocks]).to(dtype)


def attend_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    seq_len: int,
    scale: float,
    sliding_window: int | None = None,
    batch_invariant: bool = True,
) -> torch.Tensor:
    """Causal attention of one sequence with split-KV by fixed chunks.

    q [Hk, M, D] (M query rows per KV head; for GQA the group's heads are stacked into M),
    k [Hk, S, D], v [Hk, S, Dv] with S >= seq_len, q_pos [M] absolute positions of the rows.
    Returns [Hk, M, Dv] in float32. Key j is visible to a row at position p iff
    j <= p, j < seq_len and (no window or j > p - window).
    """
    hk, m, _ = q.shape
    dv = v.shape[-1]
    qf = q.float() * scale
    m_run = torch.full((hk, m, 1), float("-inf"))
    l_run = torch.zeros(hk, m, 1)
    acc = torch.zeros(hk, m, dv)
    max_pos = int(q_pos.max()) if m else 0
    lo_pos = q_pos.view(1, m, 1)
    for start in range(0, min(seq_len, max_pos + 1), KV_CHUNK):
        stop = start + KV_CHUNK
        kc = k[:, start:stop].float()
        vc = v[:, start:stop].float()
        if kc.shape[1] < KV_CHUNK:  # keep every chunk the same shape
            pad = KV_CHUNK - kc.shape[1]
            kc = torch.cat([kc, kc.new_zeros(hk, pad, kc.shape[-1])], dim=1)
            vc = torch.cat([vc, vc.new_zeros(hk, pad, dv)], dim=1)
        key_pos = torch.arange(start, stop).view(1, 1, -1)
        visible = (key_pos <= lo_pos) & (key_pos < seq_len)
        if sliding_window is not None:
            visible &= key_pos > lo_pos - sliding_window
        scores = bmm_rows(qf, kc.transpose(1, 2), batch_invariant)
        scores = scores.masked_fill(~visible, float("-inf"))
        m_new = torch.maximum(m_run, scores.amax(-1, keepdim=True))
        # Rows with nothing visible yet keep m = -inf; guard the exp so they stay exactly zero.
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m_run - m_safe)
        p = torch.exp(scores - m_safe)
        l_run = l_run * alpha + p.sum(-1, keepdim=True)
        acc = acc * alpha + bmm_rows(p, vc, batch_invariant)
        m_run = m_new
    return acc / l_run.clamp_min(1e-30)


def paged_sequences(
    query_start_loc: list[int], seq_lens: list[int], block_tables: torch.Tensor, block_size: int
) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """For each request with new tokens in a varlen batch: (first row, end row, its cache block ids,
    the absolute positions of its new tokens). Its new tokens are the last (end - first) of its
    seq_len positions."""
    for i, seq_len in enumerate(seq_lens):
        qs, qe = query_start_loc[i], query_start_loc[i + 1]
        if qe == qs:
            continue
        blocks = block_tables[i, : -(-seq_len // block_size)].long()
        yield qs, qe, blocks, torch.arange(seq_len - (qe - qs), seq_len)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: list[int],
    seq_lens: list[int],
    block_tables: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    batch_invariant: bool = True,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Varlen causal GQA attention over a paged KV cache (after this step's KV was stored).

    q [T, Hq, D]; k_cache/v_cache [num_blocks, block_size, Hk, D]; query_start_loc [B + 1] and
    seq_lens [B] as host lists; block_tables [B, max_blocks]. Returns [T, Hq, Dv] in q's dtype.
    An FP8 cache comes with k_scale/v_scale [num_blocks, block_size, Hk, groups] (store_kv).
    """
    t, hq, d = q.shape
    block_size, hk, dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[-1]
    group = hq // hk
    out = q.new_empty(t, hq, dv)
    for qs, qe, blocks, positions in paged_sequences(query_start_loc, seq_lens, block_tables, block_size):
        k = cache_rows(k_cache, blocks, k_scale, q.dtype).reshape(-1, hk, d).transpose(0, 1)  # [Hk, S, D]
        v = cache_rows(v_cache, blocks, v_scale, q.dtype).reshape(-1, hk, dv).transpose(0, 1)
        lq = qe - qs
        # [Lq, Hq, D] -> [Hk, Lq * group, D]: a KV head's query heads become extra rows.
        qi = q[qs:qe].view(lq, hk, group, d).permute(1, 0, 2, 3).reshape(hk, lq * group, d)
        seq_len = int(positions[-1]) + 1
        o = attend_chunked(
            qi, k, v, positions.repeat_interleave(group), seq_len, scale, sliding_window, batch_invariant
        )
        out[qs:qe] = o.view(hk, lq, group, dv).permute(1, 0, 2, 3).reshape(lq, hq, dv).to(q.dtype)
    return out
