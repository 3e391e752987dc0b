"""DeepSeek-V3 end to end through `LLM`: greedy tokens equal transformers' greedy continuation, the
engine's KV cache holds only the latent, and prefix caching / chunked prefill leave tokens and
logprobs bitwise unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from deepseek_helpers import deepseek_checkpoint, hf_greedy, load_hf

from shardinfer import LLM, SamplingParams
from tests.engine.engine_helpers import output_key

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=8, seed=7, ignore_eos=True, logprobs=2)
SHARED = [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
PROMPTS = [[*SHARED, 40, 41, 42], [*SHARED, 50], [60, 61, 62, 63, 64], SHARED[:7]]


def _run(model_dir: Path, **engine_kwargs: object) -> tuple[LLM, list[tuple], list[tuple]]:
    llm = LLM(model_dir, device="cpu", dtype="float32", block_size=4, **engine_kwargs)
    return llm, output_key(llm.generate(PROMPTS, GREEDY)), output_key(llm.generate(PROMPTS, SAMPLED))


@pytest.fixture(scope="module")
def baseline() -> tuple[Path, list[tuple], list[tuple]]:
    model_dir = deepseek_checkpoint("group_limited")
    _, greedy, sampled = _run(model_dir, enable_prefix_caching=False)
    return model_dir, greedy, sampled


def test_llm_greedy_equals_transformers(baseline: tuple[Path, list[tuple], list[tuple]]) -> None:
    model_dir, greedy, _ = baseline
    hf = load_hf(model_dir)
    for prompt, (tokens, _, _) in zip(PROMPTS, greedy, strict=True):
        assert tokens == hf_greedy(hf, prompt, GREEDY.max_tokens)


def test_llm_kv_cache_is_latent_only() -> None:
    model_dir = deepseek_checkpoint("base")
    for dtype, size in (("float32", 4), ("bfloat16", 2)):
        engine = LLM(model_dir, device="cpu", dtype=dtype, num_kv_blocks=8, block_size=4).llm_engine
        cfg = engine.model_config.hf
        slots = 8 * 4
        allocated = sum(t.untyped_storage().nbytes() for entry in engine.kv_caches for t in entry)
        assert (
            allocated // slots
            == cfg["num_hidden_layers"] * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * size
        )
        assert all(t.dtype == getattr(torch, dtype) for entry in engine.kv_caches for t in entry)


def test_prefix_caching_is_bitwise_identical(baseline: tuple[Path, list[tuple], list[tuple]]) -> None:
    model_dir, greedy, sampled = baseline
    llm, g, s = _run(model_dir, enable_prefix_caching=True)
    assert g == greedy and s == sampled
    assert llm.llm_engine.block_manager.hit_tokens > 0  # the shared prefix really came from the cache


@pytest.mark.parametrize("budget", [1, 6])
def test_chunked_prefill_is_bitwise_identical(
    baseline: tuple[Path, list[tuple], list[tuple]], budget: int
) -> None:
    model_dir, greedy, sampled = baseline
    _, g, s = _run(model_dir, max_num_batched_tokens=budget)
    assert g == greedy and s == sampled
