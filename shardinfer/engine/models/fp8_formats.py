"""The FP8 checkpoint formats the engine reads, recognised from config.json's `quantization_config`.

Every accepted format stores a quantised linear weight `X.weight` as float8_e4m3fn [N, K] with
float32 (or bfloat16) scales that multiply it, in one of two layouts (kernels/reference_fp8.py):

    block    `X.weight_scale_inv` [ceil(N/bn), ceil(K/bk)]    quant_method "fp8" + weight_block_size
             (DeepSeek-V3, Qwen3); or `X.weight_scale` of compressed-tensors' strategy "block"
    channel  `X.weight_scale` [N, 1] or [N], one per output     quant_method "fbgemm_fp8"; compressed-
             channel; a per-tensor scale ([] or [1]) is the     tensors' strategy "channel" or "tensor";
             same layout with one value broadcast to every row  quant_method "fp8" without a block size

Activations: the engine always quantises them itself, per token and 128 channels with
power-of-two scales (kernels/fp8_quant.py), whatever the checkpoint's activation scheme says.
So static activation scales (`X.input_scale`), static KV-cache scales (`k_scale`, `v_scale`) and
fbgemm's `activation_scale_ub` are ignored; each load logs what it ignored (`Fp8Format.notes`).
Anything else the engine could not serve exactly (integer weights, per-group weight scales,
asymmetric scales, packed or sparse compressed-tensors formats, quantised outputs) is refused here
with a ModelLoadError naming the config value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardinfer.errors import ModelLoadError

BLOCK_SUFFIX = ".weight_scale_inv"
CHANNEL_SUFFIX = ".weight_scale"
# Checkpoint tensors carrying static activation / KV-cache scales, which the engine does not use.
IGNORED_SUFFIXES = (".input_scale", ".input_scale_ub", ".k_scale", ".v_scale")
# compressed-tensors storage formats whose FP8 weights are plain float8_e4m3fn tensors.
CT_PLAIN_FORMATS = ("float-quantized", "naive-quantized")
_STATIC_INPUT = "static activation scales (input_scale) are ignored: activations are quantised dynamically"
_FIX = "use a block-scaled or per-channel FP8 checkpoint, or an unquantised one"


@dataclass(frozen=True)
class Fp8Format:
    """How an FP8 checkpoint stores its weights.

    method: quant_method (for messages); scales: "block" or "channel" (module docstring); block:
    the (rows, cols) weight block of block scales, None for channel scales; scale_suffix: the scale
    tensor's name after the module path; notes: what a load of it ignores, for the log.
    """

    method: str
    scales: str
    block: tuple[int, int] | None
    scale_suffix: str
    notes: tuple[str, ...] = ()


def fp8_format(hf_config: dict[str, Any]) -> Fp8Format | None:
    """The checkpoint's FP8 format, None for an unquantised checkpoint; ModelLoadError for a
    quantisation the engine does not serve exactly."""
    qc = hf_config.get("quantization_config")
    if not qc:
        return None
    method = qc.get("quant_method")
    if method == "fp8":
        return _deepseek_style(qc)
    if method == "fbgemm_fp8":
        notes = (
            (
                "activation_scale_ub is ignored: activations are quantised per token and 128 channels "
                "without an upper bound",
            )
            if qc.get("activation_scale_ub") is not None
            else ()
        )
        return Fp8Format("fbgemm_fp8", "channel", None, CHANNEL_SUFFIX, notes)
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    raise ModelLoadError(
        f"quantization_config.quant_method={method!r} is not supported; supported: 'fp8' "
        "(block-scaled or per-tensor float8_e4m3fn weights), 'fbgemm_fp8' (per-channel), "
        "'compressed-tensors' (FP8 weights with channel, tensor or 128x128 block scales), or "
        "an unquantised checkpoint"
    )


def _deepseek_style(qc: dict[str, Any]) -> Fp8Format:
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ModelLoadError(f"quantization_config.fmt={fmt!r} is not supported; supported: 'e4m3'")
    notes = (_STATIC_INPUT,) if qc.get("activation_scheme") == "static" else ()
    block = qc.get("weight_block_size")
    if block is None:  # one scale per weight tensor (the older per-tensor exports)
        return Fp8Format("fp8", "channel", None, CHANNEL_SUFFIX, notes)
    if not (isinstance(block, list | tuple) and len(block) == 2 and all(int(b) > 0 for b in block)):
        raise ModelLoadError(
            f"quantization_config.weight_block_size={block!r} must be two positive ints, "
            "e.g. [128, 128], or absent (per-tensor scales)"
        )
    return Fp8Format("fp8", "block", (int(block[0]), int(block[1])), BLOCK_SUFFIX, notes)


def _compressed_tensors(qc: dict[str, Any]) -> Fp8Format:
    groups = qc.get("config_groups") or {}
    # "mixed-precision" defers the storage format to each group.
    storages = (
        {f"config_groups.{n}.format": g.get("format") for n, g in groups.items()}
        if qc.get("format") == "mixed-precision"
        else {"format": qc.get("format")}
    )
    for key, storage in storages.items():
        if storage not in CT_PLAIN_FORMATS:
            raise ModelLoadError(
                f"quantization_config.{key}={storage!r} is not supported for compressed-tensors "
                f"checkpoints; supported: {', '.join(CT_PLAIN_FORMATS)} (FP8 weights stored as "
                f"float8_e4m3fn); {_FIX}"
            )
    for key in ("sparsity_config", "transform_config"):
        value = qc.get(key)
        dense = (
            key == "sparsity_config" and isinstance(value, dict) and value.get("format") in (None, "dense")
        )
        if value and not dense:
            raise ModelLoadError(
                f"quantization_config.{key} is set ({value!r}); the engine reads only dense, "
                f"untransformed FP8 weights: {_FIX}"
            )
    if not groups:
        raise ModelLoadError(
            "quantization_config.config_groups is empty: a compressed-tensors checkpoint must "
            "say how its weights are quantised"
        )
    layouts = {_ct_weight_layout(name, group) for name, group in groups.items()}
    if len(layouts) > 1:
        raise ModelLoadError(
            f"quantization_config.config_groups mix weight layouts {sorted(map(str, layouts))}; "
            "the engine needs one layout (all per-channel/per-tensor, or all 128x128 blocks)"
        )
    block = layouts.pop()
    notes = [_ct_activation_note(name, group) for name, group in groups.items()]
    if qc.get("kv_cache_scheme"):
        notes.append(
            "kv_cache_scheme's static KV-cache scales are ignored: the engine's KV cache follows "
            "engine.kv_cache_dtype"
        )
    scales = "channel" if block is None else "block"
    return Fp8Format(
        "compressed-tensors", scales, block, CHANNEL_SUFFIX, tuple(sorted({n for n in notes if n}))
    )


def _ct_weight_layout(name: str, group: dict[str, Any]) -> tuple[int, int] | None:
    """A compressed-tensors group's weight block (None: per channel or per tensor)."""
    w = group.get("weights") or {}
    where = f"quantization_config.config_groups.{name}.weights"
    if w.get("type") != "float" or int(w.get("num_bits") or 0) != 8:
        raise ModelLoadError(
            f"{where} has type={w.get('type')!r}, num_bits={w.get('num_bits')!r}; only FP8 "
            f"weights (type 'float', num_bits 8) are supported (not int8 or int4): {_FIX}"
        )
    if w.get("symmetric") is False or w.get("dynamic"):
        raise ModelLoadError(
            f"{where} has symmetric={w.get('symmetric')!r}, dynamic={w.get('dynamic')!r}; "
            f"only static symmetric weight scales are supported: {_FIX}"
        )
    strategy = w.get("strategy")
    if strategy in ("channel", "tensor"):
        return None
    if strategy == "block" and list(w.get("block_structure") or []) == [128, 128]:
        return (128, 128)
    raise ModelLoadError(
        f"{where}.strategy={strategy!r} (block_structure={w.get('block_structure')!r}, "
        f"group_size={w.get('group_size')!r}) is not supported; supported: 'channel', "
        f"'tensor', or 'block' with block_structure [128, 128] (per-group weight scales are "
        f"not): {_FIX}"
    )


def _ct_activation_note(name: str, group: dict[str, Any]) -> str:
    if group.get("output_activations"):
        raise ModelLoadError(
            f"quantization_config.config_groups.{name}.output_activations is set; quantised "
            f"outputs are not supported: {_FIX}"
        )
    act = group.get("input_activations")
    if not act:
        return (
            "the checkpoint leaves activations unquantised (weight-only FP8); the engine's FP8 GEMM "
            "quantises them per token and 128 channels (quantization='none' dequantises the weights instead)"
        )
    if act.get("type") != "float" or int(act.get("num_bits") or 0) != 8:
        raise ModelLoadError(
            f"quantization_config.config_groups.{name}.input_activations has "
            f"type={act.get('type')!r}, num_bits={act.get('num_bits')!r}; only FP8 "
            f"activations are supported: {_FIX}"
        )
    return "" if act.get("dynamic") else _STATIC_INPUT
