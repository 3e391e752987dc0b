"""Architecture name (config.json `architectures[0]`) -> model class, and model construction."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch

from shardinfer.engine.models.base import Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.loader import iter_checkpoint_tensors
from shardinfer.errors import ModelLoadError

_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("shardinfer.engine.models.dense", "DenseForCausalLM"),
    "Qwen2ForCausalLM": ("shardinfer.engine.models.dense", "DenseForCausalLM"),
    "Qwen3ForCausalLM": ("shardinfer.engine.models.dense", "DenseForCausalLM"),
    "MistralForCausalLM": ("shardinfer.engine.models.dense", "DenseForCausalLM"),
    "DeepseekV3ForCausalLM": ("shardinfer.engine.models.deepseek_v3", "DeepseekV3ForCausalLM"),
    "DeepseekV2ForCausalLM": ("shardinfer.engine.models.deepseek_v3", "DeepseekV2ForCausalLM"),
}


def supported_architectures() -> list[str]:
    return sorted(_ARCHITECTURES)


def model_class(config: ModelConfig) -> Any:
    if config.architecture not in _ARCHITECTURES:
        raise ModelLoadError(f"architecture {config.architecture!r} is not supported; supported: "
                             f"{', '.join(supported_architectures())}")
    module, name = _ARCHITECTURES[config.architecture]
    return getattr(importlib.import_module(module), name)


def load_model(model_dir: str | Path, config: ModelConfig, numerics: Numerics, max_positions: int,
               device: torch.device) -> Any:
    """Build the model for config, fill it from the checkpoint's safetensors, move it to device."""
    cls = model_class(config)
    with torch.device("cpu"):
        model = cls(config, numerics, max_positions)
    model.load_weights(iter_checkpoint_tensors(model_dir))
    model.to_device(device)
    return model.eval()
