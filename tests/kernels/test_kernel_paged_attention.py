"""Paged attention kernel: reference agreement, masking, and bitwise batch invariance."""

from __future__ import annotations

import inspect

import pytest
import torch
from kernel_checks import (
    TOL,
    PagedBatch,
    assert_padded_rows_match,
    compiled_variants,
    mixed_width_step,
    poison_past_sequences,
    rel_err,
    spread_rows,
)

from shardinfer.kernels import paged_attention as pa
from shardinfer.kernels import reference, split_kv
from shardinfer.kernels.paged_attention import paged_attention

# Mixed batch: a fresh prefill, decodes at several depths, a chunked-prefill continuation.
Q_LENS = [5, 1, 70, 1]
CTX_LENS = [0, 100, 20, 140]


def _run(batch: PagedBatch, scale: float, window: int | None, **kw: int) -> torch.Tensor:
    return paged_attention(*batch.args(), scale, window, **kw).cpu()


@pytest.mark.parametrize("window", [None, 50])
def test_matches_reference_fp32(device: torch.device, window: int | None) -> None:
    b = PagedBatch(
        Q_LENS, CTX_LENS, hq=4, hk=2, d=16, dv=16, block_size=16, dtype=torch.float32, device=device, seed=1
    )
    ref = reference.paged_attention(
        b.q, b.k_cache, b.v_cache, b.qsl, b.seq_lens, b.block_tables, 0.25, window
    )
    out = _run(b, 0.25, window, kv_chunk=64)
    assert rel_err(out, ref) < 1e-5


def test_matches_reference_fp16_mha_and_dv(device: torch.device) -> None:
    """Group size 1 and a value head dim different from the key's (MLA-like 32 / 16)."""
    b = PagedBatch(
        [3, 1], [30, 70], hq=2, hk=2, d=32, dv=16, block_size=8, dtype=torch.float16, device=device, seed=2
    )
    ref = reference.paged_attention(b.q, b.k_cache, b.v_cache, b.qsl, b.seq_lens, b.block_tables, 0.2)
    assert rel_err(_run(b, 0.2, None, kv_chunk=64), ref) < 4 * TOL[torch.float16]


@pytest.mark.slow
def test_more_requests_than_one_locate_span(device: torch.device) -> None:
    """Over 256 requests (decodes and short prefills mixed): programs find their request across
    several of _locate's vector loads of request offsets."""
    gen = torch.Generator().manual_seed(11)
    q_lens = [int(n) for n in torch.randint(1, 4, (300,), generator=gen)]
    q_lens[::7] = [1] * len(q_lens[::7])
    ctx = [int(n) for n in torch.randint(0, 20, (300,), generator=gen)]
    b = PagedBatch(
        q_lens, ctx, hq=2, hk=1, d=16, dv=16, block_size=8, dtype=torch.float32, device=device, seed=6
    )
    ref = reference.paged_attention(b.q, b.k_cache, b.v_cache, b.qsl, b.seq_lens, b.block_tables, 0.3)
    assert rel_err(_run(b, 0.3, None, kv_chunk=64), ref) < 1e-5


@pytest.mark.parametrize("window", [None, 200])
def test_every_chunk_count_merges(device: torch.device, window: int | None) -> None:
    """Decodes over 1 to 9 chunks (every remainder of the merge's groups of four), with a value
    width split over two merge programs: each row matches the reference and equals itself alone."""
    ctx = [64 * k - 1 for k in range(1, 10)]
    b = PagedBatch(
        [1] * 9, ctx, hq=4, hk=2, d=16, dv=256, block_size=16, dtype=torch.float32, device=device, seed=12
    )
    assert split_kv.combine_slice(16, 256) == 128
    ref = reference.paged_attention(b.q, b.k_cache, b.v_cache, b.qsl, b.seq_lens, b.block_tables, 0.3, window)
    out = _run(b, 0.3, window, kv_chunk=64)
    assert rel_err(out, ref) < 1e-5
    q, kc, vc, qsl, sl, bt = b.args()
    for i in (0, 3, 8):
        alone = paged_attention(
            q[i : i + 1], kc, vc, qsl[:2], sl[i : i + 1], bt[i : i + 1], 0.3, window, kv_chunk=64
        )
        assert torch.equal(alone.cpu(), out[i : i + 1])


