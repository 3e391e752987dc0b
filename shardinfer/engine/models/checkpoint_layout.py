"""Which files of a model folder hold its weights.

One rule, read the way transformers reads a folder: the shards that
`model.safetensors.index.json` names; else `model.safetensors` alone (a stray file beside it, such
as Mistral's consolidated.safetensors, is not part of the checkpoint); else every `*.safetensors`,
sorted. The loader reads by it, and the fingerprint and the model cache name files by it, for a
local folder and for one known only by an object-store listing. Torch-free, so planning a job
never imports the engine.
"""

from __future__ import annotations

import json
from collections.abc import Collection

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

_INDEX_FIX = "download it again, or delete it if the folder holds a single model.safetensors"


class LayoutError(ValueError):
    """What is wrong with a folder's weight files and how to fix it; the caller names the folder.
    `no_weights` tells a folder without weights from one whose index is broken."""

    def __init__(self, problem: str, *, no_weights: bool = False) -> None:
        super().__init__(problem)
        self.no_weights = no_weights


def weight_file_names(names: Collection[str], index_text: bytes | None) -> list[str]:
    """The weight files, in the loader's order, of a folder holding the files `names` (names, no
    folders); `index_text` is the index's content where the folder has one."""
    if INDEX_FILE in names:
        shards = index_shards(index_text or b"")
        missing = [f for f in shards if f not in names]
        if missing:
            raise LayoutError(
                f"{INDEX_FILE} names shard(s) {missing} that are not in the folder; download the model again"
            )
        return shards
    if SINGLE_FILE in names:
        return [SINGLE_FILE]
    files = sorted(n for n in names if n.endswith(".safetensors"))
    if not files:
        pickles = sorted(n for n in names if n.endswith((".bin", ".pt")))
        hint = (
            f" (found {pickles}: pickle checkpoints are never loaded; convert them to safetensors)"
            if pickles
            else ""
        )
        raise LayoutError(f"no *.safetensors weights in the folder{hint}", no_weights=True)
    return files


def index_shards(text: bytes) -> list[str]:
    """The shard names an index's weight_map points at, sorted."""
    try:
        weight_map = json.loads(text.decode("utf-8")).get("weight_map")
    except (UnicodeDecodeError, ValueError, AttributeError) as exc:
        raise LayoutError(f"{INDEX_FILE} is not a safetensors index ({exc}); {_INDEX_FIX}") from None
    if (
        not isinstance(weight_map, dict)
        or not weight_map
        or not all(isinstance(f, str) for f in weight_map.values())
    ):
        raise LayoutError(f"{INDEX_FILE} has no weight_map of tensor names to shard files; {_INDEX_FIX}")
    return sorted(set(weight_map.values()))
