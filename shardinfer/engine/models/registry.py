"""Architecture name (config.json `architectures[0]`) -> model class, and model construction."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch

from shardinfer.engine.models.architectures import MODEL_CLASSES, supported_architectures
from shardinfer.engine.models.base import Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.loader import iter_checkpoint_tensors
from shardinfer.errors import ModelLoadError


def model_class(config: ModelConfig) -> Any:
    if config.architecture not in MODEL_CLASSES:
        raise ModelLoadError(f"architecture {config.architecture!r} is not supported; supported: "
                             f"{', '.join(supported_architectures())}")
    module, name = MODEL_CLASSES[config.architecture]
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
