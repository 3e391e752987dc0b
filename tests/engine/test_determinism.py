"""Bitwise-identical tokens and logprobs whatever the batching, chunking, caching or preemption."""

from __future__ import annotations

import pytest
import torch

from shardinfer import LLM, SamplingParams
from shardinfer.engine.seeds import sample_seed
from tests.engine.engine_helpers import output_key

SAMPLED = SamplingParams(
    temperature=0.9, top_p=0.95, top_k=50, max_tokens=24, seed=1234, ignore_eos=True, logprobs=3
)


def _prompts(n: int, vocab: int, shared_prefix: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    prefix = torch.randint(0, vocab, (shared_prefix,), generator=g).tolist()
    return [
        prefix
        + torch.randint(0, vocab, (int(torch.randint(3, 40, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def baseline(qwen3_dir):
    llm = LLM(qwen3_dir, device="cpu", dtype="float32", enable_prefix_caching=False)
    vocab = llm.llm_engine.model_config.vocab_size
    prompts = _prompts(6, vocab, shared_prefix=37)
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=2)
    return prompts, output_key(llm.generate(prompts, greedy)), output_key(llm.generate(prompts, SAMPLED))


def _run(model_dir, prompts, **engine_kwargs):
    llm = LLM(model_dir, device="cpu", dtype="float32", **engine_kwargs)
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=2)
    return llm, output_key(llm.generate(prompts, greedy)), output_key(llm.generate(prompts, SAMPLED))


def test_prefix_caching_on_equals_off(qwen3_dir, baseline) -> None:
    prompts, greedy, sampled = baseline
    llm, g, s = _run(qwen3_dir, prompts, enable_prefix_caching=True)
    assert g == greedy and s == sampled
    assert llm.llm_engine.block_manager.hit_tokens > 0  # the shared prefix was really reused


@pytest.mark.parametrize("budget", [1, 3, 16, 53])
def test_chunked_prefill_any_chunk_size(qwen3_dir, baseline, budget: int) -> None:
    prompts, greedy, sampled = baseline
    _, g, s = _run(qwen3_dir, prompts, max_num_batched_tokens=budget)
    assert g == greedy and s == sampled


def test_forced_preemption(qwen3_dir, baseline) -> None:
    prompts, greedy, sampled = baseline
    llm, g, s = _run(qwen3_dir, prompts, num_kv_blocks=10, block_size=16)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert g == greedy and s == sampled


def test_seeded_request_alone_vs_in_batch_of_16(qwen3_dir) -> None:
    llm = LLM(qwen3_dir, device="cpu", dtype="float32")
    vocab = llm.llm_engine.model_config.vocab_size
    target, *others = _prompts(17, vocab)
    alone = llm.generate([target], SAMPLED)[0].outputs[0]
    noisy = [
        SamplingParams(temperature=t, max_tokens=m, seed=i)
        for i, (t, m) in enumerate([(1.3, 5), (0.0, 30), (0.5, 12), (1.0, 40)] * 4)
    ]
    outs = llm.generate([*others[:8], target, *others[8:]], [*noisy[:8], SAMPLED, *noisy[8:]])
    inside = outs[8].outputs[0]
    assert (inside.token_ids, inside.logprobs, inside.top_logprobs) == (
        alone.token_ids,
        alone.logprobs,
        alone.top_logprobs,
    )


def test_n_samples_equal_single_requests_with_derived_seeds(qwen3_dir) -> None:
    llm = LLM(qwen3_dir, device="cpu", dtype="float32")
    prompt = _prompts(1, llm.llm_engine.model_config.vocab_size)[0]
    many = llm.generate([prompt], SAMPLED.replace(n=4))[0].outputs
    singles = [
        llm.generate([prompt], SAMPLED.replace(seed=sample_seed(SAMPLED.seed, j)))[0].outputs[0]
        for j in range(4)
    ]
    assert [(c.token_ids, c.logprobs) for c in many] == [(c.token_ids, c.logprobs) for c in singles]
    assert len({tuple(c.token_ids) for c in many}) > 1  # the samples differ from each other
    assert [c.index for c in many] == [0, 1, 2, 3]


def test_sliding_window_model_holds_only_the_window(tiny_checkpoint) -> None:
    """Mistral-style attention: blocks behind the window go back to the pool while generating,
    and the output equals a run with room for every block."""
    model_dir = tiny_checkpoint("mistral", sliding_window=12, num_key_value_heads=1)
    roomy = LLM(model_dir, device="cpu", dtype="float32", block_size=4, num_kv_blocks=64)
    roomy.llm_engine.scheduler.sliding_window = None  # the reference keeps every block
    params = SamplingParams(temperature=0.8, max_tokens=60, seed=3, ignore_eos=True, logprobs=1)
    want = roomy.generate([[5, 6, 7, 8, 9]], params)[0].outputs[0]
    engine = LLM(model_dir, device="cpu", dtype="float32", block_size=4, num_kv_blocks=64).llm_engine
    engine.add_request("r", [5, 6, 7, 8, 9], params)
    held = []
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
        held.append(engine.block_manager.num_blocks - engine.block_manager.num_free_blocks)
    assert max(held) <= 12 // 4 + 2  # the window's blocks, the one being written, one partial
    got = outs[0].outputs[0]
    assert (got.token_ids, got.logprobs) == (want.token_ids, want.logprobs)