def test_never_reads_past_seq_len(device: torch.device) -> None:
    b = PagedBatch(
        [2, 1], [9, 20], hq=2, hk=1, d=16, dv=16, block_size=16, dtype=torch.float32, device=device, seed=3
    )
    ref = reference.paged_attention(b.q, b.k_cache, b.v_cache, b.qsl, b.seq_lens, b.block_tables, 0.3)
    for i, s in enumerate(b.seq_lens):  # poison the unused tail of each request's last block
        last = int(b.block_tables[i, (s - 1) // 16])
        b.k_cache[last, s % 16 :] = float("nan")
        b.v_cache[last, s % 16 :] = float("nan")
    assert rel_err(_run(b, 0.3, None, kv_chunk=64), ref) < 1e-5


@pytest.mark.parametrize("window", [None, 40])
def test_row_alone_equals_row_in_batch_bitwise(device: torch.device, window: int | None) -> None:
    b = PagedBatch(
        Q_LENS, CTX_LENS, hq=4, hk=2, d=16, dv=16, block_size=16, dtype=torch.float32, device=device, seed=4
    )
    full = _run(b, 0.25, window, kv_chunk=64)
    for i in range(len(Q_LENS)):
        alone = paged_attention(
            b.q[b.qsl[i] : b.qsl[i + 1]].to(device),
            b.k_cache.to(device),
            b.v_cache.to(device),
            torch.tensor([0, Q_LENS[i]], dtype=torch.int32, device=device),
            torch.tensor([b.seq_lens[i]], dtype=torch.int32, device=device),
            b.block_tables[i : i + 1].to(device),
            0.25,
            window,
            kv_chunk=64,
        ).cpu()
        assert torch.equal(alone, full[b.qsl[i] : b.qsl[i + 1]]), f"request {i} differs alone vs batched"


def test_chunked_prefill_and_decode_equal_one_shot_prefill_bitwise(device: torch.device) -> None:
    """A request's rows do not depend on how its prompt was chunked into steps."""
    b = PagedBatch(
        [90], [0], hq=4, hk=1, d=16, dv=16, block_size=16, dtype=torch.float32, device=device, seed=5
    )
    q, kc, vc, _, _, bt = b.args()
    one_shot = _run(b, 0.25, None, kv_chunk=64)
    pieces = []
    for lo, hi in [(0, 33), (33, 89), (89, 90)]:  # prefill chunk, chunk, then a decode step
        pieces.append(
            paged_attention(
                q[lo:hi],
                kc,
                vc,
                torch.tensor([0, hi - lo], dtype=torch.int32, device=device),
                torch.tensor([hi], dtype=torch.int32, device=device),
                bt,
                0.25,
                kv_chunk=64,
            ).cpu()
        )
    chunked = torch.cat(pieces)
    if device.type == "cuda":
        assert torch.equal(chunked, one_shot)
    else:
        # The interpreter runs tl.dot through numpy's BLAS, whose rounding depends on a row's
        # position inside the tile (chunking shifts it); the GPU's MMA does not. Bitwise here
        # would test numpy, so the CPU run checks agreement and the GPU run checks bits.
        assert rel_err(chunked, one_shot) < 1e-6


def test_rejects_bad_inputs(device: torch.device) -> None:
    b = PagedBatch(
        [2], [3], hq=4, hk=2, d=16, dv=16, block_size=16, dtype=torch.float32, device=device, seed=6
    )
    q, kc, vc, qsl, sl, bt = b.args()
    with pytest.raises(ValueError, match=r"k_cache.dtype"):
        paged_attention(q, kc.half(), vc, qsl, sl, bt, 1.0)
    with pytest.raises(ValueError, match=r"multiple of the cache's KV heads"):
        paged_attention(q[:, :3], kc, vc, qsl, sl, bt, 1.0)
    with pytest.raises(ValueError, match=r"query_start_loc.shape"):
        paged_attention(q, kc, vc, qsl[:1], sl, bt, 1.0)
    with pytest.raises(ValueError, match=r"seq_lens.dtype"):
        paged_attention(q, kc, vc, qsl, sl.long(), bt, 1.0)
    with pytest.raises(ValueError, match=r"kv_chunk"):
        paged_attention(q, kc, vc, qsl, sl, bt, 1.0, kv_chunk=100)
    with pytest.raises(ValueError, match=r"sliding_window"):
        paged_attention(q, kc, vc, qsl, sl, bt, 1.0, sliding_window=0)
    with pytest.raises(ValueError, match=r"k_cache.shape\[-1\]"):
        paged_attention(q, kc[..., :8], vc, qsl, sl, bt, 1.0)
    with pytest.raises(ValueError, match=r"num_stages: got 0"):
        paged_attention(q, kc, vc, qsl, sl, bt, 1.0, num_stages=0)
    with pytest.raises(ValueError, match=r"max_registers: got 8"):
        paged_attention(q, kc, vc, qsl, sl, bt, 1.0, max_registers=8)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "d,hq,hk,window", [(128, 32, 8, None), (64, 16, 16, None), (128, 16, 8, 256), (256, 8, 4, None)]
)
def test_real_shapes_bf16(d: int, hq: int, hk: int, window: int | None) -> None:
    dev = torch.device("cuda")
    q_lens = [700, 1, 1, 37, 1] + [1] * 27
    ctx = [0, 2047, 513, 300, 5] + [64 * i for i in range(27)]
    b = PagedBatch(
        q_lens, ctx, hq=hq, hk=hk, d=d, dv=d, block_size=16, dtype=torch.bfloat16, device=dev, seed=7
    )
    scale = d**-0.5
    ref = reference.paged_attention(
        b.q.float(), b.k_cache.float(), b.v_cache.float(), b.qsl, b.seq_lens, b.block_tables, scale, window
    )
    out = _run(b, scale, window)
    assert rel_err(out, ref) < TOL[torch.bfloat16]
    # Batch invariance at real shapes: the decode row at 2047 alone, and the prefill alone.
    for i in (0, 1):
        alone = paged_attention(
            b.q[b.qsl[i] : b.qsl[i + 1]].to(dev),
            b.k_cache.to(dev),
            b.v_cache.to(dev),
            torch.tensor([0, q_lens[i]], dtype=torch.int32, device=dev),
            torch.tensor([b.seq_lens[i]], dtype=torch.int32, device=dev),
            b.block_tables[i : i + 1].to(dev),
            scale,
            window,
        ).cpu()
        assert torch.equal(alone, out[b.qsl[i] : b.qsl[i + 1]])
    # The 700-token prefill, split into two steps at an arbitrary point, gives the same bits.
    q, kc, vc, _, _, bt = b.args()
    first = paged_attention(
        q[:301],
        kc,
        vc,
        torch.tensor([0, 301], dtype=torch.int32, device=dev),
        torch.tensor([301], dtype=torch.int32, device=dev),
        bt[:1],
        scale,
        window,
    ).cpu()
    rest = paged_attention(
        q[301:700],
        kc,
        vc,
        torch.tensor([0, 399], dtype=torch.int32, device=dev),
        torch.tensor([700], dtype=torch.int32, device=dev),
        bt[:1],
        scale,
        window,
    ).cpu()
    assert torch.equal(torch.cat([first, rest]), out[:700])


@pytest.mark.gpu
def test_batch_shapes_compile_nothing_new_on_gpu() -> None:
    """Batches differing in request count, block-table width and number of KV chunks reuse the
    kernels compiled for the first one: Triton specializes integer arguments that equal 1 or
    divide by 16 unless told not to, and a new variant compiles mid-run (about a second)."""
    dev = torch.device("cuda")

    def run(q_lens: list[int], ctx: list[int], seed: int) -> None:
        b = PagedBatch(
            q_lens,
            ctx,
            hq=32,
            hk=8,
            d=128,
            dv=128,
            block_size=16,
            dtype=torch.bfloat16,
            device=dev,
            seed=seed,
        )
        paged_attention(*b.args(), 128**-0.5, None)

    run([40, 1, 1], [0, 3000, 17], 1)
    torch.cuda.synchronize()
    before = compiled_variants(pa._attn_chunk_kernel, split_kv.merge_kernel)
    shapes = [
        ([1], [5]),
        ([3, 1], [0, 250]),
        ([1] * 17, [30 * i for i in range(17)]),
        ([200, 1], [0, 511]),
        ([1] * 64, [2100] * 64),
    ]
    for i, (q_lens, ctx) in enumerate(shapes):
        run(q_lens, ctx, 2 + i)
    torch.cuda.synchronize()
    assert compiled_variants(pa._attn_chunk_kernel, split_kv.merge_kernel) == before


def test_padded_decode_layout_reads_no_key_past_a_sequence(device: torch.device) -> None:
    """A CUDA graph step of mixed widths (engine/cuda_graphs.pad_to_width) gives each request's
    real rows the bits of the unpadded step, though every key slot past a sequence holds NaN (what
    an earlier request may have left): the padding must never make a real row's tile reach them."""
    from shardinfer.engine.cuda_graphs import pad_to_width

    gen = torch.Generator().manual_seed(11)
    hq, hk, d, w = 4, 2, 16, 3
    host, seq_lens = mixed_width_step()
    k_cache = torch.randn(4, 16, hk, d, generator=gen)
    v_cache = torch.randn(4, 16, hk, d, generator=gen)
    poison_past_sequences(k_cache, seq_lens)
    poison_past_sequences(v_cache, seq_lens)
    q = torch.randn(len(host.input_ids), hq, d, generator=gen)

    def attend(q_rows: torch.Tensor, h) -> torch.Tensor:
        return paged_attention(
            q_rows.to(device),
            k_cache.to(device),
            v_cache.to(device),
            torch.tensor(h.query_start_loc, device=device),
            torch.tensor(h.seq_lens, device=device),
            torch.tensor(h.block_tables, device=device),
            0.25,
            kv_chunk=64,
            block_n=16,
        ).cpu()

    padded, rows = pad_to_width(host, w)
    got = attend(spread_rows(q, rows, len(seq_lens) * w), padded)[torch.from_numpy(rows)]
    assert_padded_rows_match(got, attend(q, host), device)


@pytest.mark.parametrize(
    "fp8,dtype,d,want",
    [
        (True, torch.bfloat16, 128, (pa.FP8_NUM_STAGES, pa.MAX_REGISTERS)),  # the FP8 cache's 128-key tile
        (False, torch.bfloat16, 128, (pa.NUM_STAGES, pa.MAX_REGISTERS)),
        (False, torch.float16, 64, (pa.NUM_STAGES, pa.MAX_REGISTERS)),
        (False, torch.float32, 128, (pa.NUM_STAGES, None)),  # float32 tiles need more registers
        (True, torch.bfloat16, 256, (pa.NUM_STAGES, None)),  # two scale groups: 64-key tiles, no cap
    ],
)
def test_launch_settings_follow_the_cache_and_head_dim(
    monkeypatch: pytest.MonkeyPatch,
    device: torch.device,
    fp8: bool,
    dtype: torch.dtype,
    d: int,
    want: tuple[int, int | None],
) -> None:
    """The stage count and register cap the wrapper launches with, by cache dtype, query dtype and
    head dim (paged_attention's docstring); an explicit argument wins."""
    from shardinfer.kernels.reference_fp8 import quantize_groups

    seen: list[tuple[object, object]] = []
    signature = inspect.signature(pa.launch)

    def fake_launch(*args: object, **kwargs: object) -> torch.Tensor:
        given = signature.bind(*args, **kwargs).arguments
        seen.append((given["num_stages"], given.get("max_registers")))
        return torch.empty(0)

    monkeypatch.setattr(pa, "launch", fake_launch)
    b = PagedBatch([1], [20], hq=4, hk=2, d=d, dv=d, block_size=16, dtype=dtype, device=device, seed=1)
    q, kc, vc, qsl, sl, bt = b.args()
    extra: dict[str, object] = {}
    if fp8:
        (kc, ks), (vc, vs) = quantize_groups(kc.float()), quantize_groups(vc.float())
        extra = {"k_scale": ks, "v_scale": vs}
    paged_attention(q, kc, vc, qsl, sl, bt, 0.1, **extra)
    paged_attention(q, kc, vc, qsl, sl, bt, 0.1, num_stages=3, max_registers=None, **extra)
    assert seen == [want, (3, None)]


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_register_cap_and_stages_change_no_bits(fp8: bool) -> None:
    """The launch settings the wrapper picks (a register cap, one stage on an FP8 cache) give the
    bits of the uncapped two-stage kernel, on a mixed prefill and decode batch at dense-8b's heads."""
    from shardinfer.kernels.reference_fp8 import quantize_groups

    dev = torch.device("cuda")
    b = PagedBatch(
        [300, 1, 1, 37] + [1] * 20,
        [0, 2047, 513, 300] + [80 * i for i in range(20)],
        hq=32,
        hk=8,
        d=128,
        dv=128,
        block_size=16,
        dtype=torch.bfloat16,
        device=dev,
        seed=9,
    )
    q, kc, vc, qsl, sl, bt = b.args()
    extra: dict[str, object] = {}
    if fp8:
        (kc, ks), (vc, vs) = quantize_groups(kc), quantize_groups(vc)
        extra = {"k_scale": ks, "v_scale": vs}
    shipped = paged_attention(q, kc, vc, qsl, sl, bt, 128**-0.5, **extra)
    plain = paged_attention(q, kc, vc, qsl, sl, bt, 128**-0.5, num_stages=2, max_registers=None, **extra)
    assert torch.equal(shipped, plain)


def _direct_and_merged(monkeypatch: pytest.MonkeyPatch, run: object) -> tuple[torch.Tensor, torch.Tensor]:
    monkeypatch.setattr(pa, "SINGLE_CHUNK_DIRECT", True)
    direct = run()  # type: ignore[operator]
    monkeypatch.setattr(pa, "SINGLE_CHUNK_DIRECT", False)
    return direct, run()  # type: ignore[operator]


@pytest.mark.parametrize("window", [None, 30])
def test_one_chunk_tiles_written_by_the_chunk_kernel_equal_the_merge(
    monkeypatch: pytest.MonkeyPatch, device: torch.device, window: int | None
) -> None:
    """On an FP8 cache, tiles whose rows all end in the first chunk skip the merge; every row keeps
    the merged bits: decodes inside and past the first chunk, and a prompt whose q blocks straddle
    its end."""
    from shardinfer.kernels.reference_fp8 import quantize_groups

    b = PagedBatch(
        [1, 1, 1, 40, 3],
        [10, 63, 64, 40, 200],
        hq=4,
        hk=2,
        d=16,
        dv=16,
        block_size=16,
        dtype=torch.float32,
        device=device,
        seed=14,
    )
    q, kc, vc, qsl, sl, bt = b.args()
    (kq, ks), (vq, vs) = quantize_groups(kc), quantize_groups(vc)

    def run() -> torch.Tensor:
        return paged_attention(q, kq, vq, qsl, sl, bt, 0.3, window, kv_chunk=64, k_scale=ks, v_scale=vs).cpu()

    direct, merged = _direct_and_merged(monkeypatch, run)
    assert torch.equal(direct, merged)
    ref = reference.paged_attention(
        b.q, (kq.float() * ks).cpu(), (vq.float() * vs).cpu(), b.qsl, b.seq_lens, b.block_tables, 0.3, window
    )
    assert rel_err(direct, ref) < 1e-5


@pytest.mark.gpu
def test_one_chunk_tiles_equal_the_merge_at_dense_8b_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same at dense-8b's heads with the shipped tiles on an FP8 cache (a bf16 cache always
    merges)."""
    from shardinfer.kernels.reference_fp8 import quantize_groups

    b = PagedBatch(
        [200, 1, 1, 1] + [1] * 20,
        [0, 1023, 1024, 1500] + [60 * i for i in range(20)],
        hq=32,
        hk=8,
        d=128,
        dv=128,
        block_size=16,
        dtype=torch.bfloat16,
        device=torch.device("cuda"),
        seed=15,
    )
    q, kc, vc, qsl, sl, bt = b.args()
    (kq, ks), (vq, vs) = quantize_groups(kc), quantize_groups(vc)
    direct, merged = _direct_and_merged(
        monkeypatch, lambda: paged_attention(q, kq, vq, qsl, sl, bt, 128**-0.5, k_scale=ks, v_scale=vs)
    )
    assert torch.equal(direct, merged)
