"""Rotary position embedding tables: inverse frequencies for each scaling a supported config uses,
and cos/sin tables indexed by absolute position (precomputed once, float32).

The tables are always computed on the host (explicitly: models are built under the meta device)
and then moved, so their values do not depend on the device the model runs on."""

from __future__ import annotations

import math
from typing import Any

import torch

from shardinfer.errors import ModelLoadError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _default_inv_freq(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))


def _llama3(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor = float(s["factor"])
    low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old_len = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 0.1 * mscale * math.log(scale) + 1.0 if scale > 1 else 1.0


def _yarn(dim: int, base: float, s: dict[str, Any], max_pos: int) -> tuple[torch.Tensor, float]:
    factor = float(s["factor"])
    orig = int(s.get("original_max_position_embeddings") or max_pos)
    beta_fast, beta_slow = float(s.get("beta_fast") or 32), float(s.get("beta_slow") or 1)
    mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        if mscale and mscale_all:
            attention_factor = yarn_mscale(factor, float(mscale)) / yarn_mscale(factor, float(mscale_all))
        else:
            attention_factor = yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, device="cpu").float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)


def rope_inv_freq(dim: int, base: float, scaling: dict[str, Any] | None,
                  max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [dim // 2], attention factor multiplying cos and sin)."""
    kind = (scaling or {}).get("rope_type", "default")
    inv = _default_inv_freq(dim, base)
    if kind == "default":
        return inv, 1.0
    assert scaling is not None
    if kind == "linear":
        return inv / float(scaling["factor"]), 1.0
    if kind == "llama3":
        return _llama3(inv, scaling), 1.0
    if kind == "yarn":
        return _yarn(dim, base, scaling, max_position_embeddings)
    raise ModelLoadError(f"rope scaling type {kind!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}")


class RopeTable:
    """cos/sin [max_positions, dim // 2] float32 on a device, gathered per token position."""

    def __init__(self, dim: int, base: float, scaling: dict[str, Any] | None, max_positions: int,
                 max_position_embeddings: int) -> None:
        inv_freq, factor = rope_inv_freq(dim, base, scaling, max_position_embeddings)
        pos = torch.arange(max_positions, dtype=torch.float32, device="cpu")
        freqs = torch.outer(pos, inv_freq)
        self.cos = freqs.cos() * factor
        self.sin = freqs.sin() * factor

    def to(self, device: torch.device | str) -> None:
        """Move the tables to `device` (a plain object, so Module.to does not reach them)."""
        self.cos, self.sin = self.cos.to(device), self.sin.to(device)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions], self.sin[positions]
