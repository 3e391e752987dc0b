"""Write the new tokens' K or V (or MLA latent) rows into the paged cache.

    cache  [num_blocks, block_size, *entry]     entry = (Hk, D) for dense layers, (576,) for MLA
    values [T, *entry]                           slot_mapping [T]: block_id * block_size + offset

An FP8 cache (float8_e4m3fn) has a float32 scale tensor beside it, [num_blocks, block_size,
*entry[:-1], ceil(entry[-1] / 128)]: each token's values are quantised in groups of 128 along the
last dim with a power-of-two scale (fp8_quant.py, the semantics of reference_fp8.quantize_groups),
so what a token stores depends on its own values only.

Slot -1 means "do not store" (padding rows of a CUDA-graph batch, or tokens whose KV is already
cached). The store must run before attention in the same step: the attention kernel reads this
step's keys from the cache, which is what keeps prefill, chunked prefill and decode on one code
path and one reduction order.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from shardinfer.kernels._common import FLOAT_DTYPES, check_same_device, check_tensor, fail
from shardinfer.kernels.fp8_quant import pow2_scale_bits, to_e4m3
from shardinfer.kernels.reference_fp8 import FP8_DTYPE, GROUP

_BLOCK = 1024


@triton.jit
def _store_kv_kernel(values_ptr, cache_ptr, slots_ptr, sv, entry, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    if slot >= 0:
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < entry
        v = tl.load(values_ptr + t.to(tl.int64) * sv + cols, mask=mask)
        tl.store(cache_ptr + slot * entry + cols, v.to(cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_kv_fp8_kernel(
    values_ptr, cache_ptr, scale_ptr, slots_ptr, sv, rows, width, groups, GROUP_SIZE: tl.constexpr
):
    """One program per (token, entry row, group): quantise GROUP_SIZE values with their own scale."""
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    if slot >= 0:
        r = tl.program_id(1)
        g = tl.program_id(2)
        cols = g * GROUP_SIZE + tl.arange(0, GROUP_SIZE)
        mask = cols < width
        v = tl.load(values_ptr + t.to(tl.int64) * sv + r * width + cols, mask=mask, other=0.0).to(tl.float32)
        scale, inv = pow2_scale_bits(tl.max(tl.abs(v), axis=0))
        q = to_e4m3(v, inv)
        tl.store(cache_ptr + (slot * rows + r) * width + cols, q.to(cache_ptr.dtype.element_ty), mask=mask)
        tl.store(scale_ptr + (slot * rows + r) * groups + g, scale)


def store_kv_fp8(
    cache: torch.Tensor, scale: torch.Tensor, values: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """store_kv into an FP8 cache: cache [num_blocks, block_size, *entry] float8_e4m3fn and scale
    [num_blocks, block_size, *entry[:-1], ceil(entry[-1] / 128)] float32, both contiguous."""
    check_tensor("cache", cache, dtypes=(FP8_DTYPE,), contiguous=True)
    check_tensor("scale", scale, dtypes=(torch.float32,), contiguous=True)
    entry = _check_values(cache, values, slot_mapping)
    width = cache.shape[-1]
    groups = triton.cdiv(width, GROUP)
    want = (*cache.shape[:-1], groups)
    if tuple(scale.shape) != want:
        raise fail(
            "scale.shape", tuple(scale.shape), f"need {want}: one scale per 128 values of each entry row"
        )
    check_same_device(cache=cache, scale=scale, values=values, slot_mapping=slot_mapping)
    t = values.shape[0]
    if t == 0 or entry == 0:
        return
    rows = entry // width
    _store_kv_fp8_kernel[(t, rows, groups)](
        values,
        cache,
        scale,
        slot_mapping,
        values.stride(0),
        rows,
        width,
        groups,
        GROUP_SIZE=GROUP,
        num_warps=1,
    )


def _check_values(cache: torch.Tensor, values: torch.Tensor, slot_mapping: torch.Tensor) -> int:
    """Checks shared by both stores; returns the values per token."""
    check_tensor("values", values, dtypes=FLOAT_DTYPES)
    check_tensor("slot_mapping", slot_mapping, dtypes=(torch.int32, torch.int64), ndim=1, contiguous=True)
    if cache.dim() < 3:
        raise fail("cache.dim()", cache.dim(), "need [num_blocks, block_size, *entry] (>= 3 dims)")
    entry_shape = tuple(cache.shape[2:])
    if tuple(values.shape[1:]) != entry_shape:
        raise fail("values.shape", tuple(values.shape), f"need (T, *{entry_shape}) to match the cache")
    if values.shape[0] != slot_mapping.shape[0]:
        raise fail(
            "slot_mapping.shape", tuple(slot_mapping.shape), f"need ({values.shape[0]},), one slot per token"
        )
    inner = values[0] if values.shape[0] else values
    if values.shape[0] and not inner.is_contiguous():
        raise fail("values", f"strides {tuple(values.stride())}", "need each token's entry contiguous")
    return math.prod(entry_shape)


def store_kv(cache: torch.Tensor, values: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """cache.view(-1, *entry)[slot_mapping[t]] = values[t] for every t with slot_mapping[t] >= 0.

    cache: contiguous [num_blocks, block_size, *entry]; values: [T, *entry], any float dtype
    (cast to the cache's), each token's entry contiguous (a per-token view of a fused
    projection is fine); slot_mapping: [T] int32/int64. Slots must be < num_blocks * block_size.
    """
    check_tensor("cache", cache, dtypes=FLOAT_DTYPES, contiguous=True)
    entry = _check_values(cache, values, slot_mapping)
    check_same_device(cache=cache, values=values, slot_mapping=slot_mapping)
    t = values.shape[0]
    if t == 0 or entry == 0:
        return
    _store_kv_kernel[(t, triton.cdiv(entry, _BLOCK))](
        values, cache, slot_mapping, values.stride(0), entry, BLOCK=_BLOCK
    )
