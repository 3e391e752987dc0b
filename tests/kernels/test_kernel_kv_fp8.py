"""FP8 KV cache: the quantising store (kernel and reference) against float64 rounding, and both attention
kernels reading an FP8 cache against themselves on a cache holding the dequantised values.

The kernels dequantise each tile in registers into the query's dtype, exactly (3-bit mantissas
times power-of-two scales), or apply the power-of-two scales to the scores and probabilities, so an
FP8 cache must give bit for bit what the same kernel gives on the dequantised cache; and the reference on an FP8 cache equals the reference on that cache. Batch
invariance and prefix caching then carry over from the kernels' own tests (test_kernel_paged_attention,
test_kernel_mla), and an explicit row check guards the new code path.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from kernel_checks import TOL, PagedBatch, e4m3_round, pow2_scales64, rel_err

from shardinfer.kernels import kv_store, mla_decode, paged_attention, reference, reference_mla
from shardinfer.kernels.reference_fp8 import dequantize_groups, quantize_groups

if not torch.cuda.is_available():
    kv_store = importlib.reload(kv_store)

FP8 = torch.float8_e4m3fn


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.uint8)


@pytest.mark.parametrize("entry", [(2, 16), (288,), (1, 200)])  # a head; MLA-like rows of 3 groups; a tail
def test_quantising_store_rounds_to_e4m3_and_skips_minus_one(
    device: torch.device, entry: tuple[int, ...]
) -> None:
    """Kernel and reference: the stored slots hold each token's values / its groups' power-of-two
    scales rounded to e4m3 (float64 oracle); slot -1 and every other slot are untouched."""
    gen = torch.Generator().manual_seed(0)
    groups = -(-entry[-1] // 128)
    cache = torch.randn(5, 4, *entry, generator=gen).to(FP8)
    scale = torch.rand(5, 4, *entry[:-1], groups, generator=gen)
    values = (torch.randn(6, *entry, generator=gen) * 3).to(torch.bfloat16)
    slots = torch.tensor([7, 0, -1, 19, 3, -1], dtype=torch.int64)
    keep = slots >= 0
    padded = torch.nn.functional.pad(values.double(), (0, groups * 128 - entry[-1])).view(
        6, *entry[:-1], groups, 128
    )
    want_s = pow2_scales64(padded.abs().amax(-1))
    want_q = e4m3_round(padded / want_s[..., None]).view(6, *entry[:-1], -1)[..., : entry[-1]]
    ref_cache, ref_scale = cache.clone(), scale.clone()
    reference.store_kv(ref_cache, values[keep], slots[keep], ref_scale)
    got_cache, got_scale = cache.clone().to(device), scale.clone().to(device)
    kv_store.store_kv_fp8(got_cache, got_scale, values.to(device), slots.to(device))
    untouched = torch.ones(20, dtype=torch.bool)
    untouched[slots[keep]] = False
    for c, s in ((got_cache.cpu(), got_scale.cpu()), (ref_cache, ref_scale)):
        flat_c, flat_s = c.view(20, *entry), s.view(20, *entry[:-1], groups)
        assert torch.equal(flat_c[slots[keep]].double(), want_q[keep])
        assert torch.equal(flat_s[slots[keep]].double(), want_s[keep])
        assert torch.equal(_bits(flat_c[untouched]), _bits(cache.view(20, *entry)[untouched]))
        assert torch.equal(flat_s[untouched], scale.view(20, *entry[:-1], groups)[untouched])


def test_quantising_store_rejects_a_wrong_scale_shape(device: torch.device) -> None:
    cache = torch.zeros(2, 4, 2, 16, dtype=FP8, device=device)
    with pytest.raises(ValueError, match=r"scale\.shape"):
        kv_store.store_kv_fp8(
            cache,
            torch.zeros(2, 4, 2, 2, device=device),
            torch.zeros(1, 2, 16, device=device),
            torch.zeros(1, dtype=torch.int64, device=device),
        )


def _fp8_pair(cache: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fp8 cache, its scales, the dequantised cache in dtype); NaN blocks stay NaN."""
    q, s = quantize_groups(cache)
    return q, s, dequantize_groups(q, s).to(dtype)


