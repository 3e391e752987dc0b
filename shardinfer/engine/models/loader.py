"""Checkpoint tensors from a model directory: single or sharded safetensors, never pickle."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from shardinfer.errors import CheckpointError, ModelLoadError

INDEX_FILE = "model.safetensors.index.json"


SINGLE_FILE = "model.safetensors"


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint, in a stable order: the shards its index names; else,
    as transformers reads a directory, model.safetensors alone (a stray file beside it, such as
    Mistral's consolidated.safetensors, is not part of it); else every *.safetensors, sorted."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX_FILE
    if index.is_file():
        shards = _index_shards(index)
        missing = [f for f in shards if not (model_dir / f).is_file()]
        if missing:
            raise CheckpointError(f"{index} names shard(s) {missing} that are not in {str(model_dir)!r}")
        return [model_dir / f for f in shards]
    if (model_dir / SINGLE_FILE).is_file():
        return [model_dir / SINGLE_FILE]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in model_dir.glob("*.bin")) + sorted(p.name for p in model_dir.glob("*.pt"))
        hint = (f" (found {pickles}: pickle checkpoints are never loaded; convert them to safetensors)"
                if pickles else "")
        raise ModelLoadError(f"no *.safetensors weights in {str(model_dir)!r}{hint}")
    return files


def _index_shards(index: Path) -> list[str]:
    """The shard file names an index's weight_map points at, sorted; CheckpointError if it is not one."""
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise CheckpointError(f"{index} is not a safetensors index ({exc}); download it again, or delete it "
                              "if the directory holds a single model.safetensors") from None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(f, str) for f in weight_map.values()):
        raise CheckpointError(f"{index} has no weight_map of tensor names to shard files; download it again, or "
                              "delete it if the directory holds a single model.safetensors")
    return sorted(set(weight_map.values()))


def check_unique_names(names_by_file: Iterable[tuple[Path, Iterable[str]]]) -> None:
    """Refuse a tensor stored in two files: which copy is the checkpoint's would be a guess (a stale
    shard left from an earlier download or another shard count is the usual cause)."""
    seen: dict[str, Path] = {}
    for path, names in names_by_file:
        for name in names:
            if name in seen:
                raise CheckpointError(f"tensor {name!r} is stored in both {seen[name].name} and {path.name} in "
                                      f"{str(path.parent)!r}: remove the file that is not part of the checkpoint")
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
