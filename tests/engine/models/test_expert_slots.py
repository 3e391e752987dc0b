"""Loading only some routed-expert slots (an expert-parallel rank's load) equals loading the whole
model and keeping those slots' rows, and never reads the other experts' bytes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from shardinfer.engine.models import weight_stream
from shardinfer.engine.models.base import Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.deepseek_moe import RoutedExperts
from shardinfer.engine.models.expert_slots import ExpertSlots
from shardinfer.engine.models.registry import load_model
from shardinfer.errors import ModelLoadError
from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint
from tests.engine.models.deepseek_helpers import deepseek_checkpoint
from tests.engine.models.test_deepseek_fp8 import fp8_pair  # noqa: F401 - the FP8 checkpoint fixture
from tests.engine.models.test_deepseek_mtp import mtp_checkpoint  # noqa: F401 - a checkpoint with an MTP layer

CPU = torch.device("cpu")
NUMERICS = Numerics(torch.float32, True)
SLOTS = [6, 1, 1, 3]  # expert 1 fills two slots, as a replicated hot expert does


def _load(model_dir: Path, slots: ExpertSlots | None = None) -> torch.nn.Module:
    return load_model(model_dir, ModelConfig.from_dir(model_dir), NUMERICS, 64, CPU, slots)


def _assert_slots_of_whole(whole: torch.nn.Module, part: torch.nn.Module, slots: list[int] = SLOTS) -> None:
    index = torch.tensor(slots)
    params = dict(part.named_parameters())
    whole_params = dict(whole.named_parameters())
    assert params.keys() == whole_params.keys()
    experts = {
        name
        for name, m in part.named_modules()
        if isinstance(m, RoutedExperts) and not name.startswith("mtp.")
    }
    assert experts, "the checkpoint must have MoE layers"
    for name, param in params.items():
        want = whole_params[name]
        if name.rsplit(".", 1)[0] in experts:
            want = want.index_select(0, index)
        assert torch.equal(param, want), name


def test_loaded_slots_equal_the_whole_models_rows() -> None:
    model_dir = deepseek_checkpoint("base")
    whole = _load(model_dir)
    part = _load(model_dir, ExpertSlots(SLOTS, 8))
    _assert_slots_of_whole(whole, part)


def test_fp8_expert_weights_keep_their_scales(fp8_pair: tuple[Path, Path]) -> None:  # noqa: F811
    fp8_dir, _ = fp8_pair  # 16 experts, block-scaled FP8 with the scales in a shard of their own
    slots = [15, 2, 2, 9]
    whole = _load(fp8_dir)
    part = _load(fp8_dir, ExpertSlots(slots, 16))
    _assert_slots_of_whole(whole, part, slots)


def test_mtp_layers_keep_all_their_experts(
    mtp_checkpoint: tuple[Path, dict[str, torch.Tensor]],  # noqa: F811
) -> None:
    model_dir, _ = mtp_checkpoint
    layers = ModelConfig.from_dir(model_dir).num_hidden_layers
    whole = _load(model_dir)
    part = _load(model_dir, ExpertSlots(SLOTS, 8, first_whole_layer=layers))
    assert any(name.startswith("mtp.") for name, _ in part.named_parameters())
    _assert_slots_of_whole(whole, part)  # main layers cut to the slots, MTP layers whole


def test_stacked_expert_tensors_are_cut_to_the_slots(tmp_path: Path) -> None:
    src = deepseek_checkpoint("base")
    stacked_dir = tmp_path / "stacked"
    shutil.copytree(src, stacked_dir)
    tensors = load_file(str(src / "model.safetensors"))
    out: dict[str, torch.Tensor] = {}
    layers = sorted({n.split(".mlp.experts.")[0] for n in tensors if ".mlp.experts." in n})
    for layer in layers:
        per = [
            (
                tensors.pop(f"{layer}.mlp.experts.{e}.gate_proj.weight"),
                tensors.pop(f"{layer}.mlp.experts.{e}.up_proj.weight"),
                tensors.pop(f"{layer}.mlp.experts.{e}.down_proj.weight"),
            )
            for e in range(8)
        ]
        out[f"{layer}.mlp.experts.gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u, _ in per])
        out[f"{layer}.mlp.experts.down_proj"] = torch.stack([d for _, _, d in per])
    save_file(tensors | out, str(stacked_dir / "model.safetensors"))
    whole = _load(src)
    part = _load(stacked_dir, ExpertSlots(SLOTS, 8))
    _assert_slots_of_whole(whole, part)


def test_other_experts_bytes_are_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = deepseek_checkpoint("base")
    read: list[int] = []
    real = weight_stream._pread_into

    def counting(fd: int, target: memoryview, offset: int, path: Path) -> None:
        read.append(len(target))
        real(fd, target, offset, path)

    monkeypatch.setattr(weight_stream, "_pread_into", counting)
    slots = ExpertSlots(SLOTS, 8)
    names = [
        name
        for name, _ in weight_stream.stream_checkpoint_tensors(
            model_dir, CPU, wanted=slots.wanted, piece_bytes=1 << 12
        )
    ]
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        all_names = list(f.keys())
        sizes = {n: f.get_slice(n).get_shape() for n in all_names}
    kept = {
        n
        for n in all_names
        if ".mlp.experts." not in n or int(n.split(".mlp.experts.")[1].split(".")[0]) in {1, 3, 6}
    }
    assert set(names) == kept and len(kept) < len(all_names)
    want_bytes = sum(4 * int(torch.Size(sizes[n]).numel()) for n in kept)  # float32 checkpoint
    assert sum(read) == want_bytes


def test_a_dense_model_cannot_be_split(tmp_path: Path) -> None:
    model_dir = make_tiny_checkpoint(tmp_path / "dense", "qwen3")
    with pytest.raises(ModelLoadError, match=r"no routed-expert \(MoE\) layers"):
        _load(model_dir, ExpertSlots([0, 1], 8))


def test_slots_outside_the_experts_are_refused() -> None:
    with pytest.raises(ValueError, match=r"expert slots \[0, 8\] must be"):
        ExpertSlots([0, 8], 8)
    with pytest.raises(ValueError, match="must be a non-empty list"):
        ExpertSlots([], 8)
