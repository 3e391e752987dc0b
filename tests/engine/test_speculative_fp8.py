"""Speculative decoding on FP8 numerics: with FP8 weights, an FP8 KV cache or both, a verify row
reads and writes the cache as the plain decode rows do, so output with drafts equals output
without them under the same numerics, token for token and logprob for logprob. Drafts replay the
plain run (alpha 0.8), so most verify steps accept several of them and store their keys."""

from __future__ import annotations

from typing import Any

import pytest

from shardinfer import LLM, SamplingParams
from tests.engine.speculative_helpers import add_requests, finish, random_prompts, replay_drafts

# The Triton MLA kernel needs qk_rope_head_dim >= 16 and a power-of-two kv_lora_rank. Qwen3 at head
# dim 128 (two query heads per KV head): on an FP8 cache its verify rows, like its decode rows, take
# the FMA kernel (kernels/paged_attention_fma.py).
CUDA_SHAPES = {"deepseek_v3": {"qk_rope_head_dim": 16, "kv_lora_rank": 64}, "qwen3": {"head_dim": 128}}

NUMERICS = [
    {"kv_cache_dtype": "fp8"},
    {"quantization": "fp8"},
    {"quantization": "fp8", "kv_cache_dtype": "fp8"},
]


def _key(outs) -> list[tuple]:
    return [(c.token_ids, c.logprobs, c.top_logprobs, c.finish_reason) for o in outs for c in o.outputs]


def _params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=1.0, max_tokens=36, seed=2, ignore_eos=True),
        SamplingParams(temperature=0.7, top_p=0.9, max_tokens=30, seed=4, ignore_eos=True, logprobs=1),
        SamplingParams(temperature=0.0, max_tokens=25, ignore_eos=True),
    ]


def _check(model_dir: Any, numerics: dict[str, str], **engine: Any) -> None:
    kwargs = {**engine, **numerics, "max_num_seqs": 8}
    plain = LLM(model_dir, **kwargs)
    prompts = random_prompts(plain.llm_engine.model_config.vocab_size, (7, 30, 65, 12), seed=3)
    outs = plain.generate(prompts, _params(), use_tqdm=False)
    spec = LLM(model_dir, speculative="ngram", speculative_depth=3, **kwargs).llm_engine
    replay_drafts(spec, outs, 0.8, seed=6)
    add_requests(spec, prompts, _params())
    assert _key(finish(spec, len(prompts))) == _key(outs)
    stats = spec.stats()
    assert stats["accepted_draft_tokens"] > 0.5 * stats["draft_tokens"] > 0


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("numerics", NUMERICS, ids=["kv", "weights", "both"])
@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
def test_speculation_equals_plain_decoding_on_fp8_numerics(
    tiny_checkpoint, family, numerics, overlap
) -> None:
    _check(tiny_checkpoint(family), numerics, device="cpu", dtype="float32", async_scheduling=overlap)


@pytest.mark.gpu
@pytest.mark.parametrize("numerics", NUMERICS, ids=["kv", "weights", "both"])
@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
def test_gpu_speculation_equals_plain_decoding_on_fp8_numerics(
    tiny_checkpoint, family, numerics, monkeypatch
) -> None:
    """On CUDA: the FP8 kernels, verify graphs and asynchronous scheduling; generated rows on the
    FMA kernel where it applies."""
    from shardinfer.kernels import paged_attention

    monkeypatch.setattr(paged_attention, "FMA_GENERATED_ROWS", True)
    _check(tiny_checkpoint(family, **CUDA_SHAPES.get(family, {})), numerics, device="cuda", dtype="bfloat16")
