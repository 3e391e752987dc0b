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

from job_fixtures import model_dir, reference, shards  # noqa: F401  (fixtures, registered here)

_SURVIVED: Counter[str] = Counter()


@pytest.fixture
def survived() -> Counter[str]:
    """Add one per attack survived, by kind ("kills survived", "faults survived", ...)."""
    return _SURVIVED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _SURVIVED:
        counts = ", ".join(f"{kind}: {n}" for kind, n in sorted(_SURVIVED.items()))
        terminalreporter.write_line(f"reliability suite survived: {counts}")