# bfloat16 only on the GPU: the interpreter's tl.dot mishandles it (kernels/_mma.py).
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16] + ([torch.bfloat16] if torch.cuda.is_available() else [])
)
@pytest.mark.parametrize(
    "d", [16, 128, 256]
)  # one scale per key and head (128: the dense models'); two groups
def test_paged_attention_on_fp8_cache_equals_the_dequantised_cache(
    device: torch.device, dtype: torch.dtype, d: int
) -> None:
    b = PagedBatch(
        [5, 1, 30, 1],
        [0, 100, 20, 140],
        hq=4,
        hk=2,
        d=d,
        dv=d,
        block_size=16,
        dtype=torch.float32,
        device=device,
        seed=3,
    )
    kq, ks, kd = _fp8_pair(b.k_cache, dtype)
    vq, vs, vd = _fp8_pair(b.v_cache, dtype)
    q = b.q.to(dtype)
    qsl, sl, bt = (
        torch.tensor(b.qsl, dtype=torch.int32),
        torch.tensor(b.seq_lens, dtype=torch.int32),
        b.block_tables,
    )
    dev = [t.to(device) for t in (q, kq, vq, qsl, sl, bt)]
    # 256-key chunks: two or more key tiles per chunk, where an operand layout apart from the
    # 16-bit cache's would round apart (kernels/_opaque.py).
    got = paged_attention.paged_attention(
        *dev, 0.25, kv_chunk=256, k_scale=ks.to(device), v_scale=vs.to(device)
    )
    # The FP8 cache's default key tile; the same tile on the dequantised cache gives the same bits.
    block_n = paged_attention.FP8_BLOCK_N if d <= 128 else paged_attention.BLOCK_N
    on_dequantised = paged_attention.paged_attention(
        dev[0], kd.to(device), vd.to(device), *dev[3:], 0.25, kv_chunk=256, block_n=block_n
    )
    # Bit for bit in every query dtype: the dequantised tiles take the 16-bit cache's MMA operand
    # layout (kernels/_opaque.py). Without that, float16 queries on the H200 gave a few outputs one
    # float16 unit apart (an output sums p * v terms grouped over k differently).
    assert torch.equal(got, on_dequantised)
    if d <= 128 and dtype != torch.float16:
        # Scaling the scores and probabilities instead of the tiles gives the same bits.
        on_scores = paged_attention.paged_attention(
            *dev, 0.25, kv_chunk=256, k_scale=ks.to(device), v_scale=vs.to(device), fp8_scale_scores=True
        )
        assert torch.equal(on_scores, got)
    ref = reference.paged_attention(q, kq, vq, b.qsl, b.seq_lens, bt, 0.25, k_scale=ks, v_scale=vs)
    assert torch.equal(ref, reference.paged_attention(q, kd, vd, b.qsl, b.seq_lens, bt, 0.25))
    assert rel_err(got, ref) < (1e-5 if dtype == torch.float32 else 2 * TOL[dtype])
    # One decode row alone equals itself in the batch.
    alone = paged_attention.paged_attention(
        dev[0][5:6],
        kq.to(device),
        vq.to(device),
        torch.tensor([0, 1], dtype=torch.int32, device=device),
        dev[4][1:2],
        dev[5][1:2],
        0.25,
        kv_chunk=128,
        k_scale=ks.to(device),
        v_scale=vs.to(device),
    )
    assert torch.equal(alone, got[5:6])


