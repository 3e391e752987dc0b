"""Sampler semantics against float64 references, and stop conditions end to end."""

from __future__ import annotations

import math

import pytest
import torch

from shardinfer import LLM, SamplingParams
from shardinfer.engine.sampler import GrammarMasks, SamplingRow, sample
from shardinfer.engine.sampling_noise import gumbel_noise

V = 12


def _row(
    params: SamplingParams, seed: int = 0, position: int = 0, out: list[int] | None = None
) -> SamplingRow:
    return SamplingRow(params, seed, position, [1, 2], out or [], [])


def _logits() -> torch.Tensor:
    return torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, 3.0, -2.0, 0.25, 0.75, 1.25]])


def test_greedy_is_argmax_with_ties_to_lowest_id() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    assert sample(logits, [_row(SamplingParams(temperature=0.0))]).token_ids == [1]


def test_gumbel_max_matches_softmax_distribution() -> None:
    # Frequencies over many (seed, position) keys approach softmax(logits / T), computed in float64.
    logits = _logits()
    t = 0.7
    p = SamplingParams(temperature=t)
    n = 6000
    seeds = torch.arange(n, dtype=torch.int64)
    noise = gumbel_noise(seeds, torch.full((n,), 5), V)
    picks = torch.argmax(logits / t + noise, dim=-1)
    freq = torch.bincount(picks, minlength=V).double() / n
    want = torch.softmax(logits[0].double() / t, -1)
    assert (freq - want).abs().max().item() < 0.02
    # The engine's sampler makes the same choice as the formula, row by row.
    for s in range(20):
        got = sample(logits, [_row(p, seed=s, position=5)]).token_ids[0]
        assert got == int(torch.argmax(logits[0] / t + noise[s]))


@pytest.mark.parametrize(
    "params, allowed",
    [
        (SamplingParams(temperature=1.0, top_k=3), {7, 0, 1}),
        (SamplingParams(temperature=1.0, top_p=0.5), None),
        (SamplingParams(temperature=1.0, min_p=0.3), None),
    ],
)
def test_truncation_keeps_only_the_allowed_set(params: SamplingParams, allowed) -> None:
    logits = _logits()
    probs = torch.softmax(logits[0].double(), -1)
    if allowed is None and params.top_p < 1:
        order = torch.argsort(probs, descending=True).tolist()
        allowed, mass = set(), 0.0
        for tok in order:  # smallest prefix of the sorted distribution reaching top_p
            allowed.add(tok)
            mass += probs[tok].item()
            if mass >= params.top_p:
                break
    if allowed is None:
        allowed = {i for i in range(V) if probs[i] >= params.min_p * probs.max()}
    seen = {sample(logits, [_row(params, seed=s)]).token_ids[0] for s in range(300)}
    assert seen == allowed


def test_penalties_match_float64_formula() -> None:
    logits = _logits()
    p = SamplingParams(temperature=0.0, repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.25)
    out_tokens = [7, 7, 0]
    ref = logits[0].double().clone()
    for tok in {1, 2, 7, 0}:  # prompt [1, 2] + output
        ref[tok] = ref[tok] / 1.5 if ref[tok] > 0 else ref[tok] * 1.5
    for tok, count in ((7, 2), (0, 1)):
        ref[tok] -= 0.25 * count + 0.5
    got = sample(logits, [_row(p, out=out_tokens)]).token_ids[0]
    assert got == int(torch.argmax(ref))


def test_logprobs_are_raw_model_logprobs_whatever_the_processing() -> None:
    logits = _logits()
    p = SamplingParams(temperature=0.3, top_k=2, repetition_penalty=2.0, logprobs=4)
    res = sample(logits, [_row(p, seed=3)])
    raw = torch.log_softmax(logits[0].double(), -1)
    assert math.isclose(res.logprobs[0], raw[res.token_ids[0]].item(), abs_tol=1e-6)
    top = res.top_logprobs[0]
    assert top is not None
    assert [t for t, _ in top] == torch.argsort(raw, descending=True)[:4].tolist()


