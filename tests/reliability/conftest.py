"""The reliability suite: jobs attacked (kills, storage faults, damage, races) and checked against
a fresh uninterrupted run. Each test adds what it survived to `survived`; the totals are printed
at the end of the session."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from pipeline_kit import cli, committed_rows, standard_job, tiny_model, write_shards

_SURVIVED: Counter[str] = Counter()


@pytest.fixture
def survived() -> Counter[str]:
    """Add one per attack survived, by kind ("kills survived", "faults survived", ...)."""
    return _SURVIVED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _SURVIVED:
        counts = ", ".join(f"{kind}: {n}" for kind, n in sorted(_SURVIVED.items()))
        terminalreporter.write_line(f"reliability suite survived: {counts}")


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
    """The committed rows of one uninterrupted run of the standard test job."""
    job, out = standard_job(tmp_path_factory.mktemp("reference"), model_dir, str(shards))
    result = cli("submit", str(job))
    assert result.returncode == 0, result.stderr
    rows = committed_rows(str(out))
    assert len(rows) == 24
    return rows
