"""Fixtures for the CLI tests: one tiny model, one set of prompt shards, one reference run (per
session), and a local Ray cluster (per module that asks for one)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from job_fixtures import model_dir, reference, shards  # noqa: F401  (fixtures, registered here)


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """The GCS address of a 2-CPU Ray cluster on 127.0.0.1, started for the module that uses it."""
    import ray

    options: dict[str, Any] = {
        "address": "local",  # a cluster of its own, whatever other clusters this machine runs
        "num_cpus": 2,
        "include_dashboard": False,
        "object_store_memory": 200 * 1024 * 1024,
        "_node_ip_address": "127.0.0.1",
        "log_to_driver": False,
        "configure_logging": False,
    }
    try:
        context = ray.init(**options)
    except Exception:  # a raylet on a busy machine can miss its start-up deadline: one more try
        ray.shutdown()
        context = ray.init(**options)
    try:
        yield str(context.address_info["gcs_address"])
    finally:
        ray.shutdown()
