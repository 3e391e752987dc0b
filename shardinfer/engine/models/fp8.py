"""FP8 block-scaled weights: checkpoints in DeepSeek-V3's release format, and quantising at load.

config.json announces such checkpoints with

    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]}

and every quantised linear weight `X.weight` (float8_e4m3fn, [N, K]) comes with `X.weight_scale_inv`
(float32, [ceil(N / 128), ceil(K / 128)]): the real weight is `fp8 value * scale` blockwise (the
name says "inverse" because the quantiser divided by it).

What runs (`resolve_quantization`): the engine's `quantization` None follows the checkpoint (an
FP8 checkpoint in 128x128 blocks stays FP8; any other FP8 block size is dequantised to the
engine's dtype, activations then never quantised); "fp8" keeps every quantizable Linear in FP8
(a float checkpoint is quantised at load, on the device, by reference_fp8.quantize_blocks);
"none" dequantises FP8 checkpoints at load. FP8 Linears hold exactly the checkpoint's 128x128
blocks and scales (`WeightLoader`), except where a fused projection joins pieces at rows that are
not multiples of 128 (tiny test models): such a Linear is assembled in float and quantised once
complete.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from shardinfer.errors import CheckpointError, ModelLoadError
from shardinfer.kernels.reference_fp8 import GROUP, WEIGHT_BLOCK, dequantize_blocks, quantize_blocks

SCALE_SUFFIX = ".weight_scale_inv"
FP8_DTYPES = (torch.float8_e4m3fn,)
QUANTIZATIONS = (None, "fp8", "none")


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


def resolve_quantization(requested: str | None, hf_config: dict[str, Any]) -> str | None:
    """The weight format the model runs: "fp8" or None (the engine's dtype); module docstring."""
    if requested not in QUANTIZATIONS:
        raise ValueError(f"quantization={requested!r} is not supported; use 'fp8' (block-scaled FP8 weights), "
                         "'none' (dequantise FP8 checkpoints) or leave it unset (follow the checkpoint)")
    if requested == "none":
        return None
    if requested == "fp8":
        return "fp8"
    return "fp8" if fp8_block_size(hf_config) == WEIGHT_BLOCK else None


def _check_scale_shape(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], name: str) -> None:
    n, k = weight.shape
    bn, bk = block
    want = (-(-n // bn), -(-k // bk))
    if tuple(scale_inv.shape) != want:
        raise CheckpointError(f"{name}{SCALE_SUFFIX[len('.weight'):]} has shape {tuple(scale_inv.shape)}; a "
                              f"{n}x{k} weight in {bn}x{bk} blocks needs {want}: is weight_block_size right?")


def dequantize_block_fp8(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                         dtype: torch.dtype, name: str = "weight") -> torch.Tensor:
    """weight [N, K] float8 with scale_inv [ceil(N/bn), ceil(K/bk)] -> dequantised [N, K] in dtype."""
    _check_scale_shape(weight, scale_inv, block, name)
    return dequantize_blocks(weight, scale_inv, block, dtype)


def dequantize_checkpoint(weights: Iterable[tuple[str, torch.Tensor]], block: tuple[int, int] | None,
                          dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass tensors through, replacing each (FP8 weight, weight_scale_inv) pair by the dequantised weight."""
    for name, tensor, scale in pair_fp8_weights(weights, block):
        yield name, tensor if scale is None else dequantize_block_fp8(tensor, scale, _need_block(block, name),
                                                                      dtype, name)


def pair_fp8_weights(weights: Iterable[tuple[str, torch.Tensor]], block: tuple[int, int] | None
                     ) -> Iterator[tuple[str, torch.Tensor, torch.Tensor | None]]:
    """(name, tensor, its weight_scale_inv or None): each FP8 weight with its scale, the rest as they are.

    A weight and its scale may arrive in either order (shards are read in file order), so whichever
    comes first waits for its partner. Unpaired FP8 weights or scales are checkpoint errors.
    """
    pending_weights: dict[str, torch.Tensor] = {}
    pending_scales: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if name.endswith(SCALE_SUFFIX):
            base = name[: -len(SCALE_SUFFIX)] + ".weight"
            if base in pending_weights:
                weight = pending_weights.pop(base)
                _check_scale_shape(weight, tensor, _need_block(block, base), base)
                yield base, weight, tensor
            else:
                pending_scales[base] = tensor
        elif tensor.dtype in FP8_DTYPES:
            if name in pending_scales:
                scale = pending_scales.pop(name)
                _check_scale_shape(tensor, scale, _need_block(block, name), name)
                yield name, tensor, scale
            else:
                pending_weights[name] = tensor
        else:
            yield name, tensor, None
    if pending_weights:
        names = sorted(pending_weights)
        raise CheckpointError(f"FP8 tensor(s) {names[:3]} have no {SCALE_SUFFIX[1:]} scale in the checkpoint; "
                              "only block-scaled FP8 checkpoints are supported")
    if pending_scales:
        names = sorted(pending_scales)
        raise CheckpointError(f"checkpoint has scales for {names[:3]} but those weights are not float8_e4m3fn")


def _need_block(block: tuple[int, int] | None, name: str) -> tuple[int, int]:
    if block is None:
        raise CheckpointError(f"checkpoint holds FP8 tensor {name!r} but config.json has no quantization_config "
                              "announcing block-scaled FP8 weights (quant_method 'fp8', weight_block_size)")
    return block



Index = slice | tuple[int | slice, ...] | None


def _split_index(index: Index, name: str) -> tuple[tuple[int, ...], slice | None]:
    """(leading integer indices, row range) of a weight index: None or () for a whole weight, a
    row range of a fused projection, (expert,) or (expert, rows) of a stacked expert weight."""
    if index is None or index == ():
        return (), None
    if isinstance(index, slice):
        return (), index
    lead = tuple(i for i in index if isinstance(i, int))
    rest = [i for i in index if not isinstance(i, int)]
    if len(lead) + len(rest) != len(index) or len(rest) > 1 or index[: len(lead)] != lead:
        raise CheckpointError(f"checkpoint tensor {name!r} maps to {index!r} of an FP8 weight; only whole "
                              "weights, row ranges of a fused projection and experts' rows can be")
    return lead, rest[0] if rest else None  # type: ignore[return-value]


def scale_name(weight_name: str) -> str:
    """`X.weight` -> `X.weight_scale_inv` (the checkpoints' name); a stacked expert weight `w_down`
    -> `w_down_scale_inv`."""
    if weight_name.endswith(".weight"):
        return weight_name.removesuffix(".weight") + SCALE_SUFFIX
    return weight_name + "_scale_inv"


class WeightLoader:
    """Copies checkpoint weights into a model's parameters (module docstring).

    params: the model's named parameters; block: the checkpoint's FP8 block, or None; dtype: the
    engine's float dtype. A target is an FP8 weight when its scale (`scale_name`) is a parameter
    too. A stacked expert weight [E, N, K] is handled as E weights [N, K].
    """

    def __init__(self, params: Mapping[str, torch.Tensor], block: tuple[int, int] | None, dtype: torch.dtype) -> None:
        self.params = params
        self.block = block
        self.dtype = dtype
        # (target, leading indices) -> that [N, K] weight assembled in float32
        self.staging: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}

    def is_fp8(self, target: str) -> bool:
        return scale_name(target) in self.params and self.params[target].dtype in FP8_DTYPES

    def load(self, target: str, tensor: torch.Tensor, scale: torch.Tensor | None, name: str,
             index: Index = None) -> list[tuple[str, Index]]:
        """Copy one checkpoint tensor (with its scale if FP8) into params[target] at `index`; returns
        the (parameter, index) pairs this fills (an FP8 weight fills its scale rows too)."""
        from shardinfer.engine.models.layers import copy_param

        if not self.is_fp8(target):
            value = tensor if scale is None else dequantize_block_fp8(tensor, scale, _need_block(self.block, name),
                                                                      self.dtype, name)
            copy_param(self.params[target], value, name, index)
            return [(target, index)]
        lead, rows = _split_index(index, name)
        param, scale_param = self.params[target].data[lead], self.params[scale_name(target)].data[lead]
        n = param.shape[0]
        start, stop, _ = (0, n, 1) if rows is None else rows.indices(n)
        scale_rows = slice(start // GROUP, -(-stop // GROUP))
        filled: list[tuple[str, Index]] = [(target, (*lead, rows) if rows is not None else lead),
                                           (scale_name(target), (*lead, scale_rows))]
        aligned = start % GROUP == 0 and (stop % GROUP == 0 or stop == n)
        key = (target, lead)
        if scale is not None and self.block == WEIGHT_BLOCK and aligned and key not in self.staging:
            copy_param(param, tensor, name, rows)
            copy_param(scale_param, scale, scale_name(name), scale_rows)
            return filled
        value = tensor if scale is None else dequantize_block_fp8(tensor, scale, _need_block(self.block, name),
                                                                  torch.float32, name)
        staged = self.staging.get(key)
        if staged is None:
            # The pieces copied so far, in float; rows not loaded yet are garbage until their piece comes.
            staged = dequantize_blocks(param, scale_param)
            self.staging[key] = staged
        copy_param(staged, value.float(), name, rows)
        return filled

    def finish(self) -> None:
        """Quantise the weights that were assembled in float."""
        for (target, lead), staged in self.staging.items():
            q, s = quantize_blocks(staged)
            self.params[target].data[lead].copy_(q)
            self.params[scale_name(target)].data[lead].copy_(s)
        self.staging.clear()


def quantize_linears(model: torch.nn.Module) -> int:
    """Quantise every quantizable float Linear (and stacked expert weights) of a loaded model to FP8
    where its weights live; returns how many modules were quantised."""
    from shardinfer.engine.models.layers import Linear

    count = 0
    for module in model.modules():
        quantize = getattr(module, "quantize_fp8", None)
        if quantize is not None and (not isinstance(module, Linear) or module.quantizable):
            count += bool(quantize())
    return count
