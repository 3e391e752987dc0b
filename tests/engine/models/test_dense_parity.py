"""Every dense family against transformers on the same random-init checkpoint (fp32)."""

from __future__ import annotations

import pytest
import torch

from shardinfer import LLM, SamplingParams
from tests.engine.engine_helpers import batch_logits
from tests.engine.hf_reference import hf_greedy, hf_logits, hf_model
from tests.engine.models.deepseek_helpers import hf_greedy as recomputed_greedy

CASES = {
    "llama-tied-llama3": (
        "llama",
        dict(
            tie_word_embeddings=True,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
    "llama-linear-bias": (
        "llama",
        dict(attention_bias=True, rope_scaling={"rope_type": "linear", "factor": 2.0}),
    ),
    "qwen2-bias-gqa4": ("qwen2", dict(num_attention_heads=8, num_key_value_heads=2)),
    "qwen3-qknorm-headdim": ("qwen3", dict(head_dim=24, tie_word_embeddings=True)),
    "qwen3-yarn": (
        "qwen3",
        dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    ),
    "mistral-window": ("mistral", dict(sliding_window=12, num_key_value_heads=1)),
    # The first layer attends to everything, the second within 12 tokens (Qwen2's max_window_layers).
    "qwen2-mixed-window": ("qwen2", dict(use_sliding_window=True, sliding_window=12, max_window_layers=1)),
}

PROMPT_LENGTHS = (5, 17, 40, 1)


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_and_greedy_match_transformers(case: str, tiny_checkpoint) -> None:
    family, overrides = CASES[case]
    model_dir = tiny_checkpoint(family, **overrides)
    llm = LLM(model_dir, device="cpu", dtype="float32", max_num_batched_tokens=512)
    ref = hf_model(model_dir)
    prompts = _prompts(llm.llm_engine.model_config.vocab_size)

    ours = batch_logits(llm.llm_engine, prompts)
    for ids, got in zip(prompts, ours, strict=True):
        want = hf_logits(ref, ids)
        assert (got - want).abs().max().item() <= 1e-4

    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
    for ids, out in zip(prompts, outs, strict=True):
        want_ids, want_lps = hf_greedy(ref, ids, 32)
        got = out.outputs[0]
        assert got.token_ids == want_ids
        got_lps = torch.tensor(got.logprobs)
        expected = want_lps[torch.arange(32), torch.tensor(want_ids)]
        assert (got_lps - expected).abs().max().item() <= 1e-4
        assert got.finish_reason == "length"


def test_prompt_logprobs_match_transformers(qwen3_dir) -> None:
    llm = LLM(qwen3_dir, device="cpu", dtype="float32")
    ref = hf_model(qwen3_dir)
    prompt = _prompts(llm.llm_engine.model_config.vocab_size)[2]
    out = llm.generate([prompt], SamplingParams(max_tokens=1, prompt_logprobs=3, temperature=0.0))[0]
    want = hf_logits(ref, prompt).log_softmax(-1)
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    got = torch.tensor(out.prompt_logprobs[1:])
    expected = want[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    assert (got - expected).abs().max().item() <= 1e-4
    assert out.prompt_top_logprobs is not None
    top = out.prompt_top_logprobs[5]
    assert top is not None
    assert [t for t, _ in top] == torch.topk(want[4], 3).indices.tolist()


def test_llama_ignores_a_window_in_its_config_as_transformers_forward_does(tiny_checkpoint) -> None:
    """transformers' Llama attention has no window; its cached generate() would window the cache
    anyway (the cache reads config.sliding_window), so the reference recomputes without a cache."""
    model_dir = tiny_checkpoint("llama", sliding_window=12)
    llm = LLM(model_dir, device="cpu", dtype="float32")
    ref = hf_model(model_dir)
    prompt = _prompts(llm.llm_engine.model_config.vocab_size)[2]
    (got,) = batch_logits(llm.llm_engine, [prompt])
    assert (got - hf_logits(ref, prompt)).abs().max().item() <= 1e-4
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    assert out.outputs[0].token_ids == recomputed_greedy(ref, prompt, 12)
