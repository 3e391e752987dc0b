"""DeepSeek config.json files that leave MoE keys out: the engine reads them as transformers does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import transformers
from deepseek_helpers import PagedRunner, deepseek_checkpoint, generate_batch, hf_logits, load_hf, load_model

from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.deepseek_block import is_moe_layer
from shardinfer.engine.models.deepseek_moe import RoutingConfig, moe_setting
from shardinfer.errors import CheckpointError

# Every key a DeepSeek config needs except the MoE ones whose defaults are under test.
_MINIMAL = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=5,
    num_attention_heads=2,
    num_key_value_heads=2,
    kv_lora_rank=16,
    q_lora_rank=None,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=8,
    n_routed_experts=16,
    num_experts_per_tok=2,
)
_FAMILIES = {
    "deepseek_v3": ("DeepseekV3ForCausalLM", transformers.DeepseekV3Config),
    "deepseek_v2": ("DeepseekV2ForCausalLM", transformers.DeepseekV2Config),
}


@pytest.mark.parametrize("model_type", sorted(_FAMILIES))
def test_missing_moe_keys_take_transformers_defaults(model_type: str) -> None:
    arch, config_cls = _FAMILIES[model_type]
    raw: dict[str, Any] = dict(_MINIMAL, model_type=model_type, architectures=[arch])
    want = config_cls(**_MINIMAL)
    ours = ModelConfig.from_dict(raw)
    routing = RoutingConfig(raw)
    assert routing.routed_scaling_factor == want.routed_scaling_factor
    if model_type == "deepseek_v3":  # V2's default router (greedy) does not group
        assert (routing.n_group, routing.topk_group) == (want.n_group, want.topk_group)
    assert moe_setting(raw, "n_shared_experts") == want.n_shared_experts
    first_moe = next(i for i in range(ours.num_hidden_layers) if is_moe_layer(ours, i))
    assert first_moe == want.first_k_dense_replace


def test_checkpoint_without_routed_scaling_factor_matches_transformers(tmp_path: Path) -> None:
    model_dir = shutil.copytree(deepseek_checkpoint("base"), tmp_path / "v3")
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg.pop("routed_scaling_factor") == transformers.DeepseekV3Config().routed_scaling_factor
    (model_dir / "config.json").write_text(json.dumps(cfg))
    prompts = [[5, 6, 7, 8, 9, 10, 11], list(range(30, 51))]
    _, logits = generate_batch(PagedRunner(load_model(model_dir)), prompts, 1)
    hf = load_hf(model_dir)
    for prompt, got in zip(prompts, logits, strict=True):
        assert (got - hf_logits(hf, prompt)).abs().max().item() <= 1e-4


def test_a_config_whose_layer_kinds_differ_from_the_checkpoint_names_the_keys(tmp_path: Path) -> None:
    """Experts where config.json says a layer is dense: the message points at the keys that decide it."""
    model_dir = shutil.copytree(deepseek_checkpoint("base"), tmp_path / "v3")
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["moe_layer_freq"] = 2  # layer 1 becomes dense for the engine; the checkpoint has its experts
    (model_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        CheckpointError,
        match=r"model\.layers\.1\.mlp\.experts.*first_k_dense_replace, "
        r"moe_layer_freq, n_shared_experts",
    ):
        load_model(model_dir)
