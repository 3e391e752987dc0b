"""The engine on CUDA against the CPU path (run on a GPU machine: pytest -m gpu)."""

from __future__ import annotations

import pytest
import torch

from shardinfer import LLM, SamplingParams
from tests.engine.engine_helpers import batch_logits

pytestmark = pytest.mark.gpu


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (5, 33, 70, 2, 129)]


@pytest.mark.parametrize("family", ["qwen3", "mistral", "llama"])
def test_gpu_greedy_fp32_matches_cpu(tiny_checkpoint, family: str) -> None:
    model_dir = tiny_checkpoint(family)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    cpu = LLM(model_dir, device="cpu", dtype="float32")
    prompts = _prompts(cpu.llm_engine.model_config.vocab_size)
    want = [o.outputs[0].token_ids for o in cpu.generate(prompts, params)]
    for eager in (True, False):
        gpu = LLM(model_dir, device="cuda", dtype="float32", enforce_eager=eager)
        got = [o.outputs[0].token_ids for o in gpu.generate(prompts, params)]
        assert got == want, f"enforce_eager={eager}"


def test_gpu_bf16_logits_close_to_fp32(qwen3_dir) -> None:
    ref = LLM(qwen3_dir, device="cpu", dtype="float32")
    prompts = _prompts(ref.llm_engine.model_config.vocab_size)
    want = batch_logits(ref.llm_engine, prompts)
    gpu = LLM(qwen3_dir, device="cuda", dtype="bfloat16", enforce_eager=True)
    got = batch_logits(gpu.llm_engine, prompts)
    for w, g in zip(want, got, strict=True):
        err = (g.float().cpu() - w).abs().max().item()
        assert err <= 0.05 * max(1.0, w.abs().max().item()), err


def test_gpu_sampled_rows_do_not_depend_on_the_batch(qwen3_dir) -> None:
    llm = LLM(qwen3_dir, device="cuda", dtype="bfloat16")
    prompts = _prompts(llm.llm_engine.model_config.vocab_size)
    p = SamplingParams(temperature=1.0, max_tokens=32, ignore_eos=True, seed=5)
    alone = llm.generate([prompts[1]], p)[0].outputs[0]
    others = [SamplingParams(temperature=0.7, max_tokens=m, seed=m) for m in (3, 40, 17, 9)]
    inside = llm.generate(prompts, [others[0], p, *others[1:]])[1].outputs[0]
    assert inside.token_ids == alone.token_ids
    assert inside.logprobs == alone.logprobs


def test_gpu_async_and_speculative_equal_plain_synchronous(qwen3_dir) -> None:
    """On CUDA: asynchronous scheduling (the default) and n-gram speculation change no output."""
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 4, [3, 1, 4, 1, 5, 9, 2, 6]]
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=1.0, max_tokens=30, seed=2, logprobs=2),
        SamplingParams(temperature=0.7, max_tokens=30, seed=4, stop_token_ids=[7]),
    ]

    def run(**kw) -> list[tuple]:
        llm = LLM(qwen3_dir, device="cuda", dtype="bfloat16", **kw)
        return [
            (c.token_ids, c.logprobs, c.finish_reason)
            for o in llm.generate(prompts, params)
            for c in o.outputs
        ]

    want = run(async_scheduling=False)
    assert run() == want
    assert run(speculative_ngram_tokens=3) == want


def test_gpu_steady_decode_steps_never_block_the_host(qwen3_dir) -> None:
    """Asynchronous scheduling only overlaps if launching a step makes no implicit host sync: one
    blocking copy from pageable memory makes the host wait for the whole previous step. In steady
    graphed decode the only wait is the explicit event wait for the previous step's tokens,
    which torch's sync debug mode does not count; anything else raises here."""
    llm = LLM(qwen3_dir, device="cuda", dtype="bfloat16")
    engine = llm.llm_engine
    assert engine.async_scheduling
    prompts = _prompts(engine.model_config.vocab_size)
    for i, ids in enumerate(prompts):
        engine.add_request(
            f"r{i}",
            ids,
            SamplingParams(temperature=1.0, top_p=0.9, max_tokens=64, ignore_eos=True, seed=i, logprobs=2),
        )
    for _ in range(20):  # prefill, then the first graphed decode steps
        engine.step()
        if engine.runner.last_step_graphed and len(engine.scheduler.running) == len(prompts):
            break
    assert engine.runner.last_step_graphed, "decode never reached the CUDA graphs"
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(16):
            engine.step()
            assert engine.runner.last_step_graphed
    finally:
        torch.cuda.set_sync_debug_mode("default")
    while engine.has_unfinished():
        engine.step()


def test_gpu_unset_batch_cap_follows_the_kv_cache(qwen3_dir) -> None:
    """Unset, max_num_seqs is 1024 where the KV cache holds 2048 tokens (or max_model_len) for
    each of 1024 sequences, else 512; the graphs and the scheduler take the cap in effect."""
    from shardinfer.engine.config import KV_TOKENS_PER_SEQ

    large = LLM(qwen3_dir, device="cuda", dtype="bfloat16").llm_engine
    runner = large.runner
    need = 1024 * min(KV_TOKENS_PER_SEQ, runner.max_model_len)  # tokens for 1024 sequences
    tokens = runner.num_blocks * large.config.block_size
    assert tokens >= need
    assert runner.num_seqs == large.scheduler.max_num_seqs == runner.graphs.sizes[-1] == 1024
    token_bytes = sum(t.numel() * t.element_size() for layer in runner.kv_caches for t in layer) / tokens
    half = int(token_bytes * need / 2)  # a cache of half what 1024 sequences need
    small = LLM(qwen3_dir, device="cuda", dtype="bfloat16", kv_cache_memory_bytes=half).llm_engine
    assert small.runner.num_blocks * small.config.block_size < need
    assert small.runner.num_seqs == small.scheduler.max_num_seqs == small.runner.graphs.sizes[-1] == 512
