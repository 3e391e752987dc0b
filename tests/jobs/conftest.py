"""Session fixtures for the CLI tests: one tiny model, one set of prompt shards, one reference run."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from job_fixtures import model_dir, reference, shards  # noqa: F401  (fixtures, registered here)
