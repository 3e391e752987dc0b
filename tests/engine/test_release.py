"""The release constants: the version outputs record is the one the package is installed as."""

from __future__ import annotations

import tomllib
from pathlib import Path

import shardinfer
from shardinfer.engine.release import NUMERICS_REVISION, VERSION


def test_the_recorded_version_is_the_installed_packages() -> None:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["version"] == VERSION == shardinfer.__version__
    assert isinstance(NUMERICS_REVISION, int) and NUMERICS_REVISION >= 1
