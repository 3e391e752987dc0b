"""The streamed checkpoint reader against the safetensors library's own reads, and models built on
the meta device then streamed against models built on the host the way they were before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from shardinfer.engine.models.base import Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.loader import iter_checkpoint_tensors
from shardinfer.engine.models.registry import load_model, model_class
from shardinfer.engine.models.weight_stream import read_header, stream_checkpoint_tensors
from shardinfer.errors import CheckpointError
from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint

CPU = torch.device("cpu")


def _odd_tensors(seed: int) -> dict[str, torch.Tensor]:
    """Mixed dtypes and odd sizes, so tensors start at byte offsets their dtype cannot view in place."""
    g = torch.Generator().manual_seed(seed)
    return {
        "a.byte": torch.randint(0, 255, (3,), generator=g, dtype=torch.uint8),
        "b.bf16": torch.randn(5, 7, generator=g).to(torch.bfloat16),
        "c.f32": torch.randn(11, generator=g),
        "d.empty": torch.zeros(0, 4),
        "e.scalar": torch.tensor(2.5, dtype=torch.float64),
        "f.mask": torch.rand(9, generator=g) > 0.5,
        "g.i64": torch.randint(-(2**40), 2**40, (6,), generator=g),
        "h.f16": torch.randn(13, 3, generator=g).half(),
        "i.fp8": torch.randn(4, 8, generator=g).to(torch.float8_e4m3fn),
    }


def _sharded(tmp_path: Path) -> Path:
    """Two shards with an index, as sharded checkpoints come."""
    shards = {
        "model-00001-of-00002.safetensors": _odd_tensors(0),
        "model-00002-of-00002.safetensors": {f"z.{k}": v for k, v in _odd_tensors(1).items()},
    }
    weight_map = {}
    for file, tensors in shards.items():
        save_file(tensors, str(tmp_path / file))
        weight_map.update(dict.fromkeys(tensors, file))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return tmp_path


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.view(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


@pytest.mark.parametrize(
    ("chunk_bytes", "piece_bytes", "threads"),
    [(64, 16, 3), (1, 8, 1), (1 << 20, 7, 2), (1 << 20, 1 << 20, 4)],
)
def test_stream_yields_what_safetensors_reads(
    tmp_path: Path, chunk_bytes: int, piece_bytes: int, threads: int
) -> None:
    model_dir = _sharded(tmp_path)
    expected = dict(iter_checkpoint_tensors(model_dir))
    got = dict(stream_checkpoint_tensors(model_dir, CPU, chunk_bytes, piece_bytes, threads))
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert _same_bits(got[name], tensor), name


def test_header_offsets_are_checked_against_the_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(4, 4)}, str(path))
    entries = read_header(path)
    assert [(e.name, e.dtype, e.shape, e.end - e.start) for e in entries] == [
        ("w", torch.float32, (4, 4), 64)
    ]
    assert entries[0].end == path.stat().st_size
    path.write_bytes(path.read_bytes()[:-1])  # truncated: the tensor's last byte is gone
    with pytest.raises(CheckpointError, match=r"model\.safetensors is not a readable safetensors file.*'w'"):
        list(stream_checkpoint_tensors(tmp_path, CPU))


def test_a_header_that_is_not_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(4)}, str(path))
    data = bytearray(path.read_bytes())
    data[8:20] = b"x" * 12
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors is not a readable safetensors file"):
        list(stream_checkpoint_tensors(tmp_path, CPU))


def _host_built(model_dir: Path, numerics: Numerics) -> torch.nn.Module:
    """The model as it was loaded before streaming: built on the host, filled from safetensors' reads."""
    config = ModelConfig.from_dir(model_dir)
    model = model_class(config)(config, numerics, 64)
    model.load_weights(iter_checkpoint_tensors(model_dir))
    return model


@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        ("qwen3", {"tie_word_embeddings": True}),
        ("qwen3", {"tie_word_embeddings": False}),
        ("deepseek_v3", {}),
    ],
)
def test_load_model_matches_the_host_built_model(tmp_path: Path, family: str, overrides: dict) -> None:
    model_dir = make_tiny_checkpoint(tmp_path / family, family, num_hidden_layers=2, **overrides)
    numerics = Numerics(torch.float32, True)
    config = ModelConfig.from_dir(model_dir)
    streamed = load_model(model_dir, config, numerics, 64, CPU)
    reference = _host_built(model_dir, numerics)
    ours, theirs = streamed.state_dict(), reference.state_dict()
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        assert _same_bits(ours[name], tensor), name
    assert torch.equal(streamed.rope.cos, reference.rope.cos) and torch.equal(
        streamed.rope.sin, reference.rope.sin
    )
    params = {id(p) for p in streamed.parameters()}
    assert len(params) == len({id(p) for p in reference.parameters()})  # ties kept, none added
    if overrides.get("tie_word_embeddings"):
        assert streamed.lm_head.weight is streamed.embed_tokens.weight
    assert all(p.device == CPU and not p.is_meta for p in streamed.parameters())


@pytest.mark.gpu
@pytest.mark.parametrize("piece_bytes", [16, 1 << 20])
def test_stream_to_cuda_yields_what_safetensors_reads(tmp_path: Path, piece_bytes: int) -> None:
    """The pinned ring and asynchronous copies: tiny pieces cycle every ring buffer many times."""
    model_dir = _sharded(tmp_path)
    expected = dict(iter_checkpoint_tensors(model_dir))
    got = dict(stream_checkpoint_tensors(model_dir, torch.device("cuda"), 64, piece_bytes, 3))
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert got[name].is_cuda and _same_bits(got[name].cpu(), tensor), name


@pytest.mark.gpu
def test_load_model_on_cuda_matches_the_host_built_model(tmp_path: Path) -> None:
    model_dir = make_tiny_checkpoint(tmp_path / "q", "qwen3", num_hidden_layers=2, tie_word_embeddings=True)
    numerics = Numerics(torch.bfloat16, True)
    streamed = load_model(model_dir, ModelConfig.from_dir(model_dir), numerics, 64, torch.device("cuda"))
    reference = _host_built(model_dir, numerics).state_dict()
    for name, tensor in streamed.state_dict().items():
        assert tensor.is_cuda and _same_bits(tensor.cpu(), reference[name]), name
    assert streamed.lm_head.weight is streamed.embed_tokens.weight
