"""Timing helpers shared by the GPU benchmarks: CUDA-event medians and the device's ceilings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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


def gpu_probe() -> dict[str, float]:
    """Copy bandwidth (GB/s) and bf16 matmul rate (TFLOP/s) of the GPU now, on fixed work: taken
    before each engine run of a call, it tells a run made slow by the GPU (the probe slower too)
    from one made slow by its own state (the probe as fast as before the other runs)."""
    probe = {"copy_GBps": _timed_copy(1 << 29) / 1e9, "matmul_TFLOPs": _timed_matmul(4096) / 1e12}
    torch.cuda.empty_cache()
    return probe


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


@dataclass(frozen=True)
class StepBytes:
    """What one decode or verify step of an engine reads from HBM, at the bytes each tensor really
    holds (FP8 weights and their scales, an FP8 cache and its scales)."""

    dense: int  # weights every step reads whole
    experts: int  # the routed experts' weights, all layers (0: a dense model)
    num_experts: int  # routed experts per MoE layer
    top_k: int  # experts each token is routed to
    kv_per_token: int  # KV-cache bytes of one context token, all layers

    def weights(self, rows: int) -> float:
        """Weight bytes a step of `rows` token rows reads: the dense weights, and each MoE layer's
        experts in proportion to how many of them the rows are expected to touch. A token picks
        top_k distinct experts, so under uniform routing (what random-init routers give) an
        expert is missed by all rows with probability (1 - top_k / num_experts) ** rows."""
        if not self.experts:
            return float(self.dense)
        touched = 1.0 - (1.0 - self.top_k / self.num_experts) ** rows
        return self.dense + self.experts * touched

    def floor_s(self, rows: int, context_tokens: int, bandwidth: float) -> float:
        """The least time a step can take: its weights (weights(rows)) and the KV cache of every
        token in its requests' contexts, read once at the measured copy bandwidth (bytes/s). A
        verify row's extra query rows add no bytes beyond the experts they touch."""
        return (self.weights(rows) + context_tokens * self.kv_per_token) / bandwidth


def decode_bytes(engine: Any, drafting_mtp: bool = False) -> StepBytes:
    """The StepBytes of an engine's decode steps. Not counted as read by every step: the token
    embedding table unless the LM head shares it (a step reads only its rows' entries) and the MTP
    layer unless it drafts (`drafting_mtp`); the routed experts count by expected use."""
    from shardinfer.engine.models.deepseek_moe import DeepseekMoE

    model = engine.model

    def size(params: Any) -> int:
        return sum(p.numel() * p.element_size() for p in params)

    every = {id(p): p for p in model.parameters()}
    skipped: set[int] = set()
    embed = next((m for name, m in model.named_modules() if name.endswith("embed_tokens")), None)
    head = getattr(model, "lm_head", None)
    if embed is not None and (head is None or head.weight is not embed.weight):
        skipped |= {id(p) for p in embed.parameters()}
    mtp = getattr(model, "mtp", None)
    if mtp is not None and not drafting_mtp:
        skipped |= {id(p) for p in mtp.parameters()}
    moe = [m for m in model.modules() if isinstance(m, DeepseekMoE)]
    expert_ids = {id(p) for m in moe for p in m.experts.parameters()} - skipped
    experts = size(every[i] for i in expert_ids)
    dense = size(p for i, p in every.items() if i not in skipped and i not in expert_ids)
    routing = moe[0].gate.routing if moe else None
    caches = engine.runner.kv_caches
    per_token = sum(t[0, 0].numel() * t.element_size() for layer in caches for t in layer)
    return StepBytes(
        dense, experts, routing.n_routed_experts if routing else 0, routing.top_k if routing else 0, per_token
    )


def fp8_matmul_rate(m: int = 8192, n: int = 8192, k: int = 8192) -> float:
    """torch._scaled_mm's FP8 (e4m3) rate in FLOP/s at m x n x k with per-tensor scales and bf16
    output: the device's FP8 tensor-core ceiling as a vendor library reaches it."""
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    ms = median_ms(
        lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), reps=10
    )
    return 2 * m * n * k / (ms * 1e-3)


def fp8_gemm_rates(shape: dict[str, Any], m: int) -> dict[str, Any]:
    """The engine's FP8 linear (activation quantisation included) at a prefill size — M = m rows
    through the workload's gate/up projection (N = 2 x intermediate, K = hidden) — against
    torch._scaled_mm's 8192^3 ceiling measured in the same call. `ours_tflops` is device time (a
    CUDA-graph replay, as the ceiling's large matmul is device-bound too); `ours_eager_tflops`
    times plain calls, which include the host's launch cost where it exceeds a small problem's
    kernels (what this field held before). Call torch.cuda.empty_cache() afterwards before
    building an engine (it sizes its KV cache from the free memory)."""
    from shardinfer.kernels import fp8_matmul
    from shardinfer.kernels.reference_fp8 import quantize_blocks

    n, k = 2 * int(shape["intermediate_size"]), int(shape["hidden_size"])
    ceiling = fp8_matmul_rate()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    wq, ws = quantize_blocks(torch.randn(n, k, device="cuda") * k**-0.5)
    flop = 2 * m * n * k
    ours = flop / (graph_ms(lambda: fp8_matmul.linear_fp8(x, wq, ws)) * 1e-3)
    eager = flop / (median_ms(lambda: fp8_matmul.linear_fp8(x, wq, ws), reps=10) * 1e-3)
    return {
        "m": m,
        "n": n,
        "k": k,
        "ours_tflops": ours / 1e12,
        "ours_eager_tflops": eager / 1e12,
        "ceiling_tflops": ceiling / 1e12,
        "fraction_of_ceiling": ours / ceiling,
    }
