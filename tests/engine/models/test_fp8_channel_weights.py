"""FP8 checkpoints with per-output-channel (and per-tensor) weight scales: loaded into FP8 as they
are, fused and stacked pieces concatenated with their scales, the engine's logits against
transformers on the dequantised checkpoint, and clear refusals of what cannot be served exactly.

Each checkpoint is built here from a transformers random-init model: every projection quantised
per row in float64 (scale = row amax / 448 rounded to float32, values rounded to the nearest e4m3
by kernel_checks.e4m3_round), saved with a compressed-tensors or fbgemm_fp8 quantization_config,
beside a float twin holding exactly fp8 value x scale (computed in float64). Nothing here comes
from the code under test.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from shardinfer import LLM, SamplingParams
from shardinfer.engine.models.base import Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.fp8_formats import fp8_format
from shardinfer.engine.models.layers import Linear
from shardinfer.engine.models.registry import load_model
from shardinfer.errors import CheckpointError, ModelLoadError
from tests.engine.engine_helpers import batch_logits
from tests.engine.hf_reference import hf_logits, hf_model
from tests.engine.models.deepseek_helpers import PagedRunner, deepseek_checkpoint, generate_batch
from tests.kernels.kernel_checks import e4m3_round

FP8 = torch.float8_e4m3fn
NOT_QUANTISED = ("embed_tokens.weight", "lm_head.weight", "mlp.gate.weight")
# compressed-tensors as its FP8 "dynamic" exports write it: per-channel weights, per-token activations.
CT_CHANNEL: dict[str, Any] = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "quantization_status": "compressed",
    "ignore": ["lm_head"],
    "kv_cache_scheme": None,
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 8,
                "type": "float",
                "strategy": "channel",
                "symmetric": True,
                "dynamic": False,
                "group_size": None,
                "block_structure": None,
            },
            "input_activations": {
                "num_bits": 8,
                "type": "float",
                "strategy": "token",
                "symmetric": True,
                "dynamic": True,
            },
            "output_activations": None,
        }
    },
}
FBGEMM = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": ["lm_head"]}


def quantize_rows(w: torch.Tensor, per_tensor: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., N, K] -> (fp8, float32 scales [..., N, 1], or [] per tensor), in float64."""
    w64 = w.double()
    amax = w64.abs().amax() if per_tensor else w64.abs().amax(-1, keepdim=True)
    scale = (amax / 448.0).float()
    return e4m3_round(w64 / scale.double()).to(FP8), scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (q.double() * scale.double()).float()


def write_channel_pair(
    src: Path,
    root: Path,
    qc: dict[str, Any],
    static_input_scales: bool = False,
    per_tensor: tuple[str, ...] = (),
) -> tuple[Path, Path, dict[str, tuple[torch.Tensor, ...]]]:
    """(FP8 checkpoint, its float twin, {weight name: (fp8, scale)}). Weights whose name ends with
    one of `per_tensor` get one scale; every other scale is [N, 1] except the down projections',
    saved flat [N] (both occur in the wild); the v projections' scales are stored in bfloat16."""
    fp8_dir, float_dir = root / "fp8", root / "float"
    shutil.copytree(src, fp8_dir)
    shutil.copytree(src, float_dir)
    tensors = load_file(str(src / "model.safetensors"))
    out: dict[str, torch.Tensor] = {}
    twin: dict[str, torch.Tensor] = {}
    quantised: dict[str, tuple[torch.Tensor, ...]] = {}
    for name, t in tensors.items():
        if t.dim() >= 2 and not name.endswith(NOT_QUANTISED):
            if name.endswith("v_proj.weight"):  # rows of bf16 scales: quantise against the bf16 value
                q, s = quantize_rows(t)
                s = s.to(torch.bfloat16)
                q = e4m3_round(t.double() / s.double()).clamp(-448, 448).to(FP8)
            else:
                q, s = quantize_rows(t, per_tensor=name.endswith(per_tensor))
            twin[name] = dequantize_rows(q, s)
            if name.endswith("down_proj.weight"):
                s = s.flatten()
            out[name], out[name + "_scale"] = q, s
            quantised[name] = (q, s)
            if static_input_scales:
                out[name.removesuffix(".weight") + ".input_scale"] = torch.tensor([0.05])
        else:
            out[name] = twin[name] = t
    save_file(out, str(fp8_dir / "model.safetensors"))
    save_file(twin, str(float_dir / "model.safetensors"))
    cfg = json.loads((fp8_dir / "config.json").read_text())
    cfg["quantization_config"] = qc
    (fp8_dir / "config.json").write_text(json.dumps(cfg))
    return fp8_dir, float_dir, quantised


def linears(llm: LLM) -> dict[str, Linear]:
    return {n: m for n, m in llm.llm_engine.model.named_modules() if isinstance(m, Linear)}


