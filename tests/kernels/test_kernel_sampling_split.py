"""Row-split sampling: the filtered kernel's tokens, float64 log-sum-exp logprobs, batch invariance."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import compiled_variants

from shardinfer.engine.sampling_noise import gumbel_noise as engine_noise
from shardinfer.kernels import reference_sampling, sampling, sampling_split

VOCAB = 2 * 2048 + 37  # three chunks, the last one mostly past the vocabulary


def _rows(b: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, vocab, generator=gen) * 3
    seeds = torch.randint(0, 2**62, (b,), generator=gen, dtype=torch.int64)
    positions = torch.randint(0, 10**6, (b,), generator=gen, dtype=torch.int64)
    return logits, seeds, positions


def _filtered_tokens(
    x: torch.Tensor, temp: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, device: torch.device
) -> torch.Tensor:
    b = x.shape[0]
    off = (torch.full((b,), -1, dtype=torch.int32), torch.ones(b), torch.zeros(b))
    return sampling.sample(*(t.to(device) for t in (x, temp, *off, seeds, positions))).cpu()


def _float64_logprobs(raw: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(raw.double(), dim=-1).gather(1, tokens.view(-1, 1)).view(-1)


def test_tokens_equal_the_filtered_kernel_and_logprobs_equal_float64(device: torch.device) -> None:
    raw, seeds, positions = _rows(5, VOCAB, seed=1)
    temp = torch.tensor([0.0, 1.0, 0.7, 1.6, 0.0])
    got, lps, lse = (
        t.cpu() for t in sampling_split.sample(*(t.to(device) for t in (raw, raw, temp, seeds, positions)))
    )
    assert got.tolist() == _filtered_tokens(raw, temp, seeds, positions, device).tolist()
    noise = engine_noise(seeds, positions, VOCAB)
    off = (torch.full((5,), -1, dtype=torch.int32), torch.ones(5), torch.zeros(5))
    assert got.tolist() == reference_sampling.sample(raw, temp, *off, noise).tolist()
    assert got[0] == raw[0].argmax() and got[4] == raw[4].argmax()
    assert torch.allclose(lps.double(), _float64_logprobs(raw, got), atol=2e-5, rtol=0)
    assert torch.allclose(lse.double(), torch.logsumexp(raw.double(), -1), atol=2e-5, rtol=0)


def test_masked_rows_sample_inside_the_mask_with_raw_logprobs(device: torch.device) -> None:
    raw, seeds, positions = _rows(3, VOCAB, seed=2)
    x = torch.full_like(raw, float("-inf"))
    allowed = [[5, 3000, 4130], [2047, 2048], [17]]
    for r, ids in enumerate(allowed):
        x[r, ids] = raw[r, ids]
    x[2, 4000] = raw[2, 17] + 100.0  # a penalty-like edit: sampling follows x, logprobs follow raw
    temp = torch.tensor([1.0, 0.0, 0.0])
    got, lps, _ = (
        t.cpu() for t in sampling_split.sample(*(t.to(device) for t in (raw, x, temp, seeds, positions)))
    )
    assert got.tolist() == _filtered_tokens(x, temp, seeds, positions, device).tolist()
    assert int(got[0]) in allowed[0] and int(got[1]) == max(allowed[1], key=lambda i: float(raw[1, i]))
    assert int(got[2]) == 4000
    assert torch.allclose(lps.double(), _float64_logprobs(raw, got), atol=2e-5, rtol=0)


def test_ties_go_to_the_lowest_id_across_chunks_and_dead_rows_give_id_0(device: torch.device) -> None:
    raw = torch.full((2, VOCAB), -3.0)
    raw[0, [4100, 2049, 2050]] = 5.0  # a tie between the second and third chunk: 2049 wins
    raw[1] = float("-inf")
    temp = torch.zeros(2)
    seeds, positions = torch.tensor([1, 2]), torch.tensor([3, 4])
    got, _, _ = (
        t.cpu() for t in sampling_split.sample(*(t.to(device) for t in (raw, raw, temp, seeds, positions)))
    )
    assert got.tolist() == [2049, 0] == _filtered_tokens(raw, temp, seeds, positions, device).tolist()


def test_a_row_alone_equals_the_row_in_a_batch(device: torch.device) -> None:
    raw, seeds, positions = _rows(7, VOCAB, seed=3)
    temp = torch.linspace(0.0, 1.5, 7)
    batch = [
        t.cpu() for t in sampling_split.sample(*(t.to(device) for t in (raw, raw, temp, seeds, positions)))
    ]
    for r in (0, 3, 6):
        one = [
            t.cpu()
            for t in sampling_split.sample(
                *(t[r : r + 1].to(device) for t in (raw, raw, temp, seeds, positions))
            )
        ]
        for a, b in zip(one, batch, strict=True):
            assert torch.equal(a, b[r : r + 1])


def test_logprobs_of_given_tokens(device: torch.device) -> None:
    raw, _, _ = _rows(4, VOCAB, seed=4)
    tokens = torch.tensor([0, 2048, VOCAB - 1, 77])
    lps, lse = (t.cpu() for t in sampling_split.logprobs_of(raw.to(device), tokens.to(device)))
    assert torch.allclose(lps.double(), _float64_logprobs(raw, tokens), atol=2e-5, rtol=0)
    assert torch.allclose(lse.double(), torch.logsumexp(raw.double(), -1), atol=2e-5, rtol=0)


def test_rejects_bad_inputs(device: torch.device) -> None:
    raw, seeds, positions = (t.to(device) for t in _rows(2, 10, seed=5))
    temp = torch.ones(2, device=device)
    with pytest.raises(ValueError, match=r"raw.dtype"):
        sampling_split.sample(raw.half(), raw, temp, seeds, positions)
    with pytest.raises(ValueError, match=r"need raw's shape"):
        sampling_split.sample(raw, raw[:, :5].contiguous(), temp, seeds, positions)
    with pytest.raises(ValueError, match=r"temperature.shape"):
        sampling_split.sample(raw, raw, torch.ones(3, device=device), seeds, positions)
    with pytest.raises(ValueError, match=r"tokens.dtype"):
        sampling_split.logprobs_of(raw, torch.zeros(2, dtype=torch.int32, device=device))


@pytest.mark.gpu
def test_real_vocab_on_gpu() -> None:
    dev = torch.device("cuda")
    b, vocab = 256, 151936
    raw, seeds, positions = _rows(b, vocab, seed=6)
    temp = torch.rand(b, generator=torch.Generator().manual_seed(7)) * 1.5
    temp[:16] = 0.0
    got, lps, _ = (
        t.cpu() for t in sampling_split.sample(*(t.to(dev) for t in (raw, raw, temp, seeds, positions)))
    )
    assert torch.equal(got, _filtered_tokens(raw, temp, seeds, positions, dev))
    assert torch.allclose(lps.double(), _float64_logprobs(raw, got), atol=5e-5, rtol=0)
    alone = sampling_split.sample(*(t[40:41].to(dev) for t in (raw, raw, temp, seeds, positions)))
    assert int(alone[0]) == int(got[40]) and float(alone[1]) == float(lps[40])


@pytest.mark.gpu
def test_batch_sizes_compile_nothing_new_on_gpu() -> None:
    """Once the kernels ran at one batch size, other sizes reuse them: a size-dependent pointer
    alignment would make Triton compile a variant mid-run (about a second of stall)."""
    dev = torch.device("cuda")
    vocab = 151936
    gen = torch.Generator(device=dev).manual_seed(3)

    def run(b: int, masked: bool) -> None:
        raw = torch.randn(b, vocab, device=dev, generator=gen)
        x = raw.clone() if masked else raw
        t = torch.ones(b, device=dev)
        ids = torch.arange(b, device=dev, dtype=torch.int64)
        sampling_split.sample(raw, x, t, ids, ids)
        sampling_split.logprobs_of(raw, ids)

    for masked in (False, True):
        run(256, masked)
    torch.cuda.synchronize()
    before = compiled_variants(sampling_split._sample_chunks_kernel, sampling_split._sample_combine_kernel)
    for b in (255, 254, 253, 129, 7, 3, 2):
        for masked in (False, True):
            run(b, masked)
    torch.cuda.synchronize()
    after = compiled_variants(sampling_split._sample_chunks_kernel, sampling_split._sample_combine_kernel)
    assert after == before


def test_the_top_logprob_is_the_lowest_id_of_the_raw_maximum_and_changes_nothing_else(
    device: torch.device,
) -> None:
    from shardinfer.kernels.top_logprob import TopLogprob, fill_reference

    raw, seeds, positions = _rows(6, VOCAB, seed=9)
    raw[1, [4100, 2049, 2050]] = 50.0  # a tie across the second and third chunk: 2049
    raw[2, 77] = float("nan")  # NaN counts as -inf, not as the maximum
    raw[3] = float("-inf")  # nothing but -inf: id 0
    raw[4, 10] = float("inf")
    x = raw.clone()
    x[5, 3] = 1e9  # sampling follows x; the top logprob follows raw
    temp = torch.tensor([1.0, 0.0, 0.7, 0.0, 1.3, 0.0])
    args = [t.to(device) for t in (raw, x, temp, seeds, positions)]
    plain = [t.cpu() for t in sampling_split.sample(*args)]
    top = TopLogprob.empty(6, device)
    with_top = [t.cpu() for t in sampling_split.sample(*args, top=top)]
    for a, b in zip(plain, with_top, strict=True):
        assert torch.equal(a.nan_to_num(), b.nan_to_num())
    want = TopLogprob.empty(6, torch.device("cpu"))
    fill_reference(want, raw, with_top[2])  # over the kernel's own log-sum-exp: the same bits
    assert want.token_ids.tolist()[1:5] == [2049, int(raw[2].nan_to_num(float("-inf")).argmax()), 0, 10]
    assert top.token_ids.cpu().tolist() == want.token_ids.tolist()
    assert torch.equal(top.logprobs.cpu().nan_to_num(), want.logprobs.nan_to_num())
    assert torch.allclose(
        top.logprobs.cpu()[[0, 1, 5]].double(),
        _float64_logprobs(raw[[0, 1, 5]], want.token_ids[[0, 1, 5]]),
        atol=2e-5,
        rtol=0,
    )
    # For tokens chosen elsewhere (the filtered kernel's rows), the same top.
    other = TopLogprob.empty(6, device)
    sampling_split.logprobs_of(args[0], plain[0].to(device), top=other)
    assert other.token_ids.cpu().tolist() == want.token_ids.tolist()
    assert torch.equal(other.logprobs.cpu().nan_to_num(), want.logprobs.nan_to_num())
