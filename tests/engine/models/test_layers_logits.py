"""Linear.logits, the LM head's float32 logits: the values of its 16-bit output, whether the matmul
writes them (the Triton kernel: the interpreter on the CPU, compiled on a GPU) or a second pass
converts them (the reference path, and `layers.LOGITS_FROM_MATMUL = False`)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from shardinfer.engine.models import layers
from shardinfer.engine.models.base import Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.registry import model_class
from shardinfer.kernels import ops


def _head(bias: bool) -> tuple[layers.Linear, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    head = layers.Linear(96, 200, bias, Numerics(torch.bfloat16))
    head.weight.data.copy_(torch.randn(200, 96, generator=g) * 0.1)
    if head.bias is not None:
        head.bias.data.copy_(torch.randn(200, generator=g))
    return head, torch.randn(5, 96, generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("kernels", [False, True], ids=["reference", "triton"])
def test_logits_are_the_16_bit_outputs_values(
    bias: bool, kernels: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kernels and torch.cuda.is_available():
        pytest.skip("CPU tensors on the kernels need the interpreter; the GPU suite runs them compiled")
    if kernels:
        monkeypatch.setattr(ops, "_use_triton", lambda t: True)
    head, x = _head(bias)
    got = head.logits(x)
    want = head(x).float()
    assert got.dtype == torch.float32 and got.shape == (5, 200)
    assert torch.equal(got, want)
    monkeypatch.setattr(layers, "LOGITS_FROM_MATMUL", False)
    assert torch.equal(head.logits(x), want)


def test_an_lm_head_is_never_quantised_and_is_warmed_up_for_float32_logits() -> None:
    head = layers.logits_head(96, 200, Numerics(torch.bfloat16, quantization="fp8"))
    assert head.writes_logits and head.fp8_scale is None and head.weight.dtype == torch.bfloat16
    assert not layers.Linear(96, 200, False, Numerics(torch.bfloat16)).writes_logits


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
def test_each_family_builds_its_lm_head_as_a_logits_head(family: str, tiny_checkpoint: Any) -> None:
    config = ModelConfig.from_dir(tiny_checkpoint(family))
    model = model_class(config)(config, Numerics(torch.bfloat16, quantization="fp8"), 64)
    assert model.lm_head.writes_logits and model.lm_head.fp8_scale is None
    assert sum(m.writes_logits for m in model.modules() if isinstance(m, layers.Linear)) == 1
