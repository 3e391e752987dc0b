"""Zeroed int32 counters that a kernel hands back zeroed, kept per (device, stream).

A kernel whose programs count themselves in (the last one to arrive then does a follow-up step,
e.g. merging the chunks of attention) needs counters that read 0 at its start. Zeroing them per
launch would add a memset to every call, so the kernel resets each counter it used before it
exits, and the buffer is reused by the next launch on the same stream (launches on one stream
never overlap). A buffer first allocated while a CUDA graph is being captured is zeroed by a
memset captured into that graph, which then zeroes it on every replay: still correct.

Buffers are never freed, even when a larger one replaces them: a captured graph keeps the address
it was captured with.
"""

from __future__ import annotations

import torch

from shardinfer.kernels._common import next_pow2

_MIN_COUNTERS = 1 << 12
_current: dict[tuple[int, int], torch.Tensor] = {}
_retired: list[torch.Tensor] = []


def launch_counters(device: torch.device, n: int) -> torch.Tensor:
    """At least n int32 counters, all 0, for a launch on `device`'s current stream."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (index, torch.cuda.current_stream(index).cuda_stream)
    else:  # the interpreter: programs run one after another
        key = (-1, 0)
    buf = _current.get(key)
    if buf is None or buf.numel() < n:
        if buf is not None:
            _retired.append(buf)
        buf = torch.zeros(max(_MIN_COUNTERS, next_pow2(n)), dtype=torch.int32, device=device)
        _current[key] = buf
    return buf
