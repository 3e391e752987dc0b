"""Allocation of the paged KV cache: one set of tensors per attention layer, sized from an
explicit byte budget or a fraction of the device's free memory.

    layer i: entries[e] = tensor [num_blocks, block_size, *spec.entries[e]]

With kv_cache_dtype "fp8" each entry is float8_e4m3fn and is followed, after all the layer's
entries, by its float32 scales [num_blocks, block_size, *entry[:-1], ceil(entry[-1] / 128)]:
dense layers hold (K, V, K scales, V scales), MLA layers (latent cache, its scales).

Why per token (and per head, per 128 values) scales, not per block or static per head: a block
is written one token at a time, so its amax is unknown until it is full, and rescaling the
tokens already stored would change values that attention has already read (a row's result
would then depend on how its block was filled: by chunking, batching, or a prefix-cache hit).
Static per-head scales would need calibration data this tool does not have. A scale computed
from the token's own values at store time makes its stored bits a function of those values
alone, so batch invariance and prefix caching hold unchanged; the scales are powers of two
(reference_fp8.py), so dequantising in the attention kernels is exact. They cost 4 bytes per 128
values (about 3% of the FP8 cache).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from shardinfer.engine.models.base import KVLayerSpec
from shardinfer.kernels.reference_fp8 import FP8_DTYPE, GROUP


def scale_shape(entry: tuple[int, ...]) -> tuple[int, ...]:
    """The per-token scale shape of an FP8 cache entry: one float32 per 128 values of its last dim."""
    return (*entry[:-1], -(-entry[-1] // GROUP))


def bytes_per_block(specs: list[KVLayerSpec], block_size: int, dtype: torch.dtype, fp8: bool = False) -> int:
    if not fp8:
        return sum(s.values_per_token for s in specs) * block_size * dtype.itemsize
    scales = sum(math.prod(scale_shape(e)) for s in specs for e in s.entries)
    return (sum(s.values_per_token for s in specs) * FP8_DTYPE.itemsize + scales * 4) * block_size


def kv_budget_bytes(
    device: torch.device, explicit_bytes: int | None, memory_fraction: float, step_peak: int = 0
) -> int:
    """The KV cache's byte budget: explicit, else a fraction of what the device has free, less a
    step's measured peak (engine/step_peak.py), which must fit in the same share beside it."""
    if explicit_bytes is not None:
        if explicit_bytes <= 0:
            raise ValueError(f"kv_cache_memory_bytes={explicit_bytes}: must be > 0")
        return int(explicit_bytes)
    if not (0.0 < memory_fraction <= 1.0):
        raise ValueError(f"gpu_memory_utilization={memory_fraction}: must be in (0, 1]")
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * memory_fraction) - step_peak
    return 1 << 30  # CPU: 1 GiB unless told otherwise; the host is shared with the data pipeline


def allocate_kv_caches(
    specs: list[KVLayerSpec],
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    fp8: bool = False,
) -> list[tuple[torch.Tensor, ...]]:
    if not fp8:
        return [
            tuple(
                torch.zeros(num_blocks, block_size, *shape, dtype=dtype, device=device) for shape in s.entries
            )
            for s in specs
        ]
    return [
        tuple(
            torch.zeros(num_blocks, block_size, *shape, dtype=FP8_DTYPE, device=device) for shape in s.entries
        )
        + tuple(
            torch.zeros(num_blocks, block_size, *scale_shape(shape), dtype=torch.float32, device=device)
            for shape in s.entries
        )
        for s in specs
    ]


def plan_num_blocks(
    cfg: Any,
    specs: list[KVLayerSpec],
    device: torch.device,
    dtype: torch.dtype,
    max_model_len: int,
    step_peak: int = 0,
) -> int:
    """How many KV blocks to allocate for an EngineConfig: explicit, or from the byte budget
    (less `step_peak` bytes, a step's measured peak, where it comes from the free memory)."""
    if cfg.num_kv_blocks is not None:
        return int(cfg.num_kv_blocks)
    per_block = bytes_per_block(specs, cfg.block_size, dtype, cfg.kv_cache_dtype == "fp8")
    budget = kv_budget_bytes(device, cfg.kv_cache_memory_bytes, cfg.gpu_memory_utilization, step_peak)
    num_blocks = max(0, budget) // per_block
    if device.type == "cpu" and cfg.kv_cache_memory_bytes is None:
        # Host memory is shared with the data pipeline: by default hold what max_num_seqs full-length
        # sequences need (plus as much again for cached prefixes), not the whole default budget.
        num_blocks = min(num_blocks, 2 * cfg.num_seqs * -(-max_model_len // cfg.block_size))
    if num_blocks < 2:
        if step_peak and cfg.kv_cache_memory_bytes is None:
            raise ValueError(
                f"the KV cache budget holds {num_blocks} block(s) of {per_block} bytes: "
                f"gpu_memory_utilization={cfg.gpu_memory_utilization} of the free memory leaves "
                f"{max(0, budget) / 2**30:.2f} GiB once a step's measured peak of "
                f"{step_peak / 2**30:.2f} GiB (max_num_batched_tokens={cfg.token_budget}, "
                f"max_num_seqs={cfg.num_seqs}) is set aside: raise gpu_memory_utilization, or "
                "lower max_num_batched_tokens / max_num_seqs"
            )
        raise ValueError(
            f"the KV cache budget holds {num_blocks} block(s) of {per_block} bytes: "
            "raise kv_cache_memory_bytes / gpu_memory_utilization"
        )
    return int(num_blocks)
