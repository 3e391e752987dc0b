"""FP8 weights: checkpoints in FP8 (block-scaled or per-channel scaled), and quantising at load.

Which checkpoint formats are read, and what their config.json says, is fp8_formats.py's concern.
In the engine an FP8 weight is float8_e4m3fn [N, K] with float32 scales in one of two layouts
(kernels/reference_fp8.py): block scales `weight_scale_inv` [ceil(N/128), ceil(K/128)] (DeepSeek-V3
style: the name says "inverse" because the quantiser divided by it), or channel scales
`weight_scale` [N] (per-channel checkpoints' [N, 1]; a per-tensor scale broadcast to every row).
The real weight is `fp8 value * scale` either way. A stacked expert weight [E, N, K] has scales
[E, ...] of the same layouts.

What runs (`resolve_quantization`): the engine's `quantization` None follows the checkpoint (an
FP8 checkpoint in 128x128 blocks or per-channel stays FP8; any other FP8 block size is dequantised
to the engine's dtype, activations then never quantised); "fp8" keeps every quantizable Linear in
FP8 (a float checkpoint is quantised at load, on the device, by reference_fp8.quantize_blocks);
"none" dequantises FP8 checkpoints at load. The model is built in the checkpoint's scale layout
(`Numerics.fp8_scales`). Block-scaled FP8 Linears hold exactly the checkpoint's 128x128 blocks and
scales (`WeightLoader`), except where a fused projection joins pieces at rows that are not
multiples of 128 (tiny test models): such a Linear is assembled in float and quantised once
complete. Per-channel scales belong to rows, so fused pieces (q/k/v, gate/up, an expert's gate/up)
just concatenate, weights and scales alike. A piece the checkpoint keeps in float (its ignore
list) is quantised at load in the model's layout, and the load log says how many were.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from shardinfer.engine.models.fp8_formats import (
    BLOCK_SUFFIX,
    CHANNEL_SUFFIX,
    IGNORED_SUFFIXES,
    Fp8Format,
    fp8_format,
)
from shardinfer.errors import CheckpointError, ModelLoadError
from shardinfer.kernels.reference_fp8 import (
    GROUP,
    WEIGHT_BLOCK,
    dequantize_blocks,
    dequantize_channels,
    quantize_blocks,
    quantize_channels,
)

__all__ = [
    "Fp8Format",
    "WeightLoader",
    "check_fp8_device",
    "dequantize_block_fp8",
    "dequantize_checkpoint",
    "dequantize_fp8",
    "fp8_format",
    "pair_fp8_weights",
    "quantize_linears",
    "resolve_quantization",
    "runs_fp8",
]

logger = logging.getLogger(__name__)
FP8_DTYPES = (torch.float8_e4m3fn,)
QUANTIZATIONS = (None, "fp8", "none")
SCALE_SUFFIXES = (BLOCK_SUFFIX, CHANNEL_SUFFIX)


def runs_fp8(fmt: Fp8Format | None) -> bool:
    """Whether the engine keeps this checkpoint format in FP8 when `quantization` is unset."""
    return fmt is not None and (fmt.scales == "channel" or fmt.block == WEIGHT_BLOCK)


def resolve_quantization(requested: str | None, hf_config: dict[str, Any]) -> str | None:
    """The weight format the model runs: "fp8" or None (the engine's dtype); module docstring."""
    if requested not in QUANTIZATIONS:
        raise ValueError(
            f"quantization={requested!r} is not supported; use 'fp8' (FP8 weights), "
            "'none' (dequantise FP8 checkpoints) or leave it unset (follow the checkpoint)"
        )
    fmt = fp8_format(hf_config)  # refuses unsupported checkpoints whatever was requested
    if requested == "none":
        return None
    if requested == "fp8":
        return "fp8"
    return "fp8" if runs_fp8(fmt) else None


# e4m3 values need compute capability 8.9 or later on NVIDIA GPUs (Ada, Hopper, Blackwell): the
# conversions and FP8 tensor-core products are instructions from 8.9 on, and Triton refuses the
# type below it.
FP8_MIN_CAPABILITY = (8, 9)


def check_fp8_device(
    device: torch.device, requested: str | None, runs: str | None, kv_cache_dtype: str
) -> None:
    """Refuse, before anything loads, FP8 weights (`runs`, as resolve_quantization chose from
    `requested`) or an FP8 KV cache on a GPU that cannot compute with e4m3, naming the setting
    and what to set instead."""
    if device.type != "cuda" or (runs != "fp8" and kv_cache_dtype != "fp8"):
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) >= FP8_MIN_CAPABILITY:
        return
    fixes = []
    if runs == "fp8":
        why = (
            "this checkpoint's weights are FP8, which quantization unset keeps"
            if requested is None
            else "quantization='fp8'"
        )
        fixes.append(
            f"{why}: set quantization='none' (a job's model.quantization = \"none\") to run the weights "
            "in the engine's dtype (an FP8 checkpoint is dequantised at load)"
        )
    if kv_cache_dtype == "fp8":
        fixes.append(
            "kv_cache_dtype='fp8': use kv_cache_dtype='auto' (a job's engine.kv_cache_dtype = \"auto\"), "
            "a cache in the model's dtype"
        )
    raise ModelLoadError(
        f"{device.type}:{index} ({torch.cuda.get_device_name(index)}) has compute capability "
        f"{major}.{minor}, and FP8 needs 8.9 or later (Ada, Hopper, Blackwell). " + "; ".join(fixes)
    )


