"""Session fixtures shared by the CLI and reliability suites: one tiny model, one set of prompt
shards, and the committed rows of one uninterrupted `local` run of the standard test job.
Each suite's conftest imports them, so pytest registers them there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pipeline_kit import cli, committed_rows, standard_job, tiny_model, write_shards


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 files x 8 rows, row groups of 4 -> 6 splits of 4 rows with job.split_rows=4."""
    return write_shards(tmp_path_factory.mktemp("shards"), files=3, rows=8)


@pytest.fixture(scope="session")
def reference(
    tmp_path_factory: pytest.TempPathFactory, model_dir: Path, shards: Path
) -> list[dict[str, Any]]:
    """The committed rows of one uninterrupted `local` run of the standard test job."""
    job, out = standard_job(tmp_path_factory.mktemp("reference"), model_dir, str(shards))
    result = cli("submit", str(job))
    assert result.returncode == 0, result.stderr
    rows = committed_rows(str(out))
    assert len(rows) == 24
    return rows
