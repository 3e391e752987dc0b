"""The harness runs offline on local task files; tiny checkpoints are built once per session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness_kit import MAX_LENGTH, hf_reference, run_harness


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch

    from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint

    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("eval-models")
    return {
        "dense": make_tiny_checkpoint(base / "qwen3", "qwen3", num_hidden_layers=1),
        "deepseek_v3": make_tiny_checkpoint(base / "dsv3", "deepseek_v3"),
    }


@pytest.fixture(scope="session")
def harness_runs(tiny_models: dict[str, Path]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """family -> (shardinfer's run, transformers' run) of the three local tasks."""
    from shardinfer.integrations.lm_eval import ShardinferLM

    runs = {}
    for family, model_dir in tiny_models.items():
        ours = run_harness(ShardinferLM(str(model_dir), device="cpu", dtype="float32", max_length=MAX_LENGTH))
        runs[family] = (ours, hf_reference(model_dir))
    return runs
