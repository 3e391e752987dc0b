"""Session-wide tiny checkpoints for engine tests (random-init transformers models, ~1 s each)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """tiny_checkpoint(family, **config overrides) -> model dir, built once per distinct request."""
    cache: dict[str, Path] = {}

    def build(family: str = "qwen3", **overrides: Any) -> Path:
        key = f"{family}-{sorted(overrides.items())!r}"
        if key not in cache:
            out = tmp_path_factory.mktemp(family)
            cache[key] = make_tiny_checkpoint(out, family, **overrides)
        return cache[key]

    return build


@pytest.fixture(scope="session")
def qwen3_dir(tiny_checkpoint: Callable[..., Path]) -> Path:
    return tiny_checkpoint("qwen3")
