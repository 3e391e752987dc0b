"""FP8 block-scaled checkpoints (DeepSeek-V3's release format), dequantised at load.

config.json announces them with

    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]}

and every quantised linear weight `X.weight` (float8_e4m3fn, [N, K]) comes with `X.weight_scale_inv`
(float32, [ceil(N / 128), ceil(K / 128)]): the real weight is `fp8 value * scale` blockwise (the
name says "inverse" because the quantiser divided by it). The CPU reference path dequantises once,
here, to the engine's dtype; activations are never quantised on this path.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from shardinfer.errors import CheckpointError, ModelLoadError

SCALE_SUFFIX = ".weight_scale_inv"
FP8_DTYPES = (torch.float8_e4m3fn,)


def fp8_block_size(hf_config: dict[str, Any]) -> tuple[int, int] | None:
    """The (rows, cols) weight block of an FP8 block-scaled checkpoint, or None if not quantised."""
    qc = hf_config.get("quantization_config")
    if not qc:
        return None
    method = qc.get("quant_method")
    if method != "fp8":
        raise ModelLoadError(f"quantization_config.quant_method={method!r} is not supported; supported: 'fp8' "
                             "(block-scaled float8_e4m3fn weights), or an unquantised checkpoint")
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ModelLoadError(f"quantization_config.fmt={fmt!r} is not supported; supported: 'e4m3'")
    block = qc.get("weight_block_size")
    if not (isinstance(block, list | tuple) and len(block) == 2 and all(int(b) > 0 for b in block)):
        raise ModelLoadError(f"quantization_config.weight_block_size={block!r} must be two positive ints, "
                             "e.g. [128, 128] (per-tensor FP8 scales are not supported)")
    return int(block[0]), int(block[1])


def dequantize_block_fp8(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                         dtype: torch.dtype, name: str = "weight") -> torch.Tensor:
    """weight [N, K] float8 with scale_inv [ceil(N/bn), ceil(K/bk)] -> dequantised [N, K] in dtype."""
    n, k = weight.shape
    bn, bk = block
    want = (-(-n // bn), -(-k // bk))
    if tuple(scale_inv.shape) != want:
        raise CheckpointError(f"{name}{SCALE_SUFFIX[len('.weight'):]} has shape {tuple(scale_inv.shape)}; a "
                              f"{n}x{k} weight in {bn}x{bk} blocks needs {want}: is weight_block_size right?")
    scale = scale_inv.float().repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
    return (weight.float() * scale).to(dtype)


def dequantize_checkpoint(weights: Iterable[tuple[str, torch.Tensor]], block: tuple[int, int] | None,
                          dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass tensors through, replacing each (FP8 weight, weight_scale_inv) pair by the dequantised weight.

    A weight and its scale may arrive in either order (shards are read in file order), so whichever
    comes first waits for its partner. Unpaired FP8 weights or scales are checkpoint errors.
    """
    pending_weights: dict[str, torch.Tensor] = {}
    pending_scales: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if name.endswith(SCALE_SUFFIX):
            base = name[: -len(SCALE_SUFFIX)] + ".weight"
            if base in pending_weights:
                yield base, _dequant(pending_weights.pop(base), tensor, block, dtype, base)
            else:
                pending_scales[base] = tensor
        elif tensor.dtype in FP8_DTYPES:
            if name in pending_scales:
                yield name, _dequant(tensor, pending_scales.pop(name), block, dtype, name)
            else:
                pending_weights[name] = tensor
        else:
            yield name, tensor
    if pending_weights:
        names = sorted(pending_weights)
        raise CheckpointError(f"FP8 tensor(s) {names[:3]} have no {SCALE_SUFFIX[1:]} scale in the checkpoint; "
                              "only block-scaled FP8 checkpoints are supported")
    if pending_scales:
        names = sorted(pending_scales)
        raise CheckpointError(f"checkpoint has scales for {names[:3]} but those weights are not float8_e4m3fn")


def _dequant(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None, dtype: torch.dtype,
             name: str) -> torch.Tensor:
    if block is None:
        raise CheckpointError(f"checkpoint holds FP8 tensor {name!r} but config.json has no quantization_config "
                              "announcing block-scaled FP8 weights (quant_method 'fp8', weight_block_size)")
    return dequantize_block_fp8(weight, scale, block, dtype, name)
