"""Allocation of the paged KV cache: one set of tensors per attention layer, sized from an
explicit byte budget or a fraction of the device's free memory.

    layer i: entries[e] = tensor [num_blocks, block_size, *spec.entries[e]]
"""

from __future__ import annotations

from typing import Any

import torch

from shardinfer.engine.models.base import KVLayerSpec


def bytes_per_block(specs: list[KVLayerSpec], block_size: int, dtype: torch.dtype) -> int:
    elem = dtype.itemsize
    return sum(s.values_per_token for s in specs) * block_size * elem


def kv_budget_bytes(device: torch.device, explicit_bytes: int | None, memory_fraction: float) -> int:
    """The KV cache's byte budget: explicit, else a fraction of what the device has free."""
    if explicit_bytes is not None:
        if explicit_bytes <= 0:
            raise ValueError(f"kv_cache_memory_bytes={explicit_bytes}: must be > 0")
        return int(explicit_bytes)
    if not (0.0 < memory_fraction <= 1.0):
        raise ValueError(f"gpu_memory_utilization={memory_fraction}: must be in (0, 1]")
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * memory_fraction)
    return 1 << 30  # CPU: 1 GiB unless told otherwise; the host is shared with the data pipeline


def allocate_kv_caches(specs: list[KVLayerSpec], num_blocks: int, block_size: int, dtype: torch.dtype,
                       device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    return [tuple(torch.zeros(num_blocks, block_size, *shape, dtype=dtype, device=device) for shape in s.entries)
            for s in specs]


def plan_num_blocks(cfg: Any, specs: list[KVLayerSpec], device: torch.device, dtype: torch.dtype,
                    max_model_len: int) -> int:
    """How many KV blocks to allocate for an EngineConfig: explicit, or from the byte budget."""
    if cfg.num_kv_blocks is not None:
        return int(cfg.num_kv_blocks)
    per_block = bytes_per_block(specs, cfg.block_size, dtype)
    num_blocks = kv_budget_bytes(device, cfg.kv_cache_memory_bytes, cfg.gpu_memory_utilization) // per_block
    if device.type == "cpu" and cfg.kv_cache_memory_bytes is None:
        # Host memory is shared with the data pipeline: by default hold what max_num_seqs full-length
        # sequences need (plus as much again for cached prefixes), not the whole default budget.
        num_blocks = min(num_blocks, 2 * cfg.max_num_seqs * -(-max_model_len // cfg.block_size))
    if num_blocks < 2:
        raise ValueError(f"the KV cache budget holds {num_blocks} block(s) of {per_block} bytes: "
                         "raise kv_cache_memory_bytes / gpu_memory_utilization")
    return int(num_blocks)
