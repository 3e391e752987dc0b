"""Generated tokens' rows through paged_attention_fma, prompt rows through the chunk kernel.

With prompt lengths given, paged_attention on an FP8 cache (head dim 128, two query heads per KV
head) computes rows at or after their request's prompt length with the FMA kernel. Checked here on
one batch mixing every kind of request (a prefill, a decode row, a verify block, a preempted
request recomputing its prompt and generated tokens in one chunk, a one-token prompt chunk,
multi-chunk contexts):

- every row against float64 attention on the dequantised cache;
- prompt rows bit for bit what the chunk kernel alone gives (the skipped tiles and the merge's
  skip leave them alone);
- generated rows bit for bit what the same rows give as a batch of plain decode rows, so a verify
  row and a recomputed row equal the decode row (the invariance the dispatch must keep), and what
  they give as a step marked generated_only (a decode graph's: the FMA kernel launched alone).

On the CPU the interpreter runs the kernel's Triton twin; on the GPU, the Gluon kernel the engine
runs.
"""

from __future__ import annotations

import pytest
import torch
from kernel_checks import TOL, PagedBatch, rel_err

from shardinfer.kernels import paged_attention, paged_attention_fma, reference, split_kv
from shardinfer.kernels.reference_fp8 import dequantize_groups, quantize_groups

# (query tokens, cached tokens, prompt length) per request.
REQUESTS = [
    (20, 0, 20),  # a prompt prefilled whole: prompt rows
    (1, 70, 30),  # a decode row
    (4, 40, 10),  # a verify block: the newest token and three drafts
    (50, 0, 33),  # a preempted request recomputed: 33 prompt rows, then 17 generated ones
    (1, 32, 33),  # the last prompt token alone (the rest from the prefix cache): a prompt row
    (3, 200, 201),  # a chunk across the prompt's end, in the second KV chunk
    (1, 300, 5),  # a decode row over three KV chunks
]
KV_CHUNK = 128  # several chunks at these lengths, so the merge and its skip run


@pytest.fixture(autouse=True)
def _fma_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dispatch under test, whatever the engine's default."""
    monkeypatch.setattr(paged_attention, "FMA_GENERATED_ROWS", True)


def _not_launched(*args: object, **kwargs: object) -> torch.Tensor:
    raise AssertionError("the chunk kernel and the merge ran on a step of generated rows only")


def _batch(
    q_lens: list[int], ctx_lens: list[int], device: torch.device, seed: int, hq: int = 4
) -> PagedBatch:
    """Requests of q_lens new tokens after ctx_lens cached ones, two KV heads of dim 128."""
    return PagedBatch(
        q_lens,
        ctx_lens,
        hq=hq,
        hk=2,
        d=128,
        dv=128,
        block_size=16,
        dtype=torch.float32,
        device=device,
        seed=seed,
    )


