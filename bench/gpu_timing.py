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
    """(weight bytes, KV-cache bytes per token) of an engine: what one decode step must read, at
    the bytes each tensor really holds (FP8 weights and their scales, an FP8 cache and its scales)."""
    weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    caches = engine.runner.kv_caches
    per_token = sum(t[0, 0].numel() * t.element_size() for layer in caches for t in layer)
    return weights, per_token


def step_floor_s(weight_bytes: int, kv_bytes_per_token: int, context_tokens: int, bandwidth: float) -> float:
    """The least time a decode or verify step can take: it reads every weight once and the KV cache
    of every token in its requests' contexts once, at the measured copy bandwidth (bytes/s). The
    query rows a step computes (one, or a verify row's 1 + k) do not add HBM bytes worth counting."""
    return (weight_bytes + context_tokens * kv_bytes_per_token) / bandwidth


def fp8_matmul_rate(m: int = 8192, n: int = 8192, k: int = 8192) -> float:
    """torch._scaled_mm's FP8 (e4m3) rate in FLOP/s at m x n x k with per-tensor scales and bf16
    output: the device's FP8 tensor-core ceiling as a vendor library reaches it."""
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    ms = median_ms(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), reps=10)
    return 2 * m * n * k / (ms * 1e-3)


def fp8_gemm_rates(shape: dict[str, Any], m: int) -> dict[str, Any]:
    """The engine's FP8 linear (activation quantisation included) at a prefill size — M = m rows
    through the workload's gate/up projection (N = 2 x intermediate, K = hidden) — against
    torch._scaled_mm's 8192^3 ceiling measured in the same call. Call torch.cuda.empty_cache()
    afterwards before building an engine (it sizes its KV cache from the free memory)."""
    from shardinfer.kernels import fp8_matmul
    from shardinfer.kernels.reference_fp8 import quantize_blocks

    n, k = 2 * int(shape["intermediate_size"]), int(shape["hidden_size"])
    ceiling = fp8_matmul_rate()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    wq, ws = quantize_blocks(torch.randn(n, k, device="cuda") * k**-0.5)
    ours = 2 * m * n * k / (median_ms(lambda: fp8_matmul.linear_fp8(x, wq, ws), reps=10) * 1e-3)
    return {"m": m, "n": n, "k": k, "ours_tflops": ours / 1e12, "ceiling_tflops": ceiling / 1e12,
            "fraction_of_ceiling": ours / ceiling}
