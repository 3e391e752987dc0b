"""Checkpoint tensors from a model directory: single or sharded safetensors, never pickle."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from shardinfer.engine.models.checkpoint_layout import INDEX_FILE, LayoutError, weight_file_names
from shardinfer.errors import CheckpointError, ModelLoadError


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint, in a stable order (the rule: checkpoint_layout)."""
    model_dir = Path(model_dir)
    names = {p.name for p in model_dir.iterdir() if p.is_file()} if model_dir.is_dir() else set()
    index = model_dir / INDEX_FILE
    try:
        chosen = weight_file_names(names, index.read_bytes() if INDEX_FILE in names else None)
    except LayoutError as exc:
        if exc.no_weights:
            raise ModelLoadError(f"{str(model_dir)!r}: {exc}") from None
        raise CheckpointError(f"{str(model_dir)!r}: {exc}") from None
    return [model_dir / name for name in chosen]


def check_unique_names(names_by_file: Iterable[tuple[Path, Iterable[str]]]) -> None:
    """Refuse a tensor stored in two files: which copy is the checkpoint's would be a guess (a stale
    shard left from an earlier download or another shard count is the usual cause)."""
    seen: dict[str, Path] = {}
    for path, names in names_by_file:
        for name in names:
            if name in seen:
                raise CheckpointError(
                    f"tensor {name!r} is stored in both {seen[name].name} and {path.name} in "
                    f"{str(path.parent)!r}: remove the file that is not part of the checkpoint"
                )
            seen[name] = path


def iter_checkpoint_tensors(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every tensor of every shard, lazily, one shard open at a time.

    A damaged shard (a bad header, a truncated file) is a CheckpointError naming it: loading it
    again would fail the same way, so the job must exit as misconfigured, never as retryable.
    """
    files = checkpoint_files(model_dir)
    check_unique_names((path, _names(path)) for path in files)
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                    yield name, f.get_tensor(name)
        except SafetensorError as exc:
            raise CheckpointError(
                f"{path} is not a readable safetensors file ({exc}); download or convert it again"
            ) from None


def _names(path: Path) -> list[str]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return list(f.keys())
    except SafetensorError as exc:
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({exc}); download or convert it again"
        ) from None