def _spread_scales(cache: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """cache with some slots' values times 2^20 and others times 2^-40: 128-value groups whose
    scales lie far above 1 (values past e4m3's 448 by far) and far below, beside ordinary ones."""
    flat = cache.clone().view(-1, *cache.shape[2:])
    pick = torch.randint(0, 4, (flat.shape[0],), generator=gen)
    flat[pick == 1] *= 2.0**20
    flat[pick == 2] *= 2.0**-40
    return flat.view(cache.shape)


# bfloat16 on the GPU only, as above; float16 cannot hold 2^20.
@pytest.mark.parametrize("dtype", [torch.float32] + ([torch.bfloat16] if torch.cuda.is_available() else []))
def test_paged_attention_on_fp8_cache_with_scales_far_from_one(
    device: torch.device, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(11)
    b = PagedBatch(
        [4, 1, 1],
        [0, 200, 90],
        hq=8,
        hk=2,
        d=128,
        dv=128,
        block_size=16,
        dtype=torch.float32,
        device=device,
        seed=8,
    )
    kq, ks, kd = _fp8_pair(_spread_scales(b.k_cache, gen), dtype)
    vq, vs, vd = _fp8_pair(_spread_scales(b.v_cache, gen), dtype)
    assert float(ks.max()) > 2.0**7 and float(vs.max()) > 2.0**7 and float(vs.min()) < 2.0**-30
    idx = [
        torch.tensor(b.qsl, dtype=torch.int32, device=device),
        torch.tensor(b.seq_lens, dtype=torch.int32, device=device),
        b.block_tables.to(device),
    ]
    q = b.q.to(dtype).to(device)
    got = paged_attention.paged_attention(
        q,
        kq.to(device),
        vq.to(device),
        *idx,
        0.25,
        kv_chunk=256,
        k_scale=ks.to(device),
        v_scale=vs.to(device),
    )
    on_dequantised = paged_attention.paged_attention(
        q, kd.to(device), vd.to(device), *idx, 0.25, kv_chunk=256, block_n=paged_attention.FP8_BLOCK_N
    )
    assert got.isfinite().all()
    assert torch.equal(got, on_dequantised)


def test_fp8_cache_key_tile_follows_kv_chunk(device: torch.device) -> None:
    """The FP8 cache's 128-key default tile is taken only where it divides kv_chunk; with a
    64-key chunk the default is the 64-key tile (the same bits as asking for it), not an error."""
    b = PagedBatch(
        [3, 1], [0, 90], hq=4, hk=2, d=16, dv=16, block_size=16, dtype=torch.float32, device=device, seed=5
    )
    (kq, ks), (vq, vs) = quantize_groups(b.k_cache), quantize_groups(b.v_cache)
    args = (
        b.q.to(device),
        kq.to(device),
        vq.to(device),
        torch.tensor(b.qsl, dtype=torch.int32, device=device),
        torch.tensor(b.seq_lens, dtype=torch.int32, device=device),
        b.block_tables.to(device),
        0.25,
    )
    scales = {"k_scale": ks.to(device), "v_scale": vs.to(device)}
    by_default = paged_attention.paged_attention(*args, kv_chunk=64, **scales)
    assert torch.equal(by_default, paged_attention.paged_attention(*args, kv_chunk=64, block_n=64, **scales))


# (256, 32): whole groups per latent half, the rope key in one group (DeepSeek's layout, scaled
# down); (64, 16): groups spanning both halves; (64, 128): the rope key across two groups.
# bfloat16 queries only on the GPU, as above.
@pytest.mark.parametrize(
    "rank,rope", [(256, 32), (64, 16), (64, 128), pytest.param(512, 64, marks=pytest.mark.gpu)]
)
@pytest.mark.parametrize("dtype", [torch.float32] + ([torch.bfloat16] if torch.cuda.is_available() else []))
@pytest.mark.parametrize("block_n", sorted({mla_decode.MLA_BLOCK_N, 32}))  # the default key tile, and 32
def test_mla_on_fp8_cache_equals_the_dequantised_cache(
    device: torch.device, rank: int, rope: int, dtype: torch.dtype, block_n: int
) -> None:
    """The FP8 cache gives the bits of a 16-bit cache holding its dequantised values, run at the
    same key tile."""
    gen = torch.Generator().manual_seed(4)
    # Chunks of two or more key tiles: a tile's products accumulate onto the previous tile's, where
    # a dot operand laid out for 8-bit loads would round apart from the 16-bit cache (_opaque.py).
    q_lens, ctx, block_size = [3, 1, 1], [0, 300, 140], 16
    seq_lens = [c + q for c, q in zip(ctx, q_lens, strict=True)]
    qsl = [0, 3, 4, 5]
    n_blocks = [-(-s // block_size) for s in seq_lens]
    perm = torch.randperm(sum(n_blocks) + 2, generator=gen)
    bt = torch.full((3, max(n_blocks)), -1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(n_blocks):
        bt[i, :n] = perm[used : used + n].int()
        used += n
    heads = 4
    cache = _spread_scales(torch.randn(len(perm), block_size, rank + rope, generator=gen), gen)
    cache[perm[used:]] = float("nan")
    cq, cs, cd = _fp8_pair(cache, dtype)
    q_latent = torch.randn(5, heads, rank, generator=gen).to(dtype)
    q_pe = torch.randn(5, heads, rope, generator=gen).to(dtype)
    idx = [
        torch.tensor(qsl, dtype=torch.int32, device=device),
        torch.tensor(seq_lens, dtype=torch.int32, device=device),
        bt.to(device),
    ]
    got = mla_decode.mla_paged_attention(
        q_latent.to(device),
        q_pe.to(device),
        cq.to(device),
        *idx,
        0.2,
        kv_chunk=128,
        block_n=block_n,
        cache_scale=cs.to(device),
    )
    on_dequantised = mla_decode.mla_paged_attention(
        q_latent.to(device), q_pe.to(device), cd.to(device), *idx, 0.2, kv_chunk=128, block_n=block_n
    )
    assert got.isfinite().all()
    assert torch.equal(got, on_dequantised)
    ref = reference_mla.mla_paged_attention(q_latent, q_pe, cq, qsl, seq_lens, bt, 0.2, cache_scale=cs)
    assert torch.equal(ref, reference_mla.mla_paged_attention(q_latent, q_pe, cd, qsl, seq_lens, bt, 0.2))
    assert rel_err(got, ref) < (1e-5 if dtype == torch.float32 else TOL[dtype])
