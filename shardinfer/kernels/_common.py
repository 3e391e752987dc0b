"""Shared launcher checks for the Triton kernels.

Every launcher validates its inputs before launching: a Triton kernel handed a wrong dtype,
a non-contiguous view or a mismatched shape does not fail, it reads the wrong bytes. Each
check raises ValueError naming the argument, what it got and what it needs.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@functools.cache
def sm_count(device_index: int) -> int:
    """The GPU's number of streaming multiprocessors (cached per device)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def _device_name(device_index: int) -> str:
    return torch.cuda.get_device_name(device_index)


def gpu_name(device: torch.device) -> str | None:
    """The GPU model's name (what its measured tilings are filed under); None off CUDA."""
    return _device_name(device.index or 0) if device.type == "cuda" else None


@functools.cache
def capability(device_index: int) -> tuple[int, int]:
    """The GPU's compute capability (cached per device)."""
    major, minor = torch.cuda.get_device_capability(device_index)
    return major, minor


def fail(name: str, got: object, need: str) -> ValueError:
    return ValueError(f"{name}: got {got}, {need}")


def check_tiles(owner: object, blocks: Iterable[str], counts: Iterable[str]) -> None:
    """A tiling dataclass's own check: each field in `blocks` a power of two >= 16 (tl.dot's
    minimum), each in `counts` >= 1; the error names `Owner.field`."""
    kind = type(owner).__name__
    for name in blocks:
        v = getattr(owner, name)
        if v < 16 or v & (v - 1):
            raise ValueError(f"{kind}.{name}: got {v}, need a power of two >= 16 (tl.dot's minimum)")
    for name in counts:
        if getattr(owner, name) < 1:
            v = getattr(owner, name)
            raise ValueError(f"{kind}.{name}: got {v}, need >= 1 (a tiling with {name}={v} cannot run)")


def check_tensor(
    name: str,
    t: object,
    *,
    dtypes: Iterable[torch.dtype] | None = None,
    ndim: int | Iterable[int] | None = None,
    last_dim_contiguous: bool = False,
    contiguous: bool = False,
) -> torch.Tensor:
    """Validate one tensor argument and return it typed."""
    if not isinstance(t, torch.Tensor):
        raise fail(name, type(t).__name__, "need a torch.Tensor")
    if dtypes is not None:
        allowed = tuple(dtypes)
        if t.dtype not in allowed:
            raise fail(f"{name}.dtype", t.dtype, f"need one of {[str(d) for d in allowed]}")
    if ndim is not None:
        dims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in dims:
            raise fail(f"{name}.dim()", t.dim(), f"need {' or '.join(map(str, dims))} dims")
    if contiguous and not t.is_contiguous():
        raise fail(name, f"strides {tuple(t.stride())}", "need a contiguous tensor (call .contiguous())")
    if last_dim_contiguous and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise fail(name, f"last-dim stride {t.stride(-1)}", "need the last dim contiguous (stride 1)")
    return t


def check_same_device(**tensors: torch.Tensor | None) -> torch.device:
    """All given tensors must live on one device; return it."""
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    distinct = set(devices.values())
    if len(distinct) > 1:
        raise ValueError(f"tensors are on different devices: {devices}; move them to one device")
    (device,) = distinct
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"Triton kernels need CUDA tensors, got device {device} "
            "(use shardinfer.kernels.reference on CPU, or set TRITON_INTERPRET=1)"
        )
    return device


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