def _engine_scale(weight: torch.Tensor, scale: torch.Tensor, fmt: Fp8Format, name: str) -> torch.Tensor:
    """The checkpoint's scale of `weight` in the engine's layout (float32), shape-checked."""
    scale_label = name.removesuffix(".weight") + fmt.scale_suffix
    if fmt.block is not None:
        n, k = weight.shape
        bn, bk = fmt.block
        want = (-(-n // bn), -(-k // bk))
        if tuple(scale.shape) != want:
            raise CheckpointError(
                f"{scale_label} has shape {tuple(scale.shape)}; a {n}x{k} weight in {bn}x{bk} "
                f"blocks needs {want}: is weight_block_size (block_structure) right?"
            )
        return scale.float()
    rows = weight.shape[:-1]
    per_row = scale.dim() == len(rows) + 1 and scale.shape[-1] == 1 and tuple(scale.shape[:-1]) == tuple(rows)
    if per_row or tuple(scale.shape) == tuple(rows):
        return scale.float().reshape(rows)
    if scale.numel() == 1 and scale.dim() <= 1:  # per tensor: the same scale on every row
        return scale.float().reshape(()).expand(rows).contiguous()
    raise CheckpointError(
        f"{scale_label} has shape {tuple(scale.shape)}; a per-channel scale of a weight of shape "
        f"{tuple(weight.shape)} needs {(*rows, 1)}, {tuple(rows)} or one per-tensor value "
        "(per-group weight scales are not supported)"
    )


def dequantize_block_fp8(
    weight: torch.Tensor,
    scale_inv: torch.Tensor,
    block: tuple[int, int],
    dtype: torch.dtype,
    name: str = "weight",
) -> torch.Tensor:
    """weight [N, K] float8 with block scales [ceil(N/bn), ceil(K/bk)] -> dequantised [N, K] in dtype."""
    fmt = Fp8Format("fp8", "block", block, BLOCK_SUFFIX)
    return dequantize_fp8(weight, _engine_scale(weight, scale_inv, fmt, name), fmt, dtype)


def dequantize_fp8(
    weight: torch.Tensor, scale: torch.Tensor, fmt: Fp8Format, dtype: torch.dtype
) -> torch.Tensor:
    """An FP8 weight [N, K] with its scale in the engine's layout (`pair_fp8_weights`) -> [N, K] in dtype."""
    if fmt.block is not None:
        return dequantize_blocks(weight, scale, fmt.block, dtype)
    return dequantize_channels(weight, scale, dtype)


def dequantize_checkpoint(
    weights: Iterable[tuple[str, torch.Tensor]], fmt: Fp8Format | None, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass tensors through, replacing each (FP8 weight, scale) pair by the dequantised weight."""
    for name, tensor, scale in pair_fp8_weights(weights, fmt):
        yield name, tensor if scale is None else dequantize_fp8(tensor, scale, _need_format(fmt, name), dtype)


def pair_fp8_weights(
    weights: Iterable[tuple[str, torch.Tensor]], fmt: Fp8Format | None
) -> Iterator[tuple[str, torch.Tensor, torch.Tensor | None]]:
    """(name, tensor, its scale in the engine's layout, or None): each FP8 weight with its scale, the
    rest as they are; static activation / KV-cache scales are dropped (logged once).

    A weight and its scale may arrive in either order (shards are read in file order), so whichever
    comes first waits for its partner. Unpaired FP8 weights or scales are checkpoint errors.
    """
    suffixes = (fmt.scale_suffix,) if fmt is not None else SCALE_SUFFIXES
    pending_weights: dict[str, torch.Tensor] = {}
    pending_scales: dict[str, torch.Tensor] = {}
    ignored = 0
    for name, tensor in weights:
        suffix = next((s for s in suffixes if name.endswith(s)), None)
        if suffix is not None:
            base = name[: -len(suffix)] + ".weight"
            if base in pending_weights:
                weight = pending_weights.pop(base)
                yield base, weight, _engine_scale(weight, tensor, _need_format(fmt, base), base)
            else:
                pending_scales[base] = tensor
        elif fmt is not None and name.endswith(IGNORED_SUFFIXES):
            ignored += 1
        elif tensor.dtype in FP8_DTYPES:
            if name in pending_scales:
                yield (
                    name,
                    tensor,
                    _engine_scale(tensor, pending_scales.pop(name), _need_format(fmt, name), name),
                )
            else:
                pending_weights[name] = tensor
        else:
            yield name, tensor, None
    if pending_weights:
        names = sorted(pending_weights)
        raise CheckpointError(
            f"FP8 tensor(s) {names[:3]} have no {suffixes[0][1:]} scale in the checkpoint; "
            "every FP8 weight needs its scale tensor beside it"
        )
    if pending_scales:
        names = sorted(pending_scales)
        raise CheckpointError(
            f"checkpoint has scales for {names[:3]} but those weights are not float8_e4m3fn"
        )
    if fmt is not None:
        for note in fmt.notes:
            logger.info("FP8 checkpoint (%s): %s", fmt.method, note)
        if ignored:
            logger.info(
                "FP8 checkpoint (%s): %d static scale tensor(s) (input/KV scales) not used",
                fmt.method,
                ignored,
            )


def _need_format(fmt: Fp8Format | None, name: str) -> Fp8Format:
    if fmt is None:
        raise CheckpointError(
            f"checkpoint holds FP8 tensor {name!r} but config.json has no quantization_config "
            "announcing FP8 weights (e.g. quant_method 'fp8' with weight_block_size)"
        )
    return fmt


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
        raise CheckpointError(
            f"checkpoint tensor {name!r} maps to {index!r} of an FP8 weight; only whole "
            "weights, row ranges of a fused projection and experts' rows can be"
        )
    return lead, rest[0] if rest else None  # type: ignore[return-value]


def scale_names(weight_name: str) -> tuple[str, str]:
    """The (block, channel) scale parameter names of a weight: `X.weight` -> `X.weight_scale_inv`,
    `X.weight_scale`; a stacked expert weight `w_down` -> `w_down_scale_inv`, `w_down_scale`."""
    if weight_name.endswith(".weight"):
        base = weight_name.removesuffix(".weight")
        return base + BLOCK_SUFFIX, base + CHANNEL_SUFFIX
    return weight_name + "_scale_inv", weight_name + "_scale"


class WeightLoader:
    """Copies checkpoint weights into a model's parameters (module docstring).

    params: the model's named parameters; fmt: the checkpoint's FP8 format, or None; dtype: the
    engine's float dtype. A target is an FP8 weight when it is float8 and one of its scale names
    (`scale_names`) is a parameter too; which one says the layout. A stacked expert weight
    [E, N, K] is handled as E weights [N, K].
    """

    def __init__(self, params: Mapping[str, torch.Tensor], fmt: Fp8Format | None, dtype: torch.dtype) -> None:
        self.params = params
        self.fmt = fmt
        self.dtype = dtype
        # (target, leading indices) -> that [N, K] weight assembled in float32
        self.staging: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}
        self.float_pieces = 0  # float checkpoint tensors quantised per channel at load

    def scale_param(self, target: str) -> str | None:
        """The name of target's scale parameter, None if target is not an FP8 weight."""
        if target not in self.params or self.params[target].dtype not in FP8_DTYPES:
            return None
        return next((s for s in scale_names(target) if s in self.params), None)

    def is_fp8(self, target: str) -> bool:
        return self.scale_param(target) is not None

    def load(
        self, target: str, tensor: torch.Tensor, scale: torch.Tensor | None, name: str, index: Index = None
    ) -> list[tuple[str, Index]]:
        """Copy one checkpoint tensor (with its scale, from pair_fp8_weights, if FP8) into
        params[target] at `index`; returns the (parameter, index) pairs this fills (an FP8 weight
        fills its scale rows too)."""
        from shardinfer.engine.models.layers import copy_param

        scale_target = self.scale_param(target)
        if scale_target is None:
            value = (
                tensor
                if scale is None
                else dequantize_fp8(tensor, scale, _need_format(self.fmt, name), self.dtype)
            )
            copy_param(self.params[target], value, name, index)
            return [(target, index)]
        lead, rows = _split_index(index, name)
        param, scale_param = self.params[target].data[lead], self.params[scale_target].data[lead]
        if scale_target.endswith("_scale"):
            return self._load_channels(
                target, scale_target, param, scale_param, tensor, scale, name, lead, rows
            )
        n = param.shape[0]
        start, stop, _ = (0, n, 1) if rows is None else rows.indices(n)
        scale_rows = slice(start // GROUP, -(-stop // GROUP))
        filled: list[tuple[str, Index]] = [
            (target, (*lead, rows) if rows is not None else lead),
            (scale_target, (*lead, scale_rows)),
        ]
        aligned = start % GROUP == 0 and (stop % GROUP == 0 or stop == n)
        key = (target, lead)
        block = self.fmt.block if self.fmt is not None else None
        if scale is not None and block == WEIGHT_BLOCK and aligned and key not in self.staging:
            copy_param(param, tensor, name, rows)
            copy_param(scale_param, scale, scale_names(name)[0], scale_rows)
            return filled
        value = (
            tensor
            if scale is None
            else dequantize_fp8(tensor, scale, _need_format(self.fmt, name), torch.float32)
        )
        staged = self.staging.get(key)
        if staged is None:
            # The pieces copied so far, in float; rows not loaded yet are garbage until their piece comes.
            staged = dequantize_blocks(param, scale_param)
            self.staging[key] = staged
        copy_param(staged, value.float(), name, rows)
        return filled

    def _load_channels(
        self,
        target: str,
        scale_target: str,
        param: torch.Tensor,
        scale_param: torch.Tensor,
        tensor: torch.Tensor,
        scale: torch.Tensor | None,
        name: str,
        lead: tuple[int, ...],
        rows: slice | None,
    ) -> list[tuple[str, Index]]:
        """A per-channel FP8 weight's rows and their scales, copied as they are; a float piece is
        quantised per row first (rows are independent, so no staging)."""
        from shardinfer.engine.models.layers import copy_param

        if scale is None:
            q, s = quantize_channels(tensor.reshape(-1, tensor.shape[-1]))
            tensor, scale = q.view(tensor.shape), s.view(tensor.shape[:-1])
            self.float_pieces += 1
        elif tensor.dim() != scale.dim() + 1:
            raise CheckpointError(
                f"{name} comes with block scales but the model holds per-channel FP8 weights"
            )
        where: Index = (*lead, rows) if rows is not None else lead
        copy_param(param, tensor, name, rows)
        copy_param(scale_param, scale, scale_names(name)[1], rows)
        return [(target, where), (scale_target, where)]

    def finish(self) -> None:
        """Quantise the weights that were assembled in float."""
        for (target, lead), staged in self.staging.items():
            q, s = quantize_blocks(staged)
            self.params[target].data[lead].copy_(q)
            self.params[scale_names(target)[0]].data[lead].copy_(s)
        self.staging.clear()
        if self.float_pieces:
            logger.info(
                "FP8 checkpoint: %d weight(s) it keeps in float were quantised per channel at load",
                self.float_pieces,
            )
            self.float_pieces = 0


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
