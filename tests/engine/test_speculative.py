"""Speculative decoding (prompt-lookup and MTP drafts) is token-identical to plain decoding, greedy and sampled,
because every drafted position is sampled with the same (seed, position) noise and the logits
do not depend on how the positions were batched."""

from __future__ import annotations

import pytest

from shardinfer import LLM, SamplingParams
from shardinfer.engine.drafting import propose


def test_propose_takes_the_latest_longest_match() -> None:
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert propose(tokens, 2) == [7, 8]  # the suffix [1, 2, 3] last appeared before 7, 8
    assert propose([4, 5, 6, 5], 3) == [6, 5]  # falls back to one-token matches
    assert propose([1, 2, 3], 4) == []
    assert propose(tokens, 0) == []


def _key(outs) -> list[tuple]:
    return [(c.token_ids, c.logprobs, c.top_logprobs, c.text, c.finish_reason) for o in outs for c in o.outputs]


@pytest.mark.parametrize("engine_kwargs", [{}, {"max_num_batched_tokens": 5}, {"num_kv_blocks": 12, "block_size": 8}],
                         ids=["plain", "small-budget", "preempting"])
def test_ngram_speculation_equals_plain_decoding(qwen3_dir, engine_kwargs) -> None:
    plain = LLM(qwen3_dir, device="cpu", dtype="float32", **engine_kwargs)
    spec = LLM(qwen3_dir, device="cpu", dtype="float32", speculative_ngram_tokens=4, **engine_kwargs)
    # Repetitive prompts give the drafter something to copy; a random model repeats itself too.
    base = [5, 6, 7, 8, 9, 10, 11, 12]
    prompts = [base * 3, [20, 21, 22] * 5 + [23], base + [40, 41] * 6, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]
    params = [SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=1.0, max_tokens=25, seed=3),
              SamplingParams(temperature=0.7, top_p=0.9, max_tokens=28, seed=11, stop=["e"]),
              SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop_token_ids=[12])]
    assert _key(spec.generate(prompts, params)) == _key(plain.generate(prompts, params))
    stats = spec.llm_engine.counters
    assert stats["draft_tokens"] > 0 and stats["accepted_draft_tokens"] > 0
    engine = spec.llm_engine
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_speculation_refuses_async_scheduling(qwen3_dir) -> None:
    with pytest.raises(ValueError, match="speculative decoding needs the newest token on the host"):
        LLM(qwen3_dir, speculative_ngram_tokens=2, async_scheduling=True)


def test_mtp_speculation_equals_plain_decoding_on_the_demo_model() -> None:
    """The bundled DeepSeek-V3-architecture model drafts with its trained MTP layer."""
    from pathlib import Path

    model = Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny-dsv3-demo"
    plain = LLM(model, device="cpu", dtype="float32")
    spec = LLM(model, device="cpu", dtype="float32", speculative_mtp=True)
    chats = [[{"role": "user", "content": c}] for c in (
        "What is 4821 + 377?", "Reverse the letters: p a r q u e t",
        "Extract name, age and city as JSON: Vera, 44, lives in Lima.", "Sort these words alphabetically: zebra anchor kitten")]
    params = [SamplingParams(temperature=0.0, max_tokens=40, logprobs=1),
              SamplingParams(temperature=0.8, max_tokens=40, seed=5),
              SamplingParams(temperature=0.0, max_tokens=40),
              SamplingParams(temperature=1.0, top_p=0.9, max_tokens=40, seed=9)]
    assert _key(spec.chat(chats, params)) == _key(plain.chat(chats, params))
    stats = spec.llm_engine.counters
    assert stats["draft_tokens"] > 0
    assert stats["accepted_draft_tokens"] / stats["draft_tokens"] > 0.5  # the MTP head learned something


def test_mtp_speculation_needs_an_mtp_layer(qwen3_dir) -> None:
    with pytest.raises(ValueError, match="has no MTP layer"):
        LLM(qwen3_dir, speculative_mtp=True)
