"""Host-to-device copies that never make the host wait for the device.

A copy from ordinary (pageable) host memory with torch's default blocking semantics waits until
the stream has finished everything queued before it. With asynchronous scheduling the stream
holds the previous step's whole forward pass, so one such copy on the launch path turns the
overlap back into a serial host-then-device loop. Staging through page-locked memory and copying
with non_blocking=True queues the transfer and returns at once; torch's pinned-memory cache keeps
the staging buffer alive until the transfer has run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def values_to_device(values: Sequence[int] | Sequence[float], dtype: torch.dtype,
                     device: torch.device) -> torch.Tensor:
    """A 1-D tensor of `values` on `device`, without a host sync on CUDA."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def array_to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A numpy array on `device` (shares memory with `a` on the CPU), without a host sync on CUDA."""
    t = torch.from_numpy(a)
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)
