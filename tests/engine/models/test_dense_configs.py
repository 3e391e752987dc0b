"""Dense-family config.json values the engine cannot run are refused at load, naming the value."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from shardinfer import LLM
from shardinfer.errors import ModelLoadError
from tests.engine.engine_helpers import batch_logits
from tests.engine.hf_reference import hf_logits, hf_model


def test_query_heads_not_a_multiple_of_kv_heads_are_refused(
    tiny_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    model_dir = shutil.copytree(tiny_checkpoint("llama"), tmp_path / "llama")
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg.update(num_attention_heads=4, num_key_value_heads=3)
    (model_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ModelLoadError, match=r"num_attention_heads=4 is not a multiple of num_key_value_heads=3"
    ):
        LLM(model_dir, device="cpu", dtype="float32")


def test_a_config_without_model_type_keeps_its_family_flags(
    tiny_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    """Qwen2's q/k/v biases come from the family, which the architecture names when model_type is absent."""
    model_dir = shutil.copytree(tiny_checkpoint("qwen2"), tmp_path / "qwen2")
    cfg = json.loads((model_dir / "config.json").read_text())
    del cfg["model_type"]
    (model_dir / "config.json").write_text(json.dumps(cfg))
    llm = LLM(model_dir, device="cpu", dtype="float32")
    ref = hf_model(tiny_checkpoint("qwen2"))  # transformers needs model_type: the untouched copy
    prompt = list(range(3, 30))
    (got,) = batch_logits(llm.llm_engine, [prompt])
    assert (got - hf_logits(ref, prompt)).abs().max().item() <= 1e-4
