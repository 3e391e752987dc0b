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


def values_to_device(
    values: Sequence[int] | Sequence[float], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
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


ALIGN = 16  # bytes: every column of a packed copy starts here, as kernels' pointer checks like it


def columns_to_device(columns: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """Several 1-D numpy arrays (of any dtypes) on `device` in one host-to-device copy: packed into
    one byte buffer, each at an offset aligned to ALIGN bytes, and returned as views of the copy
    with their own dtypes. One staging buffer and one transfer instead of one of each per column."""
    offsets, total = [], 0
    for a in columns:
        total = -(-total // ALIGN) * ALIGN
        offsets.append(total)
        total += a.nbytes
    packed = np.zeros(total, dtype=np.uint8)
    for a, at in zip(columns, offsets, strict=True):
        packed[at : at + a.nbytes] = np.ascontiguousarray(a).view(np.uint8)
    moved = array_to_device(packed, device)
    return [
        moved[at : at + a.nbytes].view(torch.from_numpy(a[:0]).dtype)
        for a, at in zip(columns, offsets, strict=True)
    ]
