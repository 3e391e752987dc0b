"""Host-to-device copies of the launch path (engine/device_copy.py): the packed copy of several
columns gives each column back, bit for bit, in its own dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shardinfer.engine.device_copy import ALIGN, columns_to_device


def _columns(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(n)
    return [
        rng.standard_normal(n).astype(np.float32),
        rng.integers(-(2**31), 2**31 - 1, n).astype(np.int32),
        rng.integers(-(2**62), 2**62, n).astype(np.int64),
        np.array([0.0, -0.0, np.inf, np.nan][: min(n, 4)] + [1.5] * max(0, n - 4), dtype=np.float32),
        rng.integers(0, 2**63 - 1, n, dtype=np.int64),
    ]


def _check(device: torch.device) -> None:
    for n in (1, 3, 7, 64):
        columns = _columns(n)
        got = columns_to_device(columns, device)
        assert len(got) == len(columns)
        for a, t in zip(columns, got, strict=True):
            assert t.device.type == device.type and t.shape == (n,)
            assert t.dtype == torch.from_numpy(a[:0]).dtype
            assert t.data_ptr() % ALIGN == 0
            # Bit for bit: NaN and -0.0 included.
            assert np.array_equal(t.cpu().numpy().view(np.uint8), a.view(np.uint8))


def test_columns_come_back_in_their_dtypes_on_the_cpu() -> None:
    _check(torch.device("cpu"))
    assert columns_to_device([], torch.device("cpu")) == []


@pytest.mark.gpu
def test_columns_come_back_on_cuda_without_a_host_sync() -> None:
    _check(torch.device("cuda"))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        columns_to_device(_columns(32), torch.device("cuda"))
    finally:
        torch.cuda.set_sync_debug_mode("default")
