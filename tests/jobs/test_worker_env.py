"""The environment a local[N] worker process starts with: its share of the CPUs or its GPU."""

from __future__ import annotations

import pytest

from shardinfer.jobs import executor


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor, "_device_count", lambda: 0)
    monkeypatch.setattr(executor, "usable_cpus", lambda: 8)


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_cpu_workers_split_the_usable_cores(no_gpu: None, device: str) -> None:
    # "auto" on a machine with no GPU runs on the CPU, so its workers must share the cores too.
    env = executor.worker_env(device, slot=1, num_workers=4, environ={"PATH": "/bin"})
    assert env["OMP_NUM_THREADS"] == "2"
    assert env["PATH"] == "/bin"


def test_a_users_thread_count_is_kept(no_gpu: None) -> None:
    env = executor.worker_env("auto", slot=0, num_workers=4, environ={"OMP_NUM_THREADS": "3"})
    assert env["OMP_NUM_THREADS"] == "3"


def test_more_workers_than_cores_get_one_thread_each(no_gpu: None) -> None:
    assert executor.worker_env("cpu", slot=0, num_workers=32, environ={})["OMP_NUM_THREADS"] == "1"


def test_gpu_workers_get_a_gpu_and_no_thread_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor, "_device_count", lambda: 2)
    env = executor.worker_env("auto", slot=3, num_workers=4, environ={})
    assert env["CUDA_VISIBLE_DEVICES"] == "1"  # round-robin over the two GPUs
    assert "OMP_NUM_THREADS" not in env


def test_local_star_counts_the_cpus_this_process_may_use(no_gpu: None) -> None:
    assert executor.parse_master("local[*]") == 8
