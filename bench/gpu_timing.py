"""Timing helpers shared by the GPU benchmarks: CUDA-event medians and the device's ceilings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def median_ms(fn: Callable[[], Any], warmup: int = 3, reps: int = 20) -> float:
    """Median over `reps` runs of fn, timed with CUDA events after `warmup` runs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def capture_graph(fns: list[Callable[[], Any]]) -> torch.cuda.CUDAGraph:
    """One CUDA graph of every call in fns, captured on a side stream after a warm-up pass."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns:
            fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for fn in fns:
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    return graph


def graph_ms(fn: Callable[[], Any]) -> float:
    """Median time of one CUDA-graph replay of fn (captured after a warm-up call): the device time
    alone, as the engine's graphed steps see it, without the host's launch cost that median_ms
    includes for kernels shorter than their launch."""
    return median_ms(capture_graph([fn]).replay)


def graph_ms_per_call(fns: list[Callable[[], Any]]) -> float:
    """Median replay time of one CUDA graph holding every call in fns, divided by their number:
    a call's device time as a graphed decode step sees it, where one graph launch covers all the
    layers and a call pays only its kernels and the gaps between them. Give each call its own
    data (larger than L2) so no call reads what the one before left in L2."""
    return median_ms(capture_graph(fns).replay) / len(fns)


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read and written."""
    rate = _timed_copy(1 << 31)
    torch.cuda.empty_cache()  # hand the 4 GiB back: an engine built next sizes its KV cache from free memory
    return rate


def _timed_copy(n_bytes: int) -> float:
    src = torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * n_bytes / (median_ms(lambda: dst.copy_(src), reps=10) * 1e-3)


def matmul_rate() -> float:
    """bf16 8192^3 matmul rate in FLOP/s."""
    rate = _timed_matmul(8192)
    torch.cuda.empty_cache()
    return rate


def _timed_matmul(n: int) -> float:
    m = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return 2 * n**3 / (median_ms(lambda: m @ m, reps=10) * 1e-3)


def ceilings() -> tuple[float, float]:
    """(copy bytes/s counting read + write, bf16 matmul FLOP/s), measured now."""
    return copy_bandwidth(), matmul_rate()


def decode_bytes(engine: Any) -> tuple[int, int]:
    """(weight bytes, KV-cache bytes per token) of an engine: what one decode step must read."""
    weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    per_token = sum(s.values_per_token for s in engine.model.kv_cache_specs()) * engine.dtype.itemsize
    return weights, per_token
