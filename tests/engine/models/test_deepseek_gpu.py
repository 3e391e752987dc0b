"""DeepSeek-V3/V2 on CUDA (Triton MLA, routing and fused-MoE kernels, CUDA graphs) against the
same model on CPU (the PyTorch references).

Run on a GPU machine: `pytest -m gpu tests/engine/models/test_deepseek_gpu.py`. The tiny configs
use qk_rope_head_dim=16, the smallest rope width the MLA kernel's tensor-core dots take.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from deepseek_helpers import (
    REGIMES,
    V2_REGIMES,
    PagedRunner,
    generate_batch,
    load_model,
    make_deepseek_v2_checkpoint,
)

from shardinfer.engine.models.deepseek_moe import DeepseekMoE
from shardinfer.kernels import moe, moe_routing, reference_moe
from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22], list(range(30, 51))]
CASES = ["base", "qlora_yarn_mscale", "group_limited", "v2_group_limited"]


@pytest.fixture(scope="module")
def checkpoints() -> dict[str, Path]:
    root = Path(tempfile.mkdtemp(prefix="shardinfer-deepseek-gpu-"))
    out = {}
    for case in CASES:
        if case in V2_REGIMES:
            out[case] = make_deepseek_v2_checkpoint(
                root / case, **{**V2_REGIMES[case], "qk_rope_head_dim": 16}
            )
        else:
            out[case] = make_tiny_checkpoint(
                root / case, "deepseek_v3", **{**REGIMES[case], "qk_rope_head_dim": 16}
            )
    yield out
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the routing and fused-MoE kernel calls; the reference expert path must not run on CUDA."""
    calls = {"route": 0, "experts": 0}

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if args[0].is_cuda:
                calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    def no_reference(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if x.is_cuda:
            raise AssertionError("reference_moe.moe_experts ran on CUDA; the fused kernel should have")
        return original_experts(x, *args, **kwargs)

    original_experts = reference_moe.moe_experts
    monkeypatch.setattr(moe_routing, "grouped_topk", counted("route", moe_routing.grouped_topk))
    monkeypatch.setattr(moe, "fused_moe", counted("experts", moe.fused_moe))
    monkeypatch.setattr(reference_moe, "moe_experts", no_reference)
    return calls


@pytest.mark.parametrize("case", CASES)
def test_cuda_matches_cpu_and_is_batch_invariant(
    checkpoints: dict[str, Path], case: str, kernel_calls: dict[str, int]
) -> None:
    cpu = load_model(checkpoints[case])
    gpu = load_model(checkpoints[case])
    gpu.to_device(torch.device("cuda"))
    want_tokens, want = generate_batch(PagedRunner(cpu), PROMPTS, 5)
    got_tokens, got = generate_batch(PagedRunner(gpu, device="cuda"), PROMPTS, 5)
    assert got_tokens == want_tokens
    assert max((a - b).abs().max().item() for a, b in zip(got, want, strict=True)) <= 1e-5
    _, alone = generate_batch(PagedRunner(gpu, device="cuda", seed=5), PROMPTS[2:], 5)
    assert torch.equal(alone[0], got[2])
    assert kernel_calls["route"] > 0 and kernel_calls["route"] == kernel_calls["experts"]


def _moe_layers(case: str, checkpoints: dict[str, Path], dtype: torch.dtype) -> list[DeepseekMoE]:
    model = load_model(checkpoints[case], dtype=dtype)
    model.to_device(torch.device("cuda"))
    return [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, DeepseekMoE)]


@pytest.mark.parametrize("case", ["group_limited", "v2_group_limited"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_moe_layer_syncs_nothing_and_graph_replay_equals_eager(
    checkpoints: dict[str, Path], case: str, dtype: torch.dtype
) -> None:
    """The routed layer in a CUDA graph: no host sync eagerly, and a graph captured on one input
    replays other inputs (other routings, so other expert loads) bitwise like eager calls."""
    (layer, *_) = _moe_layers(case, checkpoints, dtype)
    hidden = layer.experts.w_gate_up.shape[-1]
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = [torch.randn(24, hidden, device="cuda", generator=gen).to(dtype) for _ in range(3)]
    # All tokens alike: every slot lands on the same top-k experts, the worst padding case.
    inputs.append(inputs[0][:1].expand(24, hidden).contiguous())
    eager = [layer(x) for x in inputs]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = layer(inputs[1])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(again, eager[1])
    static_in = inputs[0].clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(static_in)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            static_out = layer(static_in)
    torch.cuda.current_stream().wait_stream(stream)
    for x, want in zip(inputs, eager, strict=True):
        static_in.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, want)
    # Batch invariance of the whole layer (router GEMM, routing, experts, shared experts).
    for i in (0, 13):
        assert torch.equal(layer(inputs[2][i : i + 1]), eager[2][i : i + 1])


@torch.inference_mode()
def test_routing_kernel_matches_reference_at_moe16b_shape() -> None:
    """moe-16b's router: 64 experts, one group, top-6, sigmoid with correction bias, scale 2.446.

    The GPU's exp differs from torch's by an ulp or two, which may reorder experts whose biased
    scores are within ~1e-6; tokens without such near-ties must match exactly (ids and order),
    and they must be nearly all tokens."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    logits = torch.randn(4096, 64, device="cuda", generator=gen) * 2
    bias = torch.randn(64, device="cuda", generator=gen) * 0.1
    w, ids = moe_routing.grouped_topk(logits, bias, 6, 1, 1, True, 2.446)
    want_w, want_ids = reference_moe.grouped_topk(logits, bias, 6, 1, 1, True, 2.446)
    choice = (torch.sigmoid(logits.double()) + bias.double()).sort(dim=-1, descending=True).values[:, :7]
    clear = (choice[:, :-1] - choice[:, 1:]).min(dim=-1).values > 1e-5
    assert clear.float().mean().item() > 0.95
    assert torch.equal(ids[clear], want_ids[clear])
    torch.testing.assert_close(w[clear], want_w[clear], rtol=1e-5, atol=0)
