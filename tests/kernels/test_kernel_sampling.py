"""Sampling kernel: the engine's noise bit for bit (hash) and the reference's token choice."""

from __future__ import annotations

import pytest
import torch

from shardinfer.engine.sampling_noise import gumbel_noise as engine_noise
from shardinfer.kernels import reference_sampling, sampling


def _scaled_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max(|b|, 1), in float32 epsilons.

    Plain ulps would mislead: g = -log(-log(u)) passes through 0, where one ulp of the inner
    log is thousands of ulps of a tiny result. A wrong hash bit moves g by O(1), i.e. ~1e7 eps.
    """
    err = (a.double() - b.double()).abs() / b.double().abs().clamp_min(1.0)
    return float(err.max()) / torch.finfo(torch.float32).eps


def test_noise_matches_engine_noise(device: torch.device) -> None:
    seeds = torch.tensor([0, 1, 2**62 + 12345, 987654321987], dtype=torch.int64)
    positions = torch.tensor([0, 7, 2**33 + 5, 4095], dtype=torch.int64)
    got = sampling.gumbel_noise(seeds.to(device), positions.to(device), 1000).cpu()
    ref = engine_noise(seeds, positions, 1000)
    # The integer hash is exact; only the device's log may round differently in the last place.
    # A wrong hash bit would move values by far more than a few ulps.
    assert _scaled_err(got, ref) <= 8


def _rows(b: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "logits": torch.randn(b, vocab, generator=gen) * 4,
        "seeds": torch.randint(0, 2**62, (b,), generator=gen, dtype=torch.int64),
        "positions": torch.randint(0, 10**6, (b,), generator=gen, dtype=torch.int64),
    }


def _sample_both(
    r: dict[str, torch.Tensor],
    temp: list[float],
    top_k: list[int],
    top_p: list[float],
    min_p: list[float],
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.tensor(temp, dtype=torch.float32)
    k = torch.tensor(top_k, dtype=torch.int32)
    p = torch.tensor(top_p, dtype=torch.float32)
    mp = torch.tensor(min_p, dtype=torch.float32)
    noise = engine_noise(r["seeds"], r["positions"], r["logits"].shape[1])
    ref = reference_sampling.sample(r["logits"], t, k, p, mp, noise)
    got = sampling.sample(*(x.to(device) for x in (r["logits"], t, k, p, mp, r["seeds"], r["positions"])))
    return got.cpu(), ref


def test_sampled_ids_match_reference(device: torch.device) -> None:
    r = _rows(6, 300, seed=1)
    got, ref = _sample_both(
        r,
        temp=[0.0, 1.0, 0.7, 1.3, 1.0, 0.5],
        top_k=[-1, 5, -1, 50, 1, 20],
        top_p=[1.0, 1.0, 0.9, 0.5, 1.0, 0.8],
        min_p=[0.0, 0.0, 0.0, 0.05, 0.0, 0.1],
        device=device,
    )
    assert got.tolist() == ref.tolist()
    assert got[0] == torch.argmax(r["logits"][0])  # temperature 0 is greedy
    assert got[4] == torch.argmax(r["logits"][4])  # top_k 1 is greedy too


@pytest.mark.parametrize("top_k,top_p,min_p", [(3, 1.0, 0.0), (-1, 0.6, 0.0), (10, 0.9, 0.2)])
def test_many_draws_stay_inside_the_filtered_set(
    device: torch.device, top_k: int, top_p: float, min_p: float
) -> None:
    """One row drawn at 12 positions: every id matches the reference, and the draws vary."""
    b = 12
    logits = (torch.randn(1, 300, generator=torch.Generator().manual_seed(5)) * 2).expand(b, 300).contiguous()
    r = {"logits": logits, "seeds": torch.full((b,), 99, dtype=torch.int64), "positions": torch.arange(b)}
    got, ref = _sample_both(r, [1.0] * b, [top_k] * b, [top_p] * b, [min_p] * b, device)
    assert got.tolist() == ref.tolist()
    assert len(set(got.tolist())) > 1
    if top_k > 0:
        assert set(got.tolist()) <= set(torch.topk(logits[0], top_k).indices.tolist())


def test_greedy_ties_go_to_lowest_id_and_masks_are_respected(device: torch.device) -> None:
    logits = torch.full((2, 4100), -5.0)
    logits[0, [3000, 17, 4099]] = 2.0  # tie across kernel blocks: id 17 wins
    logits[1, :] = float("-inf")
    logits[1, [2500, 4000]] = 0.0  # a grammar leaves two ids: sampling must pick one of them
    r = {"logits": logits, "seeds": torch.tensor([1, 2]), "positions": torch.tensor([3, 4])}
    got, ref = _sample_both(r, [0.0, 1.0], [-1, -1], [1.0, 1.0], [0.0, 0.0], device)
    assert got.tolist() == ref.tolist()
    assert got[0] == 17 and int(got[1]) in (2500, 4000)


def test_rejects_bad_inputs(device: torch.device) -> None:
    r = _rows(2, 10, seed=2)
    logits = r["logits"].to(device)
    ok = {
        "temperature": torch.ones(2, device=device),
        "top_k": torch.zeros(2, dtype=torch.int32, device=device),
        "top_p": torch.ones(2, device=device),
        "min_p": torch.zeros(2, device=device),
        "seeds": r["seeds"].to(device),
        "positions": r["positions"].to(device),
    }
    with pytest.raises(ValueError, match=r"logits.dtype"):
        sampling.sample(logits.half(), **ok)
    with pytest.raises(ValueError, match=r"top_k.dtype"):
        sampling.sample(logits, **{**ok, "top_k": ok["top_k"].long()})
    with pytest.raises(ValueError, match=r"temperature.shape"):
        sampling.sample(logits, **{**ok, "temperature": torch.ones(3, device=device)})
    with pytest.raises(ValueError, match=r"vocab_size"):
        sampling.gumbel_noise(ok["seeds"], ok["positions"], 0)


@pytest.mark.gpu
def test_real_vocab_on_gpu() -> None:
    dev = torch.device("cuda")
    b, vocab = 64, 151936
    r = _rows(b, vocab, seed=3)
    gen = torch.Generator().manual_seed(4)
    temp = (torch.rand(b, generator=gen) * 1.5).tolist()
    temp[:4] = [0.0] * 4
    top_k = torch.randint(-1, 200, (b,), generator=gen).tolist()
    top_p = (0.5 + 0.5 * torch.rand(b, generator=gen)).tolist()
    min_p = (torch.rand(b, generator=gen) * 0.1).tolist()
    got, ref = _sample_both(r, temp, top_k, top_p, min_p, dev)
    assert (got == ref).float().mean() >= 0.98  # differences only from device exp/log rounding at a boundary
    noise_gpu = sampling.gumbel_noise(r["seeds"].to(dev), r["positions"].to(dev), vocab).cpu()
    noise_cpu = engine_noise(r["seeds"], r["positions"], vocab)
    noise_torch_gpu = engine_noise(r["seeds"].to(dev), r["positions"].to(dev), vocab).cpu()
    assert _scaled_err(noise_gpu, noise_cpu) <= 8
    assert torch.equal(noise_gpu, noise_torch_gpu)  # same libdevice log as torch's CUDA log


def test_min_p_zero_is_off_even_for_infinite_logits(device: torch.device) -> None:
    """min_p = 0 keeps every id, so an overflowed (+inf) logit is sampled as the split kernel
    (which has no filters) samples it; exp(x - max) is NaN there and would otherwise drop it."""
    from shardinfer.kernels import sampling_split

    logits = torch.randn(2, 300, generator=torch.Generator().manual_seed(8))
    logits[:, 7] = float("inf")
    r = {"logits": logits, "seeds": torch.tensor([1, 2]), "positions": torch.tensor([3, 4])}
    got, ref = _sample_both(r, [1.0, 0.7], [-1, -1], [1.0, 1.0], [0.0, 0.0], device)
    assert got.tolist() == ref.tolist() == [7, 7]
    split, _, _ = sampling_split.sample(
        *(t.to(device) for t in (logits, logits, torch.tensor([1.0, 0.7]), r["seeds"], r["positions"]))
    )
    assert split.cpu().tolist() == [7, 7]
