"""kv_cache_dtype = "fp8": the cache layout and its size, closeness to the model-dtype cache, and
that batch invariance and prefix caching are unchanged (CPU reference path)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from shardinfer import LLM, SamplingParams
from shardinfer.engine.config import EngineConfig
from shardinfer.engine.kv_cache import bytes_per_block
from shardinfer.engine.models.base import KVLayerSpec
from tests.engine.engine_helpers import batch_logits

FP8 = torch.float8_e4m3fn


def test_bytes_per_block_counts_one_byte_per_value_and_the_scales() -> None:
    dense = KVLayerSpec(((2, 64), (2, 64)))
    # 256 values of one byte plus one float32 scale per head for K and for V, per token.
    assert bytes_per_block([dense], 16, torch.bfloat16, fp8=True) == (256 + 4 * 4) * 16
    assert bytes_per_block([dense], 16, torch.bfloat16) == 256 * 2 * 16
    mla = KVLayerSpec(((576,),))  # 512 latent + 64 rope values: four latent groups and the rope's
    assert bytes_per_block([mla, mla], 64, torch.bfloat16, fp8=True) == 2 * (576 + 5 * 4) * 64


def test_unknown_kv_cache_dtype_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"kv_cache_dtype='int8'.*'auto', 'fp8'"):
        EngineConfig(model="m", kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="quantization='int4'"):
        EngineConfig(model="m", quantization="int4")


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 300, (n,), generator=g).tolist() for n in (6, 33, 40)]


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
def test_fp8_cache_holds_fp8_with_scales_and_stays_close(
    tiny_checkpoint: Callable[..., Path], family: str
) -> None:
    model_dir = tiny_checkpoint(family)
    fp8 = LLM(model_dir, device="cpu", dtype="float32", kv_cache_dtype="fp8", max_num_batched_tokens=512)
    plain = LLM(model_dir, device="cpu", dtype="float32", max_num_batched_tokens=512)
    layer = fp8.llm_engine.runner.kv_caches[0]
    n_entries = len(fp8.llm_engine.model.kv_cache_specs()[0].entries)
    assert [t.dtype for t in layer] == [FP8] * n_entries + [torch.float32] * n_entries
    prompts = _prompts()
    for got, want in zip(
        batch_logits(fp8.llm_engine, prompts), batch_logits(plain.llm_engine, prompts), strict=True
    ):
        diff = (torch.log_softmax(got, -1) - torch.log_softmax(want, -1)).abs().max().item()
        assert 0 < diff < 0.25  # K and V rounded to 3-bit mantissas; nothing else differs


def test_fp8_cache_rows_are_batch_and_prefix_cache_invariant(tiny_checkpoint: Callable[..., Path]) -> None:
    model_dir = tiny_checkpoint("qwen3")
    params = SamplingParams(temperature=0.9, seed=11, max_tokens=10, ignore_eos=True, logprobs=1)
    prompts = _prompts()
    shared = [*prompts[2][:32], 7, 9]  # its first 32 tokens (two blocks) come from the prefix cache below

    def key(out) -> tuple:  # type: ignore[no-untyped-def]
        c = out.outputs[0]
        return tuple(c.token_ids), tuple(c.logprobs)

    cached = LLM(model_dir, device="cpu", dtype="float32", kv_cache_dtype="fp8", block_size=16)
    batch = cached.generate(prompts, params)
    hit = cached.generate([shared], params)[0]
    assert cached.llm_engine.stats()["prefix_cache_hit_rate"] > 0
    fresh = LLM(
        model_dir,
        device="cpu",
        dtype="float32",
        kv_cache_dtype="fp8",
        block_size=16,
        enable_prefix_caching=False,
    )
    assert key(fresh.generate([shared], params)[0]) == key(hit)
    assert key(fresh.generate([prompts[1]], params)[0]) == key(batch[1])


# The Triton MLA kernel needs qk_rope_head_dim >= 16 and a power-of-two kv_lora_rank.
GPU_FAMILIES = [
    (
        "qwen3",
        dict(
            hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2, head_dim=64
        ),
    ),
    ("deepseek_v3", dict(qk_rope_head_dim=16, kv_lora_rank=64)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("family, overrides", GPU_FAMILIES, ids=[f for f, _ in GPU_FAMILIES])
def test_gpu_fp8_weights_and_cache_rows_alone_equal_rows_in_batches(
    tiny_checkpoint: Callable[..., Path], family: str, overrides: dict
) -> None:
    """The FP8 GEMMs, the FP8 fused MoE and the FP8 cache under CUDA graphs: a row's tokens and
    logprobs alone, in batches of 8 and among 64 rows are the same."""
    llm = LLM(
        tiny_checkpoint(family, **overrides),
        device="cuda",
        dtype="bfloat16",
        quantization="fp8",
        kv_cache_dtype="fp8",
        max_num_seqs=64,
    )
    g = torch.Generator().manual_seed(9)
    prompts = [
        torch.randint(0, 300, (int(n),), generator=g).tolist()
        for n in torch.randint(2, 60, (16,), generator=g)
    ]
    params = [
        SamplingParams(temperature=0.8, max_tokens=24, seed=i, ignore_eos=True, logprobs=1) for i in range(16)
    ]

    def key(outs) -> list[tuple]:  # type: ignore[no-untyped-def]
        return [(tuple(o.outputs[0].token_ids), tuple(o.outputs[0].logprobs)) for o in outs]

    alone = [key(llm.generate([p], [q]))[0] for p, q in zip(prompts, params, strict=True)]
    by8 = [k for i in range(0, 16, 8) for k in key(llm.generate(prompts[i : i + 8], params[i : i + 8]))]
    filler = [torch.randint(0, 300, (40,), generator=g).tolist() for _ in range(48)]
    big = key(llm.generate(prompts + filler, params + [params[0]] * 48))[:16]
    assert by8 == alone and big == alone
