"""RoPE settings as published config.json files spell them (transformers < 5: `rope_theta` plus
`rope_scaling`), against transformers reading the same file, and the settings the engine refuses."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from shardinfer import LLM
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.rope import RopeTable
from shardinfer.errors import ModelLoadError
from tests.engine.engine_helpers import batch_logits
from tests.engine.hf_reference import hf_logits, hf_model

# (family, top-level config.json keys written over the transformers-saved ones; rope_parameters is dropped)
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    # Phi-3-style: the pretraining length beside rope_scaling, not inside it; transformers prefers it.
    "yarn-top-level-original-length": (
        "qwen2",
        dict(
            rope_theta=1e6, original_max_position_embeddings=32, rope_scaling={"type": "yarn", "factor": 4.0}
        ),
    ),
    # No pretraining length at all: transformers starts from max_position_embeddings.
    "llama3-without-original-length": (
        "llama",
        dict(
            rope_theta=5e5,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
            },
        ),
    ),
    # Dynamic NTK changes nothing below max_position_embeddings, which max_model_len never passes.
    "dynamic-ntk": ("llama", dict(rope_theta=1e4, rope_scaling={"type": "dynamic", "factor": 2.0})),
}


def _with_config(src: Path, dst: Path, keys: dict[str, Any]) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg.update(keys)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_rope_config_spellings_match_transformers(
    case: str, tiny_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    family, keys = CONFIGS[case]
    model_dir = _with_config(tiny_checkpoint(family), tmp_path / case, keys)
    llm = LLM(model_dir, device="cpu", dtype="float32", max_num_batched_tokens=512)
    ref = hf_model(model_dir)
    g = torch.Generator().manual_seed(3)
    prompts = [
        torch.randint(0, llm.llm_engine.model_config.vocab_size, (n,), generator=g).tolist() for n in (7, 120)
    ]
    for ids, got in zip(prompts, batch_logits(llm.llm_engine, prompts), strict=True):
        assert (got - hf_logits(ref, ids)).abs().max().item() <= 1e-4


def _config(rope_scaling: dict[str, Any]) -> ModelConfig:
    return ModelConfig.from_dict(
        dict(
            architectures=["LlamaForCausalLM"],
            model_type="llama",
            vocab_size=32,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            rope_scaling=rope_scaling,
            max_position_embeddings=64,
        )
    )


@pytest.mark.parametrize(
    "rope_scaling,match",
    [
        (
            {"type": "longrope", "short_factor": [1.0], "long_factor": [2.0]},
            r"rope_type='longrope'.*supported: default",
        ),
        ({"type": "yarn"}, r"rope_type='yarn' has factor=None"),
        ({"rope_type": "linear", "factor": "2"}, r"rope_type='linear' has factor='2'"),
        ({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}, r"low_freq_factor=None"),
    ],
)
def test_rope_settings_the_engine_cannot_honour_are_refused_by_name(
    rope_scaling: dict[str, Any], match: str
) -> None:
    config = _config(rope_scaling)
    with pytest.raises(ModelLoadError, match=match):
        RopeTable(8, config.rope_theta, config.rope_scaling, 16, config.max_position_embeddings)
