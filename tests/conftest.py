"""Fixtures and process settings shared by every test area.

S3 fixtures (`moto_endpoint`, `s3_bucket`, `fault_proxy`) come from s3_server.py: a real S3 HTTP
API (moto) on 127.0.0.1, never a mock of fsspec.
"""

import os
from collections.abc import Iterator

import pytest
import torch

# Without a GPU, Triton kernels run in Triton's CPU interpreter; it must be switched on before
# anything imports triton (see tests/kernels/conftest.py).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        from interpreter_patching import install as _patch_interpreter_once
    except ImportError:  # tests/ imported as a package
        from tests.interpreter_patching import install as _patch_interpreter_once

    _patch_interpreter_once()  # interpreter_patching.py: each launch patches triton.language once

# One intra-op thread: the tiny test models gain nothing from more, and on a shared 2-core
# machine OpenMP threads spinning against other processes make runs tens of times slower.
torch.set_num_threads(1)

try:
    from s3_server import fault_proxy, moto_endpoint, s3_bucket
except ImportError:  # tests/ imported as a package
    from tests.s3_server import fault_proxy, moto_endpoint, s3_bucket

__all__ = ["fault_proxy", "moto_endpoint", "s3_bucket"]


@pytest.fixture(autouse=True)
def _release_gpu_memory(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a GPU test, free what its engines held before the next test allocates: an engine sizes
    its KV cache from the device's free memory, and test helpers that patch an engine's methods
    keep it in a reference cycle that only the cycle collector frees (GPU engines freeze their
    startup objects out of the collector's view: `collect_dropped` hands them back first)."""
    yield
    if request.node.get_closest_marker("gpu") is not None and torch.cuda.is_available():
        from shardinfer.engine.heap import collect_dropped  # after TRITON_INTERPRET is settled above

        collect_dropped()
        torch.cuda.empty_cache()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files holding a test marked `slow` run first, each file's tests still together and in order.

    `make test` spreads whole files over its processes in this order; started last, the longest
    files would leave one process running them alone after the other has finished."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)
