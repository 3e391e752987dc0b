"""Absorbed MLA kernel against reference_mla, and its batch invariance."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import (
    TOL,
    assert_padded_rows_match,
    compiled_variants,
    mixed_width_step,
    poison_past_sequences,
    rel_err,
    spread_rows,
)

from shardinfer.kernels import mla_decode, reference_mla, split_kv
from shardinfer.kernels.mla_decode import mla_paged_attention


class MlaBatch:
    def __init__(
        self,
        q_lens: list[int],
        ctx: list[int],
        heads: int,
        rank: int,
        rope: int,
        block_size: int,
        dtype: torch.dtype,
        seed: int,
    ) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.seq_lens = [c + q for c, q in zip(ctx, q_lens, strict=True)]
        self.qsl = [0]
        for q in q_lens:
            self.qsl.append(self.qsl[-1] + q)
        n_blocks = [-(-s // block_size) for s in self.seq_lens]
        total = sum(n_blocks) + 2
        perm = torch.randperm(total, generator=gen)
        self.block_tables = torch.full((len(q_lens), max(n_blocks)), -1, dtype=torch.int32)
        used = 0
        for i, n in enumerate(n_blocks):
            self.block_tables[i, :n] = perm[used : used + n].int()
            used += n
        self.cache = torch.randn(total, block_size, rank + rope, generator=gen).to(dtype)
        self.cache[perm[used:]] = float("nan")  # blocks nobody owns must never be read
        self.q_latent = torch.randn(self.qsl[-1], heads, rank, generator=gen).to(dtype)
        self.q_pe = torch.randn(self.qsl[-1], heads, rope, generator=gen).to(dtype)

    def reference(self, scale: float) -> torch.Tensor:
        return reference_mla.mla_paged_attention(
            self.q_latent, self.q_pe, self.cache, self.qsl, self.seq_lens, self.block_tables, scale
        )

    def run(
        self, device: torch.device, scale: float, rows: slice | None = None, **kw: int | bool
    ) -> torch.Tensor:
        if rows is None:
            qsl, sl, bt, lo, hi = self.qsl, self.seq_lens, self.block_tables, 0, self.qsl[-1]
        else:
            i = rows.start
            lo, hi = self.qsl[i], self.qsl[i + 1]
            qsl, sl, bt = [0, hi - lo], [self.seq_lens[i]], self.block_tables[i : i + 1]
        return mla_paged_attention(
            self.q_latent[lo:hi].to(device),
            self.q_pe[lo:hi].to(device),
            self.cache.to(device),
            torch.tensor(qsl, dtype=torch.int32, device=device),
            torch.tensor(sl, dtype=torch.int32, device=device),
            bt.to(device),
            scale,
            **kw,
        ).cpu()


def test_matches_reference_and_is_batch_invariant(device: torch.device) -> None:
    b = MlaBatch(
        [3, 1, 1], [0, 90, 40], heads=8, rank=32, rope=16, block_size=16, dtype=torch.float32, seed=1
    )
    out = b.run(device, 0.2, kv_chunk=64)
    assert rel_err(out, b.reference(0.2)) < 1e-5
    for i in range(3):
        alone = b.run(device, 0.2, rows=slice(i, i + 1), kv_chunk=64)
        assert torch.equal(alone, out[b.qsl[i] : b.qsl[i + 1]])


@pytest.mark.parametrize("block_size", [16, 48, 128])  # pages smaller than, across, and larger than a chunk
def test_page_prefetch_reads_the_same_keys(device: torch.device, block_size: int) -> None:
    """The chunk's page ids read once up front give the bits of one block-table read per tile."""
    b = MlaBatch(
        [2, 1, 1], [61, 150, 7], heads=4, rank=32, rope=16, block_size=block_size, dtype=torch.float32, seed=6
    )
    out = b.run(device, 0.25, kv_chunk=64, block_n=16, page_prefetch=True)
    assert rel_err(out, b.reference(0.25)) < 1e-5
    assert torch.equal(out, b.run(device, 0.25, kv_chunk=64, block_n=16, page_prefetch=False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # the interpreter's dot mishandles bf16
def test_tma_tiles_match_reference_and_are_batch_invariant(device: torch.device, dtype: torch.dtype) -> None:
    """Key tiles through TMA descriptors (one page read per tile). The pages past each sequence's
    last key are filled with NaN: the tile rows read there must not reach the output."""
    b = MlaBatch([3, 1, 2], [0, 90, 37], heads=8, rank=32, rope=16, block_size=32, dtype=dtype, seed=5)
    ref = reference_mla.mla_paged_attention(
        b.q_latent.float(), b.q_pe.float(), b.cache.float(), b.qsl, b.seq_lens, b.block_tables, 0.2
    )
    for i, length in enumerate(b.seq_lens):
        page, slot = divmod(length, 32)
        if slot:
            b.cache[b.block_tables[i, page], slot:] = float("nan")
    out = b.run(device, 0.2, kv_chunk=64, block_n=16, tma=True)
    assert rel_err(out.float(), ref) < (1e-5 if dtype == torch.float32 else TOL[dtype])
    for i in range(3):
        alone = b.run(device, 0.2, rows=slice(i, i + 1), kv_chunk=64, block_n=16, tma=True)
        assert torch.equal(alone, out[b.qsl[i] : b.qsl[i + 1]])
    with pytest.raises(ValueError, match="must not cross"):
        b.run(device, 0.2, kv_chunk=128, block_n=64, tma=True)


def test_heads_split_across_tiles(device: torch.device) -> None:
    """More heads than a tile holds (DeepSeek-V3's 128 with 16-row tiles): heads go to several programs."""
    b = MlaBatch([2, 1], [5, 33], heads=32, rank=32, rope=16, block_size=8, dtype=torch.float32, seed=2)
    assert rel_err(b.run(device, 0.3, kv_chunk=64), b.reference(0.3)) < 1e-5


@pytest.mark.parametrize("block_m", [16, 32])
def test_merge_in_kernel_gives_the_merge_kernels_bits(device: torch.device, block_m: int) -> None:
    """The last chunk program of a tile merging the chunks equals the separate merge kernel bit for
    bit, across 1 to 6 chunks, a prefill row and heads split over two tiles; a second call (its
    arrival counters reset by the first) gives the same bits again."""
    b = MlaBatch(
        [3, 1, 1, 1, 1],
        [0, 63, 130, 250, 380],
        heads=32,
        rank=32,
        rope=16,
        block_size=16,
        dtype=torch.float32,
        seed=12,
    )
    merged = b.run(device, 0.2, kv_chunk=64, block_m=block_m, merge=True)
    assert rel_err(merged, b.reference(0.2)) < 1e-5
    assert torch.equal(merged, b.run(device, 0.2, kv_chunk=64, block_m=block_m, merge=False))
    assert torch.equal(merged, b.run(device, 0.2, kv_chunk=64, block_m=block_m, merge=True))


@pytest.mark.slow
def test_one_token_blocks_over_many_requests(device: torch.device) -> None:
    """16 heads fill a 16-row tile, so a q block is one token (q block index = token index): over
    300 requests (more than one of _locate's vector loads), prefills and decodes mixed, including
    an empty request, every token finds its request."""
    gen = torch.Generator().manual_seed(15)
    q_lens = [int(n) for n in torch.randint(1, 4, (300,), generator=gen)]
    q_lens[7] = 0
    ctx = [int(n) for n in torch.randint(0, 40, (300,), generator=gen)]
    b = MlaBatch(q_lens, ctx, heads=16, rank=32, rope=16, block_size=16, dtype=torch.float32, seed=16)
    assert rel_err(b.run(device, 0.3, kv_chunk=64), b.reference(0.3)) < 1e-5


def test_rejects_bad_inputs(device: torch.device) -> None:
    b = MlaBatch([1], [4], heads=4, rank=32, rope=16, block_size=8, dtype=torch.float32, seed=3)
    ql, qp, cache = b.q_latent.to(device), b.q_pe.to(device), b.cache.to(device)
    qsl = torch.tensor(b.qsl, dtype=torch.int32, device=device)
    sl = torch.tensor(b.seq_lens, dtype=torch.int32, device=device)
    bt = b.block_tables.to(device)
    with pytest.raises(ValueError, match=r"cache.shape\[-1\]"):
        mla_paged_attention(ql, qp, cache[..., :40].contiguous(), qsl, sl, bt, 1.0)
    with pytest.raises(ValueError, match=r"q_pe.dtype"):
        mla_paged_attention(ql, qp.half(), cache, qsl, sl, bt, 1.0)
    with pytest.raises(ValueError, match=r"powers of two"):
        mla_paged_attention(ql[..., :24], qp, cache[..., 8:].contiguous(), qsl, sl, bt, 1.0)
    with pytest.raises(ValueError, match=r"block_n"):
        mla_paged_attention(ql, qp, cache, qsl, sl, bt, 1.0, block_n=48)
    with pytest.raises(ValueError, match=r"seq_lens.dtype"):
        mla_paged_attention(ql, qp, cache, qsl, sl.long(), bt, 1.0)
    with pytest.raises(ValueError, match=r"num_stages: got 0"):
        mla_paged_attention(ql, qp, cache, qsl, sl, bt, 1.0, num_stages=0)


@pytest.mark.gpu
@pytest.mark.parametrize("tma", [False, True])
def test_deepseek_shapes_bf16(tma: bool) -> None:
    dev = torch.device("cuda")
    q_lens = [300] + [1] * 31
    ctx = [200] + [97 * i for i in range(31)]
    b = MlaBatch(q_lens, ctx, heads=16, rank=512, rope=64, block_size=64, dtype=torch.bfloat16, seed=4)
    scale = 192**-0.5
    ref = reference_mla.mla_paged_attention(
        b.q_latent.float(), b.q_pe.float(), b.cache.float(), b.qsl, b.seq_lens, b.block_tables, scale
    )
    out = b.run(dev, scale, tma=tma)
    assert rel_err(out, ref) < TOL[torch.bfloat16]
    for i in (0, 5):
        assert torch.equal(b.run(dev, scale, rows=slice(i, i + 1), tma=tma), out[b.qsl[i] : b.qsl[i + 1]])


@pytest.mark.gpu
def test_merge_in_kernel_under_graph_replays() -> None:
    """200 decodes at DeepSeek shapes (several waves of programs racing to be a tile's last):
    replays of one captured graph, each with new queries, give the merge kernel's bits every time,
    so every counter was back at 0 for the next replay."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(13)
    ctx = [int(c) for c in torch.randint(1, 5000, (200,), generator=gen)]
    b = MlaBatch([1] * 200, ctx, heads=16, rank=512, rope=64, block_size=64, dtype=torch.bfloat16, seed=14)
    args = [t.to(dev) for t in (b.q_latent, b.q_pe, b.cache)]
    index = [
        torch.tensor(b.qsl, dtype=torch.int32, device=dev),
        torch.tensor(b.seq_lens, dtype=torch.int32, device=dev),
        b.block_tables.to(dev),
    ]

    def run(merge: bool) -> torch.Tensor:
        return mla_paged_attention(*args, *index, 0.1, max_seq_len=5000, merge=merge)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run(True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = run(True)
    torch.cuda.current_stream().wait_stream(stream)
    for i in range(20):
        args[0].copy_(torch.randn(args[0].shape, generator=gen.manual_seed(100 + i)).to(args[0].dtype))
        graph.replay()
        assert torch.equal(out, run(False))


def test_pipeline_depth_follows_the_waves_of_programs() -> None:
    # 16 heads fill a 16-row tile: one program per (decode token, 1024-key chunk); an H200 has 132 SMs.
    def stages(tokens: int, ctx: int) -> int:
        return mla_decode.pipeline_stages(tokens, 16, ctx, 1024, 16, 132)

    assert stages(64, 2048) == stages(132, 1024) == stages(128, 512) == mla_decode.MLA_NUM_STAGES_ONE_WAVE
    assert stages(128, 2048) == stages(133, 512) == stages(256, 512) == mla_decode.MLA_NUM_STAGES
    # A graph's max_seq_len is the longest allowed context: chunks count up to two.
    assert (
        stages(64, 8192) == mla_decode.MLA_NUM_STAGES_ONE_WAVE
        and stages(100, 8192) == mla_decode.MLA_NUM_STAGES
    )
    assert mla_decode.pipeline_stages(64, 16, 2048, 1024, 16, 0) == mla_decode.MLA_NUM_STAGES  # not on a GPU
    # 8 heads in a 16-row tile: two decode tokens per program.
    assert mla_decode.pipeline_stages(200, 8, 1000, 1024, 16, 132) == mla_decode.MLA_NUM_STAGES_ONE_WAVE
    # Float32 tiles never take the deeper pipeline (it overflows shared memory at rank 512).
    assert (
        mla_decode.pipeline_stages(64, 16, 2048, 1024, 16, 132, element_size=4) == mla_decode.MLA_NUM_STAGES
    )
    # An FP8 cache runs one stage in one wave or many (two programs per SM; bench/kernels/NOTES.md).
    assert mla_decode.MLA_FP8_NUM_STAGES == 1
    assert all(
        mla_decode.pipeline_stages(tokens, 16, ctx, 1024, 16, 132, fp8_cache=True) == 1
        for tokens, ctx in ((1, 100), (64, 2048), (256, 8192))
    )


def test_fp8_cache_launches_at_its_own_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher asks pipeline_stages with the cache kind: one stage on an FP8 cache, the
    bf16 cache's depth otherwise, an explicit num_stages as given."""
    from shardinfer.kernels.reference_fp8 import quantize_groups

    seen: list[object] = []

    class Recorder:
        def __getitem__(self, grid: object) -> object:
            return lambda *args, **kwargs: seen.append(kwargs["num_stages"])

    monkeypatch.setattr(mla_decode, "_mla_chunk_kernel", Recorder())
    cache = torch.randn(2, 16, 64 + 16)
    cq, cs = quantize_groups(cache)
    args = (torch.randn(1, 4, 64), torch.randn(1, 4, 16))
    idx = (
        torch.tensor([0, 1], dtype=torch.int32),
        torch.tensor([20], dtype=torch.int32),
        torch.tensor([[0, 1]], dtype=torch.int32),
    )
    mla_paged_attention(*args, cq, *idx, 0.1, cache_scale=cs)
    mla_paged_attention(*args, cache, *idx, 0.1)
    mla_paged_attention(*args, cq, *idx, 0.1, cache_scale=cs, num_stages=2)
    assert seen == [mla_decode.MLA_FP8_NUM_STAGES, mla_decode.MLA_NUM_STAGES, 2]


@pytest.mark.gpu
def test_pipeline_depth_keeps_the_bits() -> None:
    """The launcher picks 3 stages when its programs fit one wave and 2 otherwise: a row decoded
    alone (3 stages) must equal the same row in a batch of 200 decodes (2 stages), bit for bit."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(8)
    ctx = [int(c) for c in torch.randint(1, 3000, (200,), generator=gen)]
    b = MlaBatch([1] * 200, ctx, heads=16, rank=512, rope=64, block_size=64, dtype=torch.bfloat16, seed=9)
    scale = 192**-0.5
    out = b.run(dev, scale)
    for stages in (2, 3):
        assert torch.equal(b.run(dev, scale, num_stages=stages), out)
    for i in (0, 77, 199):
        assert torch.equal(b.run(dev, scale, rows=slice(i, i + 1)), out[i : i + 1])


@pytest.mark.gpu
def test_batch_shapes_compile_nothing_new_on_gpu() -> None:
    """Batches that fit one wave of programs (one pipeline depth) differing in request count,
    block-table width (down to one page) and number of KV chunks reuse the first batch's kernels."""
    dev = torch.device("cuda")

    def run(q_lens: list[int], ctx: list[int], seed: int) -> None:
        b = MlaBatch(q_lens, ctx, heads=16, rank=512, rope=64, block_size=64, dtype=torch.bfloat16, seed=seed)
        b.run(dev, 0.1)

    run([3, 1, 1], [0, 2500, 70], 1)
    torch.cuda.synchronize()
    kernels = (mla_decode._mla_chunk_kernel, split_kv.merge_kernel)
    before = compiled_variants(*kernels)
    shapes = [([1], [5]), ([2, 1], [0, 60]), ([1] * 17, [40 * i for i in range(17)]), ([1] * 60, [1100] * 60)]
    for i, (q_lens, ctx) in enumerate(shapes):
        run(q_lens, ctx, 2 + i)
    torch.cuda.synchronize()
    assert compiled_variants(*kernels) == before


def test_padded_decode_layout_reads_no_key_past_a_sequence(device: torch.device) -> None:
    """MLA's side of engine/cuda_graphs.pad_to_width: a mixed-width step replayed in the widest
    request's graph gives the real rows the unpadded step's bits, with NaN in every slot past a
    sequence (test_kernel_paged_attention.py has the same check for the dense kernel)."""
    from shardinfer.engine.cuda_graphs import pad_to_width

    gen = torch.Generator().manual_seed(12)
    heads, rank, rope, w = 4, 64, 16, 3
    host, seq_lens = mixed_width_step()
    cache = torch.randn(4, 16, rank + rope, generator=gen)
    poison_past_sequences(cache, seq_lens)
    q_latent = torch.randn(len(host.input_ids), heads, rank, generator=gen)
    q_pe = torch.randn(len(host.input_ids), heads, rope, generator=gen)

    def attend(lat: torch.Tensor, pe: torch.Tensor, h) -> torch.Tensor:
        return mla_paged_attention(
            lat.to(device),
            pe.to(device),
            cache.to(device),
            torch.tensor(h.query_start_loc, device=device),
            torch.tensor(h.seq_lens, device=device),
            torch.tensor(h.block_tables, device=device),
            0.2,
            kv_chunk=64,
        ).cpu()

    padded, rows = pad_to_width(host, w)
    n = len(seq_lens) * w
    got = attend(spread_rows(q_latent, rows, n), spread_rows(q_pe, rows, n), padded)[torch.from_numpy(rows)]
    assert_padded_rows_match(got, attend(q_latent, q_pe, host), device)
