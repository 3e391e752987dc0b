"""Checkpoint tensors from a model directory: single or sharded safetensors, never pickle."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from shardinfer.errors import CheckpointError, ModelLoadError

INDEX_FILE = "model.safetensors.index.json"


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint, in a stable order (the index's, else sorted)."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (model_dir / f).is_file()]
        if missing:
            raise CheckpointError(f"{index} names shard(s) {missing} that are not in {str(model_dir)!r}")
        return [model_dir / f for f in files]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in model_dir.glob("*.bin")) + sorted(p.name for p in model_dir.glob("*.pt"))
        hint = (f" (found {pickles}: pickle checkpoints are never loaded; convert them to safetensors)"
                if pickles else "")
        raise ModelLoadError(f"no *.safetensors weights in {str(model_dir)!r}{hint}")
    return files


def iter_checkpoint_tensors(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every tensor of every shard, lazily, one shard open at a time.

    A damaged shard (a bad header, a truncated file) is a CheckpointError naming it: loading it
    again would fail the same way, so the job must exit as misconfigured, never as retryable.
    """
    for path in checkpoint_files(model_dir):
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                    yield name, f.get_tensor(name)
        except SafetensorError as exc:
            raise CheckpointError(
                f"{path} is not a readable safetensors file ({exc}); download or convert it again"
            ) from None
