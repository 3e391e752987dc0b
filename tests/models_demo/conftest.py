"""Shared fixtures for the bundled demo model: its directory, recorded metrics, and one engine on CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "examples" / "models" / "tiny-dsv3-demo"
# The MTP reference module lives with the training script (tools/ is not a package).
sys.path.insert(0, str(ROOT / "tools"))


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return MODEL_DIR


@pytest.fixture(scope="session")
def metrics() -> dict[str, Any]:
    return json.loads((MODEL_DIR / "metrics.json").read_text())


@pytest.fixture(scope="session")
def engine() -> Any:
    from shardinfer import LLM

    return LLM(str(MODEL_DIR), device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def hf_model() -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    model.config._experts_implementation = "eager"
    return model.eval()
