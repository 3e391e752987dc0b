"""Architecture name (config.json `architectures[0]`) -> model class, and model construction."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any

import torch

from shardinfer.engine.models.architectures import MODEL_CLASSES, supported_architectures
from shardinfer.engine.models.base import Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.fp8 import fp8_block_size, quantize_linears
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
    """Build the model for config, fill it from the checkpoint's safetensors, move it to device.

    With numerics.quantization "fp8" (see fp8.resolve_quantization) an FP8 checkpoint is loaded
    into FP8 Linears (fp8.WeightLoader); a float checkpoint is loaded in float and each
    quantizable Linear quantised on the device, so the host never holds a second copy.
    """
    cls = model_class(config)
    direct = numerics.quantization == "fp8" and fp8_block_size(config.hf) is not None
    build = numerics if direct else dataclasses.replace(numerics, quantization=None)
    with torch.device("cpu"):
        model = cls(config, build, max_positions)
    model.load_weights(iter_checkpoint_tensors(model_dir))
    model.to_device(device)
    if numerics.quantization == "fp8" and not direct:
        quantize_linears(model)
    return model.eval()
