"""FP8 linear test problems and their float64 oracle, for both weight-scale layouts: 128x128 blocks
(quantised by the reference) and one scale per output row (quantised here in float64, never by the
code under test)."""

from __future__ import annotations

import torch
from kernel_checks import e4m3_round

from shardinfer.kernels import reference_fp8 as ref


def randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def quantize_rows64(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., N, K] -> (fp8 [..., N, K], scales [..., N] float32): each row's amax / 448 rounded to
    float32, each value w / scale rounded to the nearest e4m3 (ties to even) in float64."""
    w64 = w.double()
    scale = (w64.abs().amax(-1) / 448.0).float()
    q = e4m3_round(w64 / scale.double().unsqueeze(-1))
    return q.to(torch.float8_e4m3fn), scale


def dequantize_rows64(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.double() * scale.double().unsqueeze(-1)


def linear_problem(
    m: int, n: int, k: int, dtype: torch.dtype, seed: int, scales: str = "block"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x [m, k], fp8 weight [n, k], its scales, bias [n]) with block or per-row ("channel") scales."""
    x = randn(m, k, seed=seed).to(dtype)
    w = randn(n, k, seed=seed + 1, scale=k**-0.5)
    if scales == "block":
        wq, ws = ref.quantize_blocks(w)
    else:  # rows of very different magnitudes: a scale applied to the wrong column shows at once
        wq, ws = quantize_rows64(w * torch.logspace(-2, 2, n).unsqueeze(1))
    return x, wq, ws, randn(n, seed=seed + 2).to(dtype)


def linear_float64(
    x: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor, b: torch.Tensor | None
) -> torch.Tensor:
    """The same quantised operands (activations through the tested quantiser), in float64."""
    xq, xs = ref.quantize_groups(x)
    w64 = dequantize_rows64(wq, ws) if ws.dim() == 1 else ref.dequantize_blocks(wq, ws).double()
    y = ref.dequantize_groups(xq, xs).double() @ w64.T
    return y + b.double() if b is not None else y