@pytest.fixture(scope="module")
def llm(qwen3_dir) -> LLM:
    return LLM(qwen3_dir, device="cpu", dtype="float32")


def test_stop_string_is_cut_from_text(llm: LLM) -> None:
    free = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))[
        0
    ].outputs[0]
    text = free.text
    stop = text[5:8]
    assert len(stop) == 3 and text.find(stop) >= 5
    out = llm.generate(
        ["Hello"], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop=[stop])
    )[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[: text.find(stop)]
    assert out.token_ids == free.token_ids[: len(out.token_ids)]


def test_stop_token_ids_min_tokens_and_max_tokens(llm: LLM) -> None:
    free = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[
        0
    ].outputs[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    stop_id = free.token_ids[3]
    first = free.token_ids.index(stop_id)
    out = llm.generate(
        ["Hello"], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_id])
    )[0].outputs[0]
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[: first + 1]
    # min_tokens blocks the stop id until enough tokens exist.
    late = llm.generate(
        ["Hello"],
        SamplingParams(
            temperature=0.0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_id], min_tokens=first + 2
        ),
    )[0].outputs[0]
    assert len(late.token_ids) >= first + 2 and stop_id not in late.token_ids[: first + 2]


def test_chat_uses_the_template(llm: LLM) -> None:
    msgs = [{"role": "user", "content": "Hello there"}]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    chat = llm.chat([msgs], params)[0]
    text = "<|bos|><|user|>Hello there<|end|><|assistant|>"
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    assert chat.prompt_token_ids == ids
    assert chat.outputs[0].token_ids == llm.generate([ids], params)[0].outputs[0].token_ids


def test_chat_template_runs_sandboxed(tmp_path, qwen3_dir) -> None:
    import json
    import shutil

    for f in qwen3_dir.iterdir():
        shutil.copy(f, tmp_path / f.name)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    llm = LLM(tmp_path, device="cpu")
    with pytest.raises(ValueError, match="chat template failed to render"):
        llm.chat([[{"role": "user", "content": "x"}]])


def _bitmask(allowed: list[set[int]]) -> torch.Tensor:
    """int32 [len(allowed), 1] bitmask (V <= 32) allowing each row's set."""
    return torch.tensor(
        [[sum(1 << t for t in ids) - (1 << 32 if 31 in ids else 0)] for ids in allowed], dtype=torch.int32
    )


@pytest.mark.parametrize("constrained", [[0, 1, 2, 3], [1, 3], [2]], ids=["all", "some", "one"])
def test_grammar_masks_equal_masking_each_row_alone(constrained: list[int]) -> None:
    """Masks applied to the whole batch at once, alongside penalties and blocked ids, choose what
    each row chooses alone with its disallowed logits at -inf; the caller's logits are untouched."""
    torch.manual_seed(0)
    logits = torch.randn(4, V)
    rows = [
        _row(SamplingParams(temperature=1.0), seed=1, position=4),
        _row(SamplingParams(temperature=1.0, repetition_penalty=1.5), seed=2, out=[0, 3, 3]),
        SamplingRow(SamplingParams(temperature=0.7), 3, 2, [1], [5], [7, 9]),  # blocked ids
        _row(SamplingParams(temperature=0.0), position=1),
    ]
    allowed = [{0, 3, 7}, {1, 2, 3, 11}, {5, 7, 9, 10}, {4, 8}]
    before = logits.clone()
    got = sample(logits, rows, GrammarMasks(_bitmask([allowed[i] for i in constrained]), constrained))
    assert logits.equal(before)
    raw = torch.log_softmax(logits.double(), dim=-1)  # the unmasked model distribution, float64
    for i, row in enumerate(rows):
        alone = logits[i : i + 1].clone()
        if i in constrained:
            alone[0, [t for t in range(V) if t not in allowed[i]]] = float("-inf")
            assert got.token_ids[i] in allowed[i]
        assert got.token_ids[i] == sample(alone, [row]).token_ids[0]
        # Within float32 rounding of the raw logprob (a masked or penalised one is far off).
        assert abs(got.logprobs[i] - raw[i, got.token_ids[i]].item()) < 1e-6
