"""Rotary position embedding tables: inverse frequencies for each scaling a supported config uses,
and cos/sin tables indexed by absolute position (precomputed once, float32).

The tables are always computed on the host (explicitly: models are built under the meta device)
and then moved, so their values do not depend on the device the model runs on."""

from __future__ import annotations

import math
from typing import Any

import torch

from shardinfer.errors import ModelLoadError

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
# The keys transformers requires of each scaling (it refuses a config without them, and so do we).
# config.ModelConfig fills original_max_position_embeddings in as transformers does.
_REQUIRED_KEYS = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
}


def _default_inv_freq(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))


def _llama3(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor = float(s["factor"])
    low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
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
    orig = int(s["original_max_position_embeddings"])
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


def rope_inv_freq(
    dim: int, base: float, scaling: dict[str, Any] | None, max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    """(inv_freq [dim // 2], attention factor multiplying cos and sin)."""
    kind = check_rope_scaling(scaling)
    inv = _default_inv_freq(dim, base)
    if kind in ("default", "dynamic"):
        # Dynamic NTK scaling changes the frequencies only for sequences longer than
        # max_position_embeddings, and the engine never runs one (max_model_len is capped there).
        return inv, 1.0
    assert scaling is not None
    if kind == "linear":
        return inv / float(scaling["factor"]), 1.0
    if kind == "llama3":
        return _llama3(inv, scaling), 1.0
    return _yarn(dim, base, scaling, max_position_embeddings)


def check_rope_scaling(scaling: dict[str, Any] | None) -> str:
    """The scaling's rope_type, or a ModelLoadError naming the config value the engine cannot honour."""
    kind = str((scaling or {}).get("rope_type", "default"))
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"config.json rope_scaling (or rope_parameters) has rope_type={kind!r}, which this "
            f"engine does not implement; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    for key in _REQUIRED_KEYS.get(kind, ()):
        value = (scaling or {}).get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ModelLoadError(
                f"config.json rope_scaling (or rope_parameters) of rope_type={kind!r} has "
                f"{key}={value!r}: it needs a positive number there (transformers refuses "
                "it too); fix config.json"
            )
    return kind


class RopeTable:
    """cos/sin [max_positions, dim // 2] float32 on a device, gathered per token position."""

    def __init__(
        self,
        dim: int,
        base: float,
        scaling: dict[str, Any] | None,
        max_positions: int,
        max_position_embeddings: int,
    ) -> None:
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
