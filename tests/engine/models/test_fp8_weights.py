"""FP8 weights kept in FP8: block-scaled checkpoints loaded without dequantising, float checkpoints
quantised at load, and the engine running them (CPU reference path: dequantise-then-matmul).

Expected values come from this file's own blockwise quantiser (float64 amax / 448, a plain loop)
and from transformers-style dequantisation (fp8 value x its block's scale, gathered by integer
division), never from the code under test.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from shardinfer import LLM, SamplingParams
from shardinfer.engine.models.base import Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.layers import Linear
from shardinfer.engine.models.registry import load_model
from tests.engine.engine_helpers import batch_logits
from tests.engine.models.deepseek_helpers import PagedRunner, deepseek_checkpoint, generate_batch

FP8 = torch.float8_e4m3fn
# Dims that are multiples of 128, so every fused projection joins whole 128-row blocks.
ALIGNED = dict(
    hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2, head_dim=64
)
# What the released FP8 checkpoints leave in float: embeddings, heads and the MoE router.
NOT_QUANTISED = ("embed_tokens.weight", "lm_head.weight", "mlp.gate.weight")


def quantize(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """scale = block amax / 448 (float32), q = fp8(w / scale), block by block."""
    n, k = w.shape
    scales = torch.empty(-(-n // block), -(-k // block))
    q = torch.empty(n, k, dtype=FP8)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            tile = w[i * block : (i + 1) * block, j * block : (j + 1) * block].float()
            s = torch.tensor(float(tile.abs().max()), dtype=torch.float32) / 448.0
            scales[i, j] = s
            q[i * block : (i + 1) * block, j * block : (j + 1) * block] = (tile / s).to(FP8)
    return q, scales


def dequantize(q: torch.Tensor, scales: torch.Tensor, block: int = 128) -> torch.Tensor:
    rows = torch.arange(q.shape[0]).unsqueeze(1) // block
    cols = torch.arange(q.shape[1]).unsqueeze(0) // block
    return (q.double() * scales.double()[rows, cols]).float()


def write_fp8_twin(src: Path, dst: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Copy a float checkpoint to dst with every 2-D projection weight in FP8 (128x128 blocks);
    returns {name: (q, scale)}."""
    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    out: dict[str, torch.Tensor] = {}
    quantised: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, t in tensors.items():
        if t.dim() == 2 and not name.endswith(NOT_QUANTISED):
            q, s = quantize(t)
            out[name], out[name + "_scale_inv"] = q, s
            quantised[name] = (q, s)
        else:
            out[name] = t
    save_file(out, str(dst / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    }
    (dst / "config.json").write_text(json.dumps(cfg))
    return quantised


def linears(llm: LLM) -> dict[str, Linear]:
    return {n: m for n, m in llm.llm_engine.model.named_modules() if isinstance(m, Linear)}


def fused(
    quantised: dict[str, tuple[torch.Tensor, torch.Tensor]], layer: int, parts: list[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    qs = [quantised[f"model.layers.{layer}.{p}.weight"] for p in parts]
    return torch.cat([q for q, _ in qs]), torch.cat([s for _, s in qs])


@pytest.fixture(scope="module")
def aligned_pair(
    tiny_checkpoint: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    src = tiny_checkpoint("qwen3", **ALIGNED)
    dst = tmp_path_factory.mktemp("fp8") / "qwen3-fp8"
    return src, dst, write_fp8_twin(src, dst)


def test_fp8_checkpoint_loads_its_own_blocks_without_dequantising(aligned_pair) -> None:  # type: ignore[no-untyped-def]
    _, fp8_dir, quantised = aligned_pair
    llm = LLM(fp8_dir, device="cpu", dtype="float32")
    mods = linears(llm)
    qkv = mods["layers.1.self_attn.qkv_proj"]
    want_q, want_s = fused(quantised, 1, ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"])
    assert qkv.weight.dtype == FP8 and qkv.weight_scale_inv is not None
    assert torch.equal(qkv.weight.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(qkv.weight_scale_inv, want_s)
    gate_up = mods["layers.0.mlp.gate_up_proj"]
    want_q, want_s = fused(quantised, 0, ["mlp.gate_proj", "mlp.up_proj"])
    assert torch.equal(gate_up.weight.view(torch.uint8), want_q.view(torch.uint8))
    assert gate_up.weight_scale_inv is not None and torch.equal(gate_up.weight_scale_inv, want_s)
    assert mods["lm_head"].weight.dtype == torch.float32 and mods["lm_head"].weight_scale_inv is None


def test_fp8_checkpoint_dequantised_equals_transformers_style_dequantisation(aligned_pair) -> None:  # type: ignore[no-untyped-def]
    _, fp8_dir, quantised = aligned_pair
    llm = LLM(fp8_dir, device="cpu", dtype="float32", quantization="none")
    down = linears(llm)["layers.1.mlp.down_proj"]
    q, s = quantised["model.layers.1.mlp.down_proj.weight"]
    assert down.weight_scale_inv is None
    assert torch.equal(down.weight, dequantize(q, s))


def test_quantising_a_float_checkpoint_at_load_is_blockwise_amax(
    tiny_checkpoint: Callable[..., Path],
) -> None:
    src = tiny_checkpoint("qwen3")  # hidden 64: fused projections that are not whole blocks
    tensors = load_file(str(src / "model.safetensors"))
    llm = LLM(src, device="cpu", dtype="float32", quantization="fp8")
    mods = linears(llm)
    want_q, want_s = quantize(
        torch.cat([tensors[f"model.layers.0.mlp.{p}.weight"] for p in ("gate_proj", "up_proj")])
    )
    gate_up = mods["layers.0.mlp.gate_up_proj"]
    assert torch.equal(gate_up.weight.view(torch.uint8), want_q.view(torch.uint8))
    assert gate_up.weight_scale_inv is not None and torch.equal(gate_up.weight_scale_inv, want_s)
    assert mods["lm_head"].weight_scale_inv is None


def test_fp8_checkpoint_with_unaligned_fused_rows_is_assembled_then_quantised(
    tiny_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    src = tiny_checkpoint("qwen3")  # hidden 64: q, k and v join at rows that are not multiples of 128
    quantised = write_fp8_twin(src, tmp_path / "fp8")
    llm = LLM(tmp_path / "fp8", device="cpu", dtype="float32")
    parts = [quantised[f"model.layers.0.self_attn.{p}.weight"] for p in ("q_proj", "k_proj", "v_proj")]
    want_q, want_s = quantize(torch.cat([dequantize(q, s) for q, s in parts]))
    qkv = linears(llm)["layers.0.self_attn.qkv_proj"]
    assert torch.equal(qkv.weight.view(torch.uint8), want_q.view(torch.uint8))
    assert qkv.weight_scale_inv is not None and torch.equal(qkv.weight_scale_inv, want_s)


def test_fp8_model_logits_stay_close_to_its_float_twin_and_rows_are_batch_invariant(aligned_pair) -> None:  # type: ignore[no-untyped-def]
    _, fp8_dir, _ = aligned_pair
    fp8 = LLM(fp8_dir, device="cpu", dtype="float32", max_num_batched_tokens=512)
    twin = LLM(fp8_dir, device="cpu", dtype="float32", quantization="none", max_num_batched_tokens=512)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (5, 17, 40)]
    for got, want in zip(
        batch_logits(fp8.llm_engine, prompts), batch_logits(twin.llm_engine, prompts), strict=True
    ):
        # Only the activations' FP8 rounding differs (each input about 2^-4 relative at worst).
        diff = (torch.log_softmax(got, -1) - torch.log_softmax(want, -1)).abs()
        assert 0 < diff.max().item() < 0.25
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=8, ignore_eos=True, logprobs=1)
    alone = fp8.generate([prompts[1]], params)[0].outputs[0]
    among = fp8.generate(prompts, params)[1].outputs[0]
    assert (alone.token_ids, alone.logprobs) == (among.token_ids, among.logprobs)


def test_deepseek_fp8_checkpoint_keeps_projections_in_fp8_and_kv_b_in_float(tmp_path: Path) -> None:
    src = deepseek_checkpoint("group_limited")
    quantised = write_fp8_twin(src, tmp_path / "fp8")
    config = ModelConfig.from_dir(tmp_path / "fp8")
    model = load_model(
        tmp_path / "fp8", config, Numerics(torch.float32, True, "fp8"), 256, torch.device("cpu")
    )
    twin = load_model(tmp_path / "fp8", config, Numerics(torch.float32, True, None), 256, torch.device("cpu"))
    mods = {n: m for n, m in model.named_modules() if isinstance(m, Linear)}
    kv_b = mods["model.layers.1.self_attn.kv_b_proj"]
    q, s = quantised["model.layers.1.self_attn.kv_b_proj.weight"]
    assert kv_b.weight_scale_inv is None and torch.equal(kv_b.weight, dequantize(q, s))
    o = mods["model.layers.2.self_attn.o_proj"]  # one whole piece: the checkpoint's blocks as they are
    q, s = quantised["model.layers.2.self_attn.o_proj.weight"]
    assert o.weight_scale_inv is not None and torch.equal(o.weight.view(torch.uint8), q.view(torch.uint8))
    shared = mods["model.layers.2.mlp.shared_experts.gate_up_proj"]  # fused at row 32: assembled, requantised
    parts = [quantised[f"model.layers.2.mlp.shared_experts.{p}.weight"] for p in ("gate_proj", "up_proj")]
    want_q, want_s = quantize(torch.cat([dequantize(q, s) for q, s in parts]))
    assert torch.equal(shared.weight.view(torch.uint8), want_q.view(torch.uint8))
    assert shared.weight_scale_inv is not None and torch.equal(shared.weight_scale_inv, want_s)
    experts = dict(model.named_parameters())
    q, s = quantised["model.layers.2.mlp.experts.3.down_proj.weight"]  # one whole piece per expert
    assert experts["model.layers.2.mlp.experts.w_down"].dtype == torch.float8_e4m3fn
    assert torch.equal(experts["model.layers.2.mlp.experts.w_down"][3].view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(experts["model.layers.2.mlp.experts.w_down_scale_inv"][3], s)
    parts = [quantised[f"model.layers.2.mlp.experts.3.{p}.weight"] for p in ("gate_proj", "up_proj")]
    want_q, want_s = quantize(
        torch.cat([dequantize(q, s) for q, s in parts])
    )  # rows 0-32 and 32-64: requantised
    got_q = experts["model.layers.2.mlp.experts.w_gate_up"][3]
    assert torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(experts["model.layers.2.mlp.experts.w_gate_up_scale_inv"][3], want_s)
    prompts = [[4, 8, 15, 16, 23, 42], [1, 2, 3]]
    _, got = generate_batch(PagedRunner(model), prompts, 1)
    _, want = generate_batch(PagedRunner(twin), prompts, 1)
    for a, b in zip(got, want, strict=True):  # the prompts' logits (greedy continuations may part)
        assert 0 < (torch.log_softmax(a, -1) - torch.log_softmax(b, -1)).abs().max().item() < 0.25


def test_deepseek_float_checkpoint_quantised_at_load_includes_the_experts() -> None:
    src = deepseek_checkpoint("group_limited")
    tensors = load_file(str(src / "model.safetensors"))
    llm = LLM(src, device="cpu", dtype="float32", quantization="fp8")
    params = dict(llm.llm_engine.model.named_parameters())
    want_q, want_s = quantize(tensors["model.layers.1.mlp.experts.5.down_proj.weight"])
    assert torch.equal(
        params["model.layers.1.mlp.experts.w_down"][5].view(torch.uint8), want_q.view(torch.uint8)
    )
    assert torch.equal(params["model.layers.1.mlp.experts.w_down_scale_inv"][5], want_s)
    assert params["model.layers.1.mlp.gate.weight"].dtype == torch.float32  # the router stays float
    out = llm.generate([[4, 8, 15]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 4
