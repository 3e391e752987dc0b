"""FP8 (e4m3) quantisation and the FP8 linear layer in plain PyTorch: the CPU path and the oracle
the Triton kernels (fp8_matmul.py, fp8_quant.py) are tested against.

Weight formats, told apart by the scale's rank (one less than the weight's: per output channel):

    weight            [N, K] float8_e4m3fn
    block scales      [ceil(N / 128), ceil(K / 128)] float32   real weight = fp8 value * its block's scale
                      (DeepSeek-V3's `weight_scale_inv`, which Qwen3's FP8 checkpoints share)
    channel scales    [N] float32                              real weight = fp8 value * its row's scale
                      (per-channel checkpoints' `weight_scale` [N, 1]; a per-tensor scale broadcast)
    activation        [M, K] -> fp8 [M, K] and scales [M, ceil(K / 128)] float32, one per token and
                      group of 128 channels ("1x128"), quantised on the fly at every call

Activation (and KV-cache) scales are powers of two: the smallest 2^p with amax / 2^p <= 448
(e4m3's largest finite value). Dividing by a power of two is exact, so the quantised bits are a
function of the values alone, identical in this reference, the interpreter and the GPU kernel,
and a row's bits never depend on its neighbours (the scale is per row). The cost against an
amax / 448 scale is at most one binade of headroom: the scaled amax lands in (224, 448], not at
448, which changes nothing for normal numbers (e4m3 keeps 3 mantissa bits at every exponent) and
only moves the subnormal floor. Weights are quantised once, off the hot path, with the
checkpoints' own amax / 448 float32 scales.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardinfer.kernels import reference
from shardinfer.kernels._common import FLOAT_DTYPES, fail

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
GROUP = 128  # activation group and weight block edge
WEIGHT_BLOCK = (GROUP, GROUP)
# Scales never go below this (an all-zero group still gets a finite scale; its values stay 0).
MIN_AMAX = 2.0**-100


def pow2_scale(amax: torch.Tensor) -> torch.Tensor:
    """The smallest power of two s with amax / s <= 448, elementwise (float32).

    amax = m * 2^e with m in [1, 2): 448 = 1.75 * 2^8, so s = 2^(e - 8) when m <= 1.75 and
    2^(e - 7) otherwise. frexp and ldexp are exact, so this is too.
    """
    a = amax.float().clamp_min(MIN_AMAX)
    mant, exp = torch.frexp(a)  # a = mant * 2^exp, mant in [0.5, 1)
    e = exp - 1
    p = torch.where(mant * 2 <= 1.75, e - 8, e - 7)
    return torch.ldexp(torch.ones_like(a), p.to(torch.float32))


def _pad_groups(x: torch.Tensor, group: int) -> torch.Tensor:
    pad = (-x.shape[-1]) % group
    return torch.nn.functional.pad(x, (0, pad)) if pad else x


def quantize_groups(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (fp8 [..., K], power-of-two scales [..., ceil(K / group)] float32).

    Each run of `group` channels of a row (the last may be shorter) gets its own scale.
    """
    k = x.shape[-1]
    xf = _pad_groups(x.float(), group)
    g = xf.reshape(*xf.shape[:-1], -1, group)
    scale = pow2_scale(g.abs().amax(-1))
    q = (g / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(xf.shape)[..., :k].contiguous(), scale


@dataclass(frozen=True)
class Fp8Activation:
    """An activation already quantised per 1x128 group (quantize_groups' output), standing in for
    the float tensor it was made from. A kernel that computes an FP8 linear's input can write this
    instead of its float output (ops.fused_add_rms_norm_fp8, ops.silu_and_mul_fp8), and the linear
    consumes it as is (ops.linear_fp8_prequantized) rather than quantising again.

        q      [..., K] float8_e4m3fn, contiguous
        scale  [..., ceil(K / 128)] float32, contiguous
        dtype  the float activation's dtype: the one the linear's output takes
    """

    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype

    def __post_init__(self) -> None:
        if self.q.dtype != FP8_DTYPE or not self.q.is_contiguous() or self.q.dim() == 0:
            raise fail(
                "Fp8Activation.q",
                f"{self.q.dtype} {tuple(self.q.shape)} with strides {self.q.stride()}",
                f"need a contiguous {FP8_DTYPE} tensor [..., K]",
            )
        groups = -(-self.q.shape[-1] // GROUP)
        if (
            self.scale.dtype != torch.float32
            or not self.scale.is_contiguous()
            or tuple(self.scale.shape) != (*self.q.shape[:-1], groups)
        ):
            raise fail(
                "Fp8Activation.scale",
                f"{self.scale.dtype} {tuple(self.scale.shape)}",
                f"need contiguous float32 {(*self.q.shape[:-1], groups)}, one per row and 128 channels",
            )
        if self.dtype not in FLOAT_DTYPES:
            raise fail(
                "Fp8Activation.dtype", self.dtype, f"need the float activation's dtype, one of {FLOAT_DTYPES}"
            )


def dequantize_groups(q: torch.Tensor, scale: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """Inverse of quantize_groups, in float32."""
    k = q.shape[-1]
    s = scale.float().repeat_interleave(group, dim=-1)[..., :k]
    return q.float() * s


def quantize_blocks(
    w: torch.Tensor, block: tuple[int, int] = WEIGHT_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (fp8 [N, K], weight_scale_inv [ceil(N / bn), ceil(K / bk)] float32).

    The checkpoints' scheme: scale = block amax / 448 in float32, q = fp8(w / scale) rounded to
    nearest even. Deterministic: elementwise IEEE operations and a max, the same on any device.
    """
    n, k = w.shape
    bn, bk = block
    wf = torch.nn.functional.pad(w.float(), (0, (-k) % bk, 0, (-n) % bn))
    tiles = wf.view(wf.shape[0] // bn, bn, wf.shape[1] // bk, bk)
    scale = tiles.abs().amax(dim=(1, 3)).clamp_min(MIN_AMAX) / FP8_MAX
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(wf.shape)[:n, :k].contiguous(), scale


def dequantize_blocks(
    q: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int] = WEIGHT_BLOCK,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """fp8 [N, K] with scales [ceil(N / bn), ceil(K / bk)] -> [N, K] in dtype (via float32)."""
    n, k = q.shape
    bn, bk = block
    s = scale.float().repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
    return (q.float() * s).to(dtype)


def quantize_channels(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (fp8 [N, K], scales [N] float32): scale = row amax / 448 in float32, q =
    fp8(w / scale) rounded to nearest even. Each row on its own, so rows of a fused projection can
    be quantised piece by piece."""
    wf = w.float()
    scale = wf.abs().amax(dim=1).clamp_min(MIN_AMAX) / FP8_MAX
    q = (wf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def dequantize_channels(
    q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """fp8 [N, K] with scales [N] -> [N, K] in dtype (via float32)."""
    return (q.float() * scale.float()[:, None]).to(dtype)


def is_channel_scale(weight: torch.Tensor, scale: torch.Tensor) -> bool:
    """Whether `scale` is a per-output-channel scale of `weight` (rank one less: [N] for [N, K],
    [E, N] for stacked experts [E, N, K]) rather than a block scale (same rank)."""
    return scale.dim() == weight.dim() - 1


def dequantize_weight(
    q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """fp8 [N, K] with block scales [ceil(N/128), ceil(K/128)] or channel scales [N] -> [N, K] in dtype."""
    if is_channel_scale(q, scale):
        return dequantize_channels(q, scale, dtype)
    return dequantize_blocks(q, scale, WEIGHT_BLOCK, dtype)


def linear_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    batch_invariant: bool = True,
) -> torch.Tensor:
    """y = x @ W.T + bias with W = dequantize_weight(weight, weight_scale) and x first rounded
    through FP8 per 1x128 group, as the GPU kernel does; the product in float32, y in x's dtype.

    x [..., K] float; weight [N, K] float8_e4m3fn; weight_scale [ceil(N/128), ceil(K/128)] (block
    scales) or [N] (channel scales), float32.
    """
    xq, xs = quantize_groups(x)
    return linear_fp8_prequantized(
        Fp8Activation(xq, xs, x.dtype), weight, weight_scale, bias, batch_invariant
    )


def linear_fp8_prequantized(
    x: Fp8Activation,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    batch_invariant: bool = True,
) -> torch.Tensor:
    """linear_fp8 from its quantised input on: dequantise both operands, the product in float32,
    y [..., N] in x.dtype. linear_fp8 is this after quantize_groups, so the two agree bit for bit."""
    xd = dequantize_groups(x.q, x.scale)
    w = dequantize_weight(weight, weight_scale)
    y = reference.linear(xd, w, None if bias is None else bias.float(), batch_invariant)
    return y.to(x.dtype)
