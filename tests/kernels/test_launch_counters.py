"""Arrival counters for kernels that reset them: zeroed once, reused, grown without freeing."""

from __future__ import annotations

import torch

from shardinfer.kernels import launch_counters as lc


def test_counters_are_zero_reused_and_grown() -> None:
    cpu = torch.device("cpu")
    first = lc.launch_counters(cpu, 10)
    assert first.dtype == torch.int32 and first.numel() >= 10 and not first.any()
    assert lc.launch_counters(cpu, 5).data_ptr() == first.data_ptr()  # the same buffer for the next launch
    grown = lc.launch_counters(cpu, first.numel() + 1)
    assert grown.numel() > first.numel() and not grown.any()
    # The smaller buffer stays alive: a CUDA graph captured with it still writes there.
    assert any(t.data_ptr() == first.data_ptr() for t in lc._retired)
