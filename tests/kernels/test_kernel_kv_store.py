"""KV store kernel: writes land at slot_mapping, slot -1 is skipped, nothing else changes."""

from __future__ import annotations

import pytest
import torch

from shardinfer.kernels import kv_store, reference


@pytest.mark.parametrize("entry", [(2, 16), (36,)])
def test_store_kv_matches_reference_and_skips_minus_one(device: torch.device, entry: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(5, 4, *entry, generator=gen)
    values = torch.randn(6, *entry, generator=gen)
    slots = torch.tensor([7, 0, -1, 19, 3, -1], dtype=torch.int64)
    expected = cache.clone()
    keep = slots >= 0
    reference.store_kv(expected, values[keep], slots[keep])
    got = cache.clone().to(device)
    kv_store.store_kv(got, values.to(device), slots.to(device))
    assert torch.equal(got.cpu(), expected)


def test_store_kv_casts_and_accepts_strided_token_rows(device: torch.device) -> None:
    fused = torch.randn(3, 5 * 8)
    k = fused[:, 8:24].view(3, 2, 8)  # token stride 40, entry [2, 8] contiguous
    cache = torch.zeros(2, 4, 2, 8, dtype=torch.float16)
    slots = torch.tensor([1, 6, 2], dtype=torch.int32)
    got = cache.clone().to(device)
    kv_store.store_kv(
        got,
        k.to(device) if device.type == "cpu" else fused.to(device)[:, 8:24].view(3, 2, 8),
        slots.to(device),
    )
    expected = cache.clone()
    reference.store_kv(expected, k, slots.long())
    assert torch.equal(got.cpu(), expected)


def test_store_kv_rejects_bad_inputs(device: torch.device) -> None:
    cache = torch.zeros(2, 4, 2, 8, device=device)
    vals = torch.zeros(3, 2, 8, device=device)
    with pytest.raises(ValueError, match=r"values.shape"):
        kv_store.store_kv(
            cache, torch.zeros(3, 2, 4, device=device), torch.zeros(3, dtype=torch.int64, device=device)
        )
    with pytest.raises(ValueError, match=r"slot_mapping.shape"):
        kv_store.store_kv(cache, vals, torch.zeros(2, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match=r"slot_mapping.dtype"):
        kv_store.store_kv(cache, vals, torch.zeros(3, device=device))
    with pytest.raises(ValueError, match=r"contiguous"):
        kv_store.store_kv(cache.transpose(0, 1), vals, torch.zeros(3, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match=r"entry contiguous"):
        kv_store.store_kv(
            cache,
            torch.zeros(3, 8, 2, device=device).transpose(1, 2),
            torch.zeros(3, dtype=torch.int64, device=device),
        )