def rows_and_scales(
    quantised: dict[str, tuple[torch.Tensor, ...]], layer: int, parts: list[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    pieces = [quantised[f"model.layers.{layer}.{p}.weight"] for p in parts]
    scales = [s.float().reshape(-1).expand(q.shape[0]) for q, s in pieces]
    return torch.cat([q for q, _ in pieces]), torch.cat(scales)


@pytest.fixture(scope="module")
def ct_pair(tiny_checkpoint: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """qwen3 (hidden 64: q, k and v join at rows that are not multiples of 128), compressed-tensors
    per-channel with static input scales, o_proj per tensor."""
    qc = json.loads(json.dumps(CT_CHANNEL))
    qc["config_groups"]["group_0"]["input_activations"].update(dynamic=False, strategy="tensor")
    return write_channel_pair(
        tiny_checkpoint("qwen3"),
        tmp_path_factory.mktemp("ct"),
        qc,
        static_input_scales=True,
        per_tensor=("o_proj.weight",),
    )


def test_channel_checkpoint_keeps_its_rows_and_scales(ct_pair, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    fp8_dir, _, quantised = ct_pair
    with caplog.at_level(logging.INFO, logger="shardinfer.engine.models.fp8"):
        llm = LLM(fp8_dir, device="cpu", dtype="float32")
    assert "input_scale" in caplog.text  # the ignored static activation scales are named in the log
    mods = linears(llm)
    for layer in (0, 1):
        qkv = mods[f"layers.{layer}.self_attn.qkv_proj"]
        want_q, want_s = rows_and_scales(
            quantised, layer, ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]
        )
        assert qkv.weight.dtype == FP8 and qkv.weight_scale_inv is None and qkv.weight_scale is not None
        assert torch.equal(qkv.weight.view(torch.uint8), want_q.view(torch.uint8))
        assert torch.equal(qkv.weight_scale, want_s)
        gate_up = mods[f"layers.{layer}.mlp.gate_up_proj"]
        want_q, want_s = rows_and_scales(quantised, layer, ["mlp.gate_proj", "mlp.up_proj"])
        assert torch.equal(gate_up.weight.view(torch.uint8), want_q.view(torch.uint8))
        assert gate_up.weight_scale is not None and torch.equal(gate_up.weight_scale, want_s)
        o = mods[f"layers.{layer}.self_attn.o_proj"]  # per tensor: one scale on every row
        q, s = quantised[f"model.layers.{layer}.self_attn.o_proj.weight"]
        assert o.weight_scale is not None and torch.equal(o.weight_scale, s.expand(q.shape[0]))
        down = mods[f"layers.{layer}.mlp.down_proj"]  # saved flat [N]
        q, s = quantised[f"model.layers.{layer}.mlp.down_proj.weight"]
        assert down.weight_scale is not None and torch.equal(down.weight_scale, s)
    assert mods["lm_head"].weight.dtype == torch.float32 and mods["lm_head"].weight_scale is None


def test_channel_checkpoint_logits_follow_transformers_on_the_dequantised_twin(ct_pair) -> None:  # type: ignore[no-untyped-def]
    fp8_dir, float_dir, _ = ct_pair
    fp8 = LLM(fp8_dir, device="cpu", dtype="float32", max_num_batched_tokens=512)
    dequantised = LLM(fp8_dir, device="cpu", dtype="float32", quantization="none", max_num_batched_tokens=512)
    hf = hf_model(float_dir)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (5, 17, 40)]
    got_fp8 = batch_logits(fp8.llm_engine, prompts)
    got_dequantised = batch_logits(dequantised.llm_engine, prompts)
    for prompt, a, b in zip(prompts, got_fp8, got_dequantised, strict=True):
        want = hf_logits(hf, prompt)
        # Dequantised at load: the float twin's weights exactly, so transformers' logits.
        assert (b - want).abs().max().item() <= 1e-4
        # Kept in FP8: only the activations' FP8 rounding differs (each input about 2^-4 relative at worst).
        diff = (torch.log_softmax(a, -1) - torch.log_softmax(want, -1)).abs()
        assert 0 < diff.max().item() < 0.25
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=8, ignore_eos=True, logprobs=1)
    alone = fp8.generate([prompts[1]], params)[0].outputs[0]
    among = fp8.generate(prompts, params)[1].outputs[0]
    assert (alone.token_ids, alone.logprobs) == (among.token_ids, among.logprobs)


def test_fbgemm_checkpoint_loads_per_channel_and_matches_transformers(
    tiny_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    fp8_dir, float_dir, quantised = write_channel_pair(tiny_checkpoint("llama"), tmp_path, FBGEMM)
    llm = LLM(fp8_dir, device="cpu", dtype="float32")
    gate_up = linears(llm)["layers.1.mlp.gate_up_proj"]
    want_q, want_s = rows_and_scales(quantised, 1, ["mlp.gate_proj", "mlp.up_proj"])
    assert gate_up.weight_scale is not None and torch.equal(gate_up.weight_scale, want_s)
    assert torch.equal(gate_up.weight.view(torch.uint8), want_q.view(torch.uint8))
    prompt = [4, 8, 15, 16, 23, 42, 7, 9]
    got = batch_logits(llm.llm_engine, [prompt])[0]
    want = hf_logits(hf_model(float_dir), prompt)
    assert 0 < (torch.log_softmax(got, -1) - torch.log_softmax(want, -1)).abs().max().item() < 0.25


def test_deepseek_channel_checkpoint_stacks_expert_scales(tmp_path: Path) -> None:
    fp8_dir, float_dir, quantised = write_channel_pair(
        deepseek_checkpoint("group_limited"), tmp_path, CT_CHANNEL
    )
    config = ModelConfig.from_dir(fp8_dir)
    model = load_model(fp8_dir, config, Numerics(torch.float32, True, "fp8"), 256, torch.device("cpu"))
    params = dict(model.named_parameters())
    q, s = quantised["model.layers.2.mlp.experts.3.down_proj.weight"]
    assert params["model.layers.2.mlp.experts.w_down"].dtype == FP8
    assert torch.equal(params["model.layers.2.mlp.experts.w_down"][3].view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(params["model.layers.2.mlp.experts.w_down_scale"][3], s)
    gate_up = [quantised[f"model.layers.2.mlp.experts.3.{p}.weight"] for p in ("gate_proj", "up_proj")]
    assert torch.equal(
        params["model.layers.2.mlp.experts.w_gate_up_scale"][3], torch.cat([s.flatten() for _, s in gate_up])
    )
    assert "model.layers.2.mlp.experts.w_down_scale_inv" not in params
    kv_b = {n: m for n, m in model.named_modules() if isinstance(m, Linear)}[
        "model.layers.1.self_attn.kv_b_proj"
    ]
    q, s = quantised["model.layers.1.self_attn.kv_b_proj.weight"]
    assert kv_b.weight_scale is None and torch.equal(kv_b.weight, dequantize_rows(q, s))  # absorbed in float
    hf = hf_model(float_dir)
    prompts = [[4, 8, 15, 16, 23, 42], [1, 2, 3]]
    _, logits = generate_batch(PagedRunner(model), prompts, 1)
    for prompt, got in zip(prompts, logits, strict=True):
        diff = (torch.log_softmax(got, -1) - torch.log_softmax(hf_logits(hf, prompt), -1)).abs()
        assert 0 < diff.max().item() < 0.25


def _ct(weights: dict[str, Any] | None = None, group_format: str | None = None, **top: Any) -> dict[str, Any]:
    qc = json.loads(json.dumps(CT_CHANNEL))
    qc["config_groups"]["group_0"]["weights"].update(weights or {})
    if group_format is not None:
        qc["config_groups"]["group_0"]["format"] = group_format
    qc.update(top)
    return {"quantization_config": qc}


@pytest.mark.parametrize(
    "config,needle",
    [
        (_ct({"type": "int"}), "type='int'"),
        (_ct({"num_bits": 4}), "num_bits=4"),
        (_ct({"strategy": "group", "group_size": 128}), "strategy='group'"),
        (_ct({"strategy": "block", "block_structure": [64, 64]}), r"block_structure=\[64, 64\]"),
        (_ct({"symmetric": False}), "symmetric=False"),
        (_ct(format="pack-quantized"), "format='pack-quantized'"),
        (_ct(group_format="int-quantized", format="mixed-precision"), "group_0.format='int-quantized'"),
        (_ct(sparsity_config={"format": "sparse-24-bitmask"}), "sparsity_config"),
        ({"quantization_config": {"quant_method": "awq", "bits": 4}}, "quant_method='awq'"),
    ],
)
def test_unservable_quantization_configs_are_refused_naming_the_value(
    config: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ModelLoadError, match=needle):
        fp8_format(config)


def test_channel_layouts_are_recognised() -> None:
    for config in (
        _ct(),
        _ct({"strategy": "tensor"}),
        _ct(group_format="float-quantized", format="mixed-precision"),
        {"quantization_config": FBGEMM},
        {"quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}},
    ):
        fmt = fp8_format(config)
        assert fmt is not None and (fmt.scales, fmt.scale_suffix) == ("channel", ".weight_scale")
    fmt = fp8_format(_ct({"strategy": "block", "block_structure": [128, 128]}))
    assert fmt is not None and (fmt.scales, fmt.block) == ("block", (128, 128))


def test_loading_refuses_an_int8_checkpoint_and_per_group_scales(
    tiny_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    fp8_dir, _, _ = write_channel_pair(tiny_checkpoint("qwen3"), tmp_path / "a", CT_CHANNEL)
    cfg = json.loads((fp8_dir / "config.json").read_text())
    cfg["quantization_config"] = _ct({"type": "int"})["quantization_config"]
    (fp8_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="type='int'"):
        LLM(fp8_dir, device="cpu", dtype="float32")
    # Scales per group of 32 input channels under a per-channel announcement: refused, never misread.
    grouped_dir, _, _ = write_channel_pair(tiny_checkpoint("qwen3"), tmp_path / "b", CT_CHANNEL)
    tensors = load_file(str(grouped_dir / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    tensors[name + "_scale"] = torch.ones(tensors[name].shape[0], tensors[name].shape[1] // 32)
    save_file(tensors, str(grouped_dir / "model.safetensors"))
    with pytest.raises(CheckpointError, match="per-group weight scales are not supported"):
        LLM(grouped_dir, device="cpu", dtype="float32")
