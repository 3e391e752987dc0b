"""FP8 linears take their input quantised by the kernel that makes it: the logits are the bits of
the unfused model, in which every FP8 linear quantises its own float input.

- dense family: the norms for qkv_proj and gate_up_proj, silu_and_mul for down_proj;
- DeepSeek: the input norm for MLA's query and kv_a projections (one quantisation for both), the
  query LoRA's norm for q_b_proj, the post-attention norm for the first, dense layers' MLP, and
  silu_and_mul for every SwiGLU down projection (the shared experts' too). The MoE layer's input
  stays float: the router reads it in float32.

Fusion off = Linear.takes_fp8_input answering False, which every fused site asks. The CPU
reference path and the Triton kernels (the interpreter on the CPU, compiled on a GPU) are both
run; the kernels' own bit identity is tests/kernels/test_kernel_fp8_fused_quant.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from shardinfer import LLM, SamplingParams
from shardinfer.engine.models.layers import Linear
from shardinfer.kernels import ops
from tests.engine.engine_helpers import batch_logits

# Widths with 128-channel tails: qkv_proj and gate_up_proj read K = 192 (one group and 64), down_proj
# K = 320 (two and 64).
TAILS = dict(
    hidden_size=192, intermediate_size=320, num_attention_heads=4, num_key_value_heads=2, head_dim=32
)
FAMILIES = [("qwen3", TAILS), ("qwen2", {})]  # qwen2: qkv biases, hidden 64 (a row shorter than a group)
# The tiny DeepSeek: 3 layers, the first dense, two MoE layers with one shared expert each; hidden 64
# (shorter than a group). Without a query LoRA and with one (rank 48; the rope and latent widths
# the MLA kernel takes).
FAMILIES += [
    ("deepseek_v3", {}),
    ("deepseek_v3", {"q_lora_rank": 48, "qk_rope_head_dim": 16, "kv_lora_rank": 64}),
]
IDS = ["qwen3", "qwen2", "deepseek", "deepseek-q-lora"]
# One model a family for the slower runs (kernels in the interpreter, the GPU).
KERNEL_FAMILIES = [FAMILIES[0], FAMILIES[3]]
# In the interpreter the DeepSeek model keeps one dense and one MoE layer: every fused site is in
# one or the other (a second MoE layer repeats the first's sites, its input norm adding a MoE
# output where the first adds a dense MLP's, through the same fused op), and the interpreter's time
# goes mostly to the MoE layers' kernels.
INTERPRETED_FAMILIES = [FAMILIES[0], (FAMILIES[3][0], {**FAMILIES[3][1], "num_hidden_layers": 2})]


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    return [torch.randint(0, 300, (n,), generator=g).tolist() for n in (5, 1, 19)]


@pytest.fixture
def fused_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Counts of the fused ops' calls (they still run): the add-and-norm, the plain norm and the
    activation that quantise."""
    calls = {"norm": 0, "plain_norm": 0, "silu": 0}

    def counted(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            calls[key] += 1
            return fn(*args)

        return call

    monkeypatch.setattr(ops, "fused_add_rms_norm_fp8", counted("norm", ops.fused_add_rms_norm_fp8))
    monkeypatch.setattr(ops, "rms_norm_fp8", counted("plain_norm", ops.rms_norm_fp8))
    monkeypatch.setattr(ops, "silu_and_mul_fp8", counted("silu", ops.silu_and_mul_fp8))
    yield calls


def _expected_calls(llm: LLM) -> dict[str, int]:
    """One call of each fused op per site in a forward (module docstring)."""
    config = llm.llm_engine.model_config
    layers = config.num_hidden_layers
    if config.hf.get("kv_lora_rank") is None:  # dense: both norms and the activation, every layer
        return {"norm": 2 * layers, "plain_norm": 0, "silu": layers}
    dense_layers = int(config.hf["first_k_dense_replace"])
    shared = 1 if config.hf.get("n_shared_experts") else 0
    return {
        "norm": layers + dense_layers,
        "plain_norm": layers if config.hf.get("q_lora_rank") else 0,
        "silu": dense_layers + shared * (layers - dense_layers),
    }


def _assert_fusion_keeps_the_logits(
    llm: LLM, monkeypatch: pytest.MonkeyPatch, calls: dict[str, int], prompts: list[list[int]]
) -> None:
    """The prompts' logits with every fusion on (each fused op called once a site) equal those with
    every FP8 linear quantising its own input."""
    want = _expected_calls(llm)
    fused = batch_logits(llm.llm_engine, prompts)
    assert calls == want  # every FP8 linear's input came quantised
    with monkeypatch.context() as m:
        m.setattr(Linear, "takes_fp8_input", lambda self: False)
        unfused = batch_logits(llm.llm_engine, prompts)
    assert calls == want
    for a, b in zip(fused, unfused, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("family, overrides", FAMILIES, ids=IDS)
def test_fused_quantisation_gives_the_unfused_logits_on_the_reference_path(
    tiny_checkpoint: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    fused_calls: dict[str, int],
    family: str,
    overrides: dict[str, Any],
) -> None:
    llm = LLM(tiny_checkpoint(family, **overrides), device="cpu", dtype="bfloat16", quantization="fp8")
    _assert_fusion_keeps_the_logits(llm, monkeypatch, fused_calls, _prompts())


@pytest.mark.slow
@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="CPU tensors on the kernels need the interpreter; "
    "on a GPU test_gpu_fused_quantisation_gives_the_unfused_bits runs them compiled",
)
@pytest.mark.parametrize("family, overrides", INTERPRETED_FAMILIES, ids=["qwen3", "deepseek-q-lora"])
def test_fused_quantisation_gives_the_unfused_logits_through_the_kernels(
    tiny_checkpoint: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    fused_calls: dict[str, int],
    family: str,
    overrides: dict[str, Any],
) -> None:
    """Every op on its Triton kernel (ops' CUDA branch, run by the interpreter): the fused norm and
    activation kernels and the GEMM on their output, against the plain kernels, quantiser and GEMM."""
    llm = LLM(tiny_checkpoint(family, **overrides), device="cpu", dtype="bfloat16", quantization="fp8")
    monkeypatch.setattr(ops, "_use_triton", lambda t: True)
    _assert_fusion_keeps_the_logits(llm, monkeypatch, fused_calls, _prompts()[:2])


def test_float_models_are_not_fused(
    tiny_checkpoint: Callable[..., Path], fused_calls: dict[str, int]
) -> None:
    llm = LLM(tiny_checkpoint("qwen3", **TAILS), device="cpu", dtype="bfloat16")
    batch_logits(llm.llm_engine, _prompts())
    deepseek = LLM(tiny_checkpoint("deepseek_v3", q_lora_rank=48), device="cpu", dtype="bfloat16")
    batch_logits(deepseek.llm_engine, _prompts())
    assert fused_calls == {"norm": 0, "plain_norm": 0, "silu": 0}
    with pytest.raises(TypeError, match="not FP8"):
        llm.llm_engine.model.lm_head(
            ops.rms_norm_fp8(
                torch.ones(2, 192, dtype=torch.bfloat16), torch.ones(192, dtype=torch.bfloat16), 1e-6
            )
        )


@pytest.mark.gpu
@pytest.mark.parametrize("family, overrides", KERNEL_FAMILIES, ids=["qwen3", "deepseek-q-lora"])
@pytest.mark.parametrize("enforce_eager", [True, False])
def test_gpu_fused_quantisation_gives_the_unfused_bits(
    tiny_checkpoint: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    enforce_eager: bool,
    family: str,
    overrides: dict[str, Any],
) -> None:
    """Compiled kernels, and CUDA graphs captured with and without the fusion: the prompts' logits
    and every sampled token's logprob are the same bits."""
    model_dir = tiny_checkpoint(family, **overrides)
    prompts = _prompts()
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=16, ignore_eos=True, logprobs=1)

    def run() -> tuple[list[torch.Tensor], list[tuple[Any, ...]]]:
        llm = LLM(model_dir, device="cuda", dtype="bfloat16", quantization="fp8", enforce_eager=enforce_eager)
        logits = [t.cpu() for t in batch_logits(llm.llm_engine, prompts)]
        outs = llm.generate(prompts, params)
        return logits, [(tuple(o.outputs[0].token_ids), tuple(o.outputs[0].logprobs)) for o in outs]

    fused = run()
    with monkeypatch.context() as m:
        m.setattr(Linear, "takes_fp8_input", lambda self: False)
        unfused = run()
    for a, b in zip(fused[0], unfused[0], strict=True):
        assert torch.equal(a, b)
    assert fused[1] == unfused[1]
