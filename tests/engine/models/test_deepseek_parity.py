"""DeepSeek-V3 against transformers' DeepseekV3 on random-init tiny checkpoints.

Our model runs several prompts as one varlen batch through the paged latent cache (prefill, then
batched decode steps, absorbed MLA throughout); transformers runs each full sequence without a
cache (expanded MLA). Regimes: with/without query LoRA, YaRN with and without mscale_all_dim,
interleaved and rotate-half RoPE, one group / all groups kept / 2 of 4 groups kept. transformers
5.x masks unchosen groups with -inf like the official code, so it is a valid reference for the
group-limited regime too (older releases masked with 0.0; routing is also checked against an
independent float64 formula in test_deepseek_routing.py). DeepSeek-V2 checkpoints (softmax
routing, plain or group-limited) are compared with transformers' DeepseekV2 the same way.
"""

from __future__ import annotations

import pytest
import torch
from deepseek_helpers import (
    REGIMES,
    V2_REGIMES,
    PagedRunner,
    deepseek_checkpoint,
    generate_batch,
    hf_greedy,
    hf_logits,
    load_hf,
    load_model,
)

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22], list(range(30, 51))]
STEPS = 5


@pytest.mark.parametrize("regime", sorted(REGIMES) + sorted(V2_REGIMES))
def test_logits_and_greedy_match_transformers(regime: str) -> None:
    model_dir = deepseek_checkpoint(regime)
    ours = load_model(model_dir)
    hf = load_hf(model_dir)
    generated, logits = generate_batch(PagedRunner(ours), PROMPTS, STEPS)
    for prompt, gen, got in zip(PROMPTS, generated, logits, strict=True):
        want = hf_logits(hf, prompt + gen[:-1])
        assert got.shape == want.shape
        diff = (got - want).abs().max().item()
        assert diff <= 1e-4, f"{regime}: max abs logit diff {diff}"
        assert gen == hf_greedy(hf, prompt, STEPS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_bytes_per_token_is_latent_only(dtype: torch.dtype) -> None:
    model_dir = deepseek_checkpoint("base")
    model = load_model(model_dir, dtype=dtype)
    hf = model.config.hf
    runner = PagedRunner(model, num_blocks=8)
    per_layer = hf["kv_lora_rank"] + hf["qk_rope_head_dim"]
    size = torch.empty(0, dtype=dtype).element_size()
    assert runner.kv_bytes_per_token() == hf["num_hidden_layers"] * per_layer * size
    # The cache is actually used in that layout: a prefill fills one latent row per token and layer.
    runner.step([("a", PROMPTS[0])])
    slots = [b * runner.block_size + o for b in runner.blocks["a"] for o in range(runner.block_size)]
    for (cache,) in runner.caches:
        rows = cache.view(-1, per_layer)[slots[: len(PROMPTS[0])]]
        assert bool((rows != 0).any(dim=-1).all())


def test_checkpoint_without_mtp_tensors_loads_with_mtp_off() -> None:
    model = load_model(deepseek_checkpoint("base"))
    assert model.config.hf["num_nextn_predict_layers"] == 1
    assert model.num_mtp_layers == 0
    assert model.mtp_kv_cache_specs() == []
