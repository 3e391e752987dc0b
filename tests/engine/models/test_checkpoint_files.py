"""Which files of a model directory are the checkpoint, and directories that do not say clearly."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from shardinfer import LLM
from shardinfer.engine.models.loader import iter_checkpoint_tensors
from shardinfer.engine.models.weight_stream import stream_checkpoint_tensors
from shardinfer.errors import CheckpointError
from tests.engine.engine_helpers import batch_logits
from tests.engine.hf_reference import hf_logits, hf_model


def test_a_stray_file_beside_model_safetensors_is_not_loaded_as_transformers_does(
    tiny_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    """Mistral's repositories ship consolidated.safetensors (their own layout) beside model.safetensors."""
    model_dir = shutil.copytree(tiny_checkpoint("mistral"), tmp_path / "mistral")
    own = load_file(str(model_dir / "model.safetensors"))
    save_file(
        {k.removeprefix("model.").replace("self_attn", "attention"): v for k, v in own.items()},
        str(model_dir / "consolidated.safetensors"),
    )
    llm = LLM(model_dir, device="cpu", dtype="float32")
    prompt = list(range(3, 30))
    (got,) = batch_logits(llm.llm_engine, [prompt])
    assert (got - hf_logits(hf_model(model_dir), prompt)).abs().max().item() <= 1e-4


def _shards(tmp_path: Path) -> Path:
    save_file({"a": torch.ones(2)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.ones(3)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    return tmp_path


def test_a_tensor_in_two_files_is_refused_naming_both(tmp_path: Path) -> None:
    model_dir = _shards(tmp_path)
    # A shard left from an earlier download with another shard count repeats tensor "a" (stale).
    save_file({"a": torch.zeros(2)}, str(model_dir / "model-00001-of-00003.safetensors"))
    match = (
        r"tensor 'a' is stored in both model-00001-of-00002.safetensors and model-00001-of-00003.safetensors"
    )
    with pytest.raises(CheckpointError, match=match):
        list(stream_checkpoint_tensors(model_dir, torch.device("cpu")))
    with pytest.raises(CheckpointError, match=match):
        list(iter_checkpoint_tensors(model_dir))


@pytest.mark.parametrize(
    "index,why",
    [
        ("{not json", r"is not a safetensors index \(Expecting property name"),
        ("[1, 2]", r"is not a safetensors index"),
        ('{"metadata": {}}', r"has no weight_map of tensor names to shard files"),
        ('{"weight_map": {"a": 3}}', r"has no weight_map of tensor names to shard files"),
    ],
)
def test_an_index_that_is_not_one_is_named(tmp_path: Path, index: str, why: str) -> None:
    model_dir = _shards(tmp_path)
    (model_dir / "model.safetensors.index.json").write_text(index)
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json " + why):
        list(stream_checkpoint_tensors(model_dir, torch.device("cpu")))


def test_an_index_names_the_shards_in_order(tmp_path: Path) -> None:
    model_dir = _shards(tmp_path)
    save_file({"c": torch.ones(1)}, str(model_dir / "adapter_model.safetensors"))  # not in the index
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert [name for name, _ in stream_checkpoint_tensors(model_dir, torch.device("cpu"))] == ["a", "b"]