def _cache(b: PagedBatch, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    kq, ks = quantize_groups(b.k_cache)
    vq, vs = quantize_groups(b.v_cache)
    return kq, ks, vq, vs, dequantize_groups(kq, ks), dequantize_groups(vq, vs)


def _attend(
    q: torch.Tensor,
    cache: tuple[torch.Tensor, ...],
    qsl: list[int],
    seq_lens: list[int],
    tables: torch.Tensor,
    prompt_lens: list[int] | None,
    device: torch.device,
    generated_only: bool = False,
) -> torch.Tensor:
    kq, ks, vq, vs = (t.to(device) for t in cache[:4])

    def i32(v: list[int]) -> torch.Tensor:
        return torch.tensor(v, dtype=torch.int32, device=device)

    return paged_attention.paged_attention(
        q.to(device),
        kq,
        vq,
        i32(qsl),
        i32(seq_lens),
        tables.to(device),
        0.125,
        kv_chunk=KV_CHUNK,
        k_scale=ks,
        v_scale=vs,
        prompt_lens=None if prompt_lens is None else i32(prompt_lens),
        generated_only=generated_only,
    ).cpu()


# bfloat16 only on the GPU: the interpreter's tl.dot (the chunk kernel's) mishandles it.
@pytest.mark.parametrize("dtype", [torch.float16] + ([torch.bfloat16] if torch.cuda.is_available() else []))
def test_generated_rows_equal_decode_rows_and_prompt_rows_the_chunk_kernel(
    device: torch.device, dtype: torch.dtype
) -> None:
    q_lens, ctx_lens, prompt_lens = (list(c) for c in zip(*REQUESTS, strict=True))
    b = _batch(q_lens, ctx_lens, device, seed=7)
    cache = _cache(b, dtype)
    q = b.q.to(dtype)
    assert paged_attention_fma.applies(q, cache[0], cache[2], cache[1], None)
    got = _attend(q, cache, b.qsl, b.seq_lens, b.block_tables, prompt_lens, device)
    chunk_only = _attend(q, cache, b.qsl, b.seq_lens, b.block_tables, None, device)

    # Each row's position, and whether it is a generated token's.
    rows = [(s, ctx + j, ctx + j >= plen) for s, (n, ctx, plen) in enumerate(REQUESTS) for j in range(n)]
    generated = torch.tensor([g for _, _, g in rows])
    assert 0 < int(generated.sum()) < len(rows)

    want = reference.paged_attention(
        q.double(), cache[4].double(), cache[5].double(), b.qsl, b.seq_lens, b.block_tables, 0.125
    )
    assert torch.isfinite(got).all()
    assert rel_err(got[generated], want[generated]) < 2 * TOL[dtype]
    assert rel_err(got[~generated], want[~generated]) < 2 * TOL[dtype]
    assert torch.equal(got[~generated], chunk_only[~generated])

    # The generated rows again, each as a decode row of its own request (one query at its
    # position), in one batch of decode rows.
    gen_rows = [i for i, (_, _, g) in enumerate(rows) if g]

    def as_decode_rows(generated_only: bool) -> torch.Tensor:
        return _attend(
            q[gen_rows],
            cache,
            list(range(len(gen_rows) + 1)),
            [rows[i][1] + 1 for i in gen_rows],
            b.block_tables[[rows[i][0] for i in gen_rows]],
            [prompt_lens[rows[i][0]] for i in gen_rows],
            device,
            generated_only,
        )

    decode = as_decode_rows(False)
    assert torch.equal(decode, got[generated])
    # The same decode rows as a step of generated rows only (a decode graph's): the FMA kernel
    # alone, no chunk kernel or merge launched, the same bits.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(split_kv, "two_phase", _not_launched)
        alone = as_decode_rows(True)
    assert torch.equal(alone, decode)


def test_dispatch_is_off_where_the_kernel_does_not_apply(device: torch.device) -> None:
    """Four query heads per KV head (not measured faster): prompt lengths change no bit."""
    b = _batch([3, 1], [10, 40], device, seed=2, hq=8)
    cache = _cache(b, torch.float16)
    q = b.q.to(torch.float16)
    assert not paged_attention_fma.applies(q, cache[0], cache[2], cache[1], None)
    got = _attend(q, cache, b.qsl, b.seq_lens, b.block_tables, [5, 5], device)
    assert torch.equal(got, _attend(q, cache, b.qsl, b.seq_lens, b.block_tables, None, device))


def test_prompt_lens_of_another_length_are_refused(device: torch.device) -> None:
    b = _batch([3, 1], [10, 40], device, seed=2)
    cache = _cache(b, torch.float16)
    with pytest.raises(ValueError, match=r"prompt_lens\.shape"):
        _attend(b.q.to(torch.float16), cache, b.qsl, b.seq_lens, b.block_tables, [5], device)


# The prompt row's program reduces over no keys (inf - inf in the interpreter) and stores nothing.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_a_prompt_row_in_a_decode_shaped_step_keeps_the_chunk_kernels_bits(device: torch.device) -> None:
    """One row a request (the FMA kernel's one-row programs): the prompt's last token of the
    second request is left to the chunk kernel, the decode rows get the bits they get without it."""
    dtype = torch.float16
    b = _batch([1, 1, 1], [70, 32, 300], device, seed=5)
    cache = _cache(b, dtype)
    q = b.q.to(dtype)
    prompt_lens = [30, 33, 5]  # positions 70, 32 (a prompt row) and 300
    got = _attend(q, cache, b.qsl, b.seq_lens, b.block_tables, prompt_lens, device)
    chunk_only = _attend(q, cache, b.qsl, b.seq_lens, b.block_tables, None, device)
    assert torch.equal(got[1], chunk_only[1])
    keep = [0, 2]
    decode = _attend(
        q[keep], cache, [0, 1, 2], [b.seq_lens[i] for i in keep], b.block_tables[keep], [30, 5], device
    )
    assert torch.equal(got[keep], decode)
    assert not torch.equal(got[keep], chunk_only[keep])  # the FMA kernel did compute them
