"""Speculative decoding on CUDA (run on a GPU machine: pytest -m gpu): asynchronous scheduling,
verify rows in CUDA graphs, and output equal to plain decoding token for token and logprob for
logprob (bf16, batch invariance on)."""

from __future__ import annotations

import pytest
import torch

from shardinfer import LLM, SamplingParams
from tests.engine.speculative_helpers import (
    DEMO,
    add_requests,
    finish,
    random_prompts,
    replay_drafts,
    replay_setup,
)

pytestmark = pytest.mark.gpu


def _key(outs) -> list[tuple]:
    return [(c.token_ids, c.logprobs, c.top_logprobs, c.finish_reason) for o in outs for c in o.outputs]


def _workload(vocab: int) -> tuple[list[list[int]], list[SamplingParams]]:
    rand = random_prompts(vocab, (5, 40, 90, 3, 17, 64), seed=7)
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 4, *rand]
    params = [
        SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=1.0, max_tokens=40, seed=2),
        SamplingParams(temperature=0.7, top_p=0.9, max_tokens=36, seed=4, stop_token_ids=[7]),
        SamplingParams(temperature=0.9, max_tokens=30, seed=5, repetition_penalty=1.2),
        SamplingParams(temperature=0.0, max_tokens=33, min_tokens=10, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=20, max_tokens=52, seed=6, ignore_eos=True),
        SamplingParams(temperature=0.8, max_tokens=45, seed=8, ignore_eos=True, logprobs=1),
        SamplingParams(temperature=0.0, max_tokens=29, ignore_eos=True),
    ]
    return prompts, params


def _run_with_replay(llm: LLM, prompts, params, outs, alpha: float) -> list[tuple]:
    """Requests r0, r1, ... drafted by replaying `outs` (the plain run's outputs)."""
    engine = llm.llm_engine
    replay_drafts(engine, outs, alpha, seed=3)
    add_requests(engine, prompts, params)
    return _key(finish(engine, len(prompts)))


@pytest.mark.parametrize(
    "engine_kwargs",
    [{"max_num_seqs": 16}, {"max_num_seqs": 3}, {"max_num_seqs": 16, "num_kv_blocks": 24, "block_size": 8}],
    ids=["plain", "admitting", "preempting"],
)
def test_gpu_ngram_and_replay_speculation_equal_plain(qwen3_dir, engine_kwargs) -> None:
    """Spec on (asynchronous, verify graphs) against spec off (asynchronous, decode graphs)."""
    plain = LLM(qwen3_dir, device="cuda", dtype="bfloat16", **engine_kwargs)
    prompts, params = _workload(plain.llm_engine.model_config.vocab_size)
    outs = plain.generate(prompts, params)
    want = _key(outs)
    ngram = LLM(
        qwen3_dir, device="cuda", dtype="bfloat16", speculative="ngram", speculative_depth=3, **engine_kwargs
    )
    assert ngram.llm_engine.async_scheduling
    assert _key(ngram.generate(prompts, params)) == want
    replay = LLM(
        qwen3_dir, device="cuda", dtype="bfloat16", speculative="ngram", speculative_depth=2, **engine_kwargs
    )
    assert _run_with_replay(replay, prompts, params, outs, 0.8) == want
    stats = replay.llm_engine.stats()
    assert stats["accepted_draft_tokens"] > 0.4 * stats["draft_tokens"]
    assert stats["graphed_verify_steps"] > 0
    if "num_kv_blocks" in engine_kwargs:
        assert replay.llm_engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("depth", [1, 2])
def test_gpu_mtp_speculation_equals_plain_on_the_demo_model(depth: int) -> None:
    """The DeepSeek-V3-architecture demo model drafts with its MTP layer on the device (depth 2:
    the layer chained on its own output)."""
    plain = LLM(DEMO, device="cuda", dtype="bfloat16", max_num_seqs=4)
    chats = [
        [{"role": "user", "content": c}]
        for c in (
            "What is 4821 + 377?",
            "Reverse the letters: p a r q u e t",
            "Extract name, age and city as JSON: Vera, 44, lives in Lima.",
            "Sort these words alphabetically: zebra anchor",
            "Count the vowels in 'encyclopedia'.",
            "What is 12 times 13?",
        )
    ]
    params = [
        SamplingParams(temperature=0.0, max_tokens=48, logprobs=1),
        SamplingParams(temperature=0.8, max_tokens=48, seed=5),
        SamplingParams(temperature=0.0, max_tokens=48),
        SamplingParams(temperature=1.0, top_p=0.9, max_tokens=48, seed=9),
        SamplingParams(temperature=0.6, max_tokens=40, seed=1, repetition_penalty=1.1),
        SamplingParams(temperature=0.0, max_tokens=40, min_tokens=8),
    ]
    want = _key(plain.chat(chats, params))
    spec = LLM(
        DEMO, device="cuda", dtype="bfloat16", max_num_seqs=4, speculative="mtp", speculative_depth=depth
    )
    assert spec.llm_engine.async_scheduling
    assert _key(spec.chat(chats, params)) == want
    stats = spec.llm_engine.stats()
    assert stats["draft_tokens"] > 0 and stats["accepted_draft_tokens"] > 0
    assert stats["graphed_verify_steps"] > 0
    # The requests that may not draft (penalties, min_tokens) pad the verify graphs' steps: the
    # MTP layer runs as a graph in that padded layout too.
    assert stats["graphed_mtp_steps"] > 0


def test_gpu_speculative_steps_never_block_the_host(qwen3_dir) -> None:
    """A speculative step in steady graphed decoding (drafts chosen on the device after the
    previous step's rejections, verify graph, acceptance counted on the device) makes no host
    sync; anything that does raises under torch's sync debug mode."""
    engine, outs = replay_setup(
        qwen3_dir, 3, speculative="ngram", speculative_depth=3, speculative_budget="fixed"
    )
    for _ in range(20):  # prefill, then the first graphed verify steps
        engine.step()
        if engine.runner.last_step_width == 4 and len(engine.scheduler.running) == len(outs):
            break
    assert engine.runner.last_step_width == 4, "decode never reached the verify graphs"
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(12):
            engine.step()
            assert engine.runner.last_step_width == 4
    finally:
        torch.cuda.set_sync_debug_mode("default")
    got = finish(engine, len(outs))
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in outs]
