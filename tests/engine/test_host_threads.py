"""engine/host_threads.py: a GPU engine leaves torch one CPU thread unless OMP_NUM_THREADS is set;
a CPU engine keeps its threads."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from shardinfer.engine.host_threads import limit_host_threads


@pytest.fixture
def two_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(saved)


@pytest.mark.usefixtures("two_threads")
def test_a_gpu_engine_leaves_one_thread() -> None:
    assert limit_host_threads(torch.device("cuda", 0))
    assert torch.get_num_threads() == 1
    assert not limit_host_threads(torch.device("cuda", 0))  # already one: nothing to change


@pytest.mark.usefixtures("two_threads")
def test_a_cpu_engine_keeps_its_threads() -> None:
    assert not limit_host_threads(torch.device("cpu"))
    assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_threads")
def test_omp_num_threads_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    assert not limit_host_threads(torch.device("cuda", 0))
    assert torch.get_num_threads() == 2
