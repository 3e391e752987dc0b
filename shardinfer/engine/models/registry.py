"""Architecture name (config.json `architectures[0]`) -> model class, and model construction."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from shardinfer.engine.models.architectures import MODEL_CLASSES, supported_architectures
from shardinfer.engine.models.base import Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.fp8 import fp8_format, quantize_linears
from shardinfer.engine.models.weight_stream import stream_checkpoint_tensors
from shardinfer.errors import ModelLoadError

if TYPE_CHECKING:  # imported by the caller that splits experts; the families load lazily
    from shardinfer.engine.models.expert_slots import ExpertSlots


def model_class(config: ModelConfig) -> Any:
    if config.architecture not in MODEL_CLASSES:
        raise ModelLoadError(
            f"architecture {config.architecture!r} is not supported; supported: "
            f"{', '.join(supported_architectures())}"
        )
    module, name = MODEL_CLASSES[config.architecture]
    return getattr(importlib.import_module(module), name)


def load_model(
    model_dir: str | Path,
    config: ModelConfig,
    numerics: Numerics,
    max_positions: int,
    device: torch.device,
    expert_slots: ExpertSlots | None = None,
) -> Any:
    """Build the model with its parameters on `device`, then stream the checkpoint's tensors into them.

    The modules are built on the meta device (no memory, no initialisation), their parameters are
    then given uninitialised storage on `device`, and every one is filled from the checkpoint
    (each model's load_weights refuses a checkpoint that leaves one unfilled). Host-side tables
    a model computes itself (RoPE) are computed on the host as before and moved by to_device.

    With numerics.quantization "fp8" (see fp8.resolve_quantization) an FP8 checkpoint is loaded
    into FP8 Linears in its own scale layout, block or per channel (fp8.WeightLoader); a float
    checkpoint is loaded in float and each quantizable Linear quantised on the device
    (block-scaled), so the host never holds a second copy.

    With `expert_slots` (an expert-parallel rank) the routed experts get only those slots, and the
    other experts' tensors are never read (expert_slots.py).
    """
    cls = model_class(config)
    fmt = fp8_format(config.hf)
    direct = numerics.quantization == "fp8" and fmt is not None
    build = (
        dataclasses.replace(numerics, fp8_scales=fmt.scales)
        if direct and fmt is not None
        else dataclasses.replace(numerics, quantization=None)
    )
    with torch.device("meta"):
        model = cls(config, build, max_positions)
    weights: Iterable[tuple[str, torch.Tensor]]
    if expert_slots is None:
        weights = stream_checkpoint_tensors(model_dir, device)
    else:
        if not expert_slots.shrink(model):
            raise ModelLoadError(
                f"{config.architecture} at {str(model_dir)!r} has no routed-expert (MoE) layers "
                "to split over expert-parallel ranks; run it with expert_parallel_size=1 (local[N] "
                "runs one engine per device)"
            )
        weights = expert_slots.remap(stream_checkpoint_tensors(model_dir, device, wanted=expert_slots.wanted))
    materialize(model, device)
    model.load_weights(weights)
    model.to_device(device)
    if numerics.quantization == "fp8" and not direct:
        quantize_linears(model)
    if device.type == "cuda":
        # The stream's chunk buffers are free now; hand them back, or the KV cache, sized from the
        # device's free memory, would be smaller by what the allocator still holds.
        torch.cuda.empty_cache()
    return model.eval()


def materialize(model: nn.Module, device: torch.device) -> None:
    """Give every parameter and buffer of `model` uninitialised storage on `device`, keeping
    parameters that several modules share (tied embeddings) shared."""
    # torch.empty, not empty_like: empty_like of a meta tensor runs through torch's reference
    # implementations, whose import (sympy and the symbolic-shape machinery) costs seconds.
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) not in made:
                storage = torch.empty(param.shape, dtype=param.dtype, device=device)
                made[id(param)] = nn.Parameter(storage, requires_grad=False)
            setattr(module, name, made[id(param)])
        for name, buffer in list(module.named_buffers(recurse=False)):
            setattr(module, name, torch.empty(buffer.shape, dtype=buffer.dtype, device=device))
