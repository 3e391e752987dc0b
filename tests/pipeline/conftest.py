"""Fixtures of the pipeline tests: the session's tiny model (shared with tests/jobs) and one thread for torch."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_kit import tiny_model


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    torch.set_num_threads(1)  # see pipeline_kit: the suite shares the cores
    return tiny_model(tmp_path_factory.getbasetemp())
