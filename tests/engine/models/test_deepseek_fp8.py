"""FP8 block-scaled checkpoints: dequantisation against a float reference, and a whole FP8 model
against the same model saved in float (and against transformers on those float weights)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from deepseek_helpers import PagedRunner, deepseek_checkpoint, generate_batch, hf_logits, load_hf, load_model
from safetensors.torch import load_file, save_file

from shardinfer.engine.models.fp8 import Fp8Format, dequantize_block_fp8, dequantize_checkpoint, fp8_format
from shardinfer.errors import CheckpointError, ModelLoadError

FP8_MAX = 448.0
BLOCK = (32, 32)
BLOCK_FORMAT = Fp8Format("fp8", "block", BLOCK, ".weight_scale_inv")
# What the released DeepSeek-V3 checkpoints quantise: every linear weight except the router,
# embeddings and heads (norms are vectors and stay in float).
NOT_QUANTISED = ("embed_tokens.weight", "lm_head.weight", "mlp.gate.weight")


def quantize(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference blockwise quantiser: scale = block amax / 448, q = fp8(w / scale)."""
    n, k = w.shape
    bn, bk = block
    scales = torch.empty(-(-n // bn), -(-k // bk))
    q = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            tile = w[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk].double()
            s = max(float(tile.abs().max()), 1e-12) / FP8_MAX
            scales[i, j] = s
            q[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk] = (tile / s).to(torch.float8_e4m3fn)
    return q, scales


def float_reference(q: torch.Tensor, scales: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """fp8 value x its block's scale, each element's scale gathered by integer division, in float64."""
    rows = torch.arange(q.shape[0]).unsqueeze(1) // block[0]
    cols = torch.arange(q.shape[1]).unsqueeze(0) // block[1]
    return q.double() * scales.double()[rows, cols]


def test_dequantize_matches_float_reference_within_fp8_rounding() -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(300, 200, generator=gen) * torch.logspace(-3, 1, 200)  # partial 128-blocks, wide range
    q, scales = quantize(w, (128, 128))
    got = dequantize_block_fp8(q, scales, (128, 128), torch.float32)
    ref = float_reference(q, scales, (128, 128))
    assert (got.double() - ref).abs().max().item() <= 1e-6 * ref.abs().max().item()
    # Against the original weights the error is FP8 rounding: half a unit in the last place of a
    # 3-bit mantissa (relative 2^-4) for normal numbers, half the smallest subnormal (2^-10) otherwise.
    scale_of = scales.repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :200].double()
    bound = torch.maximum(w.double().abs() * 2**-4, scale_of * 2**-10)
    assert bool(((got.double() - w.double()).abs() <= bound * (1 + 1e-6)).all())


def test_weight_and_scale_pair_up_in_either_order() -> None:
    w = torch.randn(64, 40)
    q, s = quantize(w, BLOCK)
    want = dequantize_block_fp8(q, s, BLOCK, torch.float32)
    for order in ([("a.weight", q), ("a.weight_scale_inv", s)], [("a.weight_scale_inv", s), ("a.weight", q)]):
        out = dict(dequantize_checkpoint([*order, ("n.weight", w[0])], BLOCK_FORMAT, torch.float32))
        assert set(out) == {"a.weight", "n.weight"}
        assert torch.equal(out["a.weight"], want) and torch.equal(out["n.weight"], w[0])
    with pytest.raises(CheckpointError, match="no weight_scale_inv"):
        list(dequantize_checkpoint([("a.weight", q)], BLOCK_FORMAT, torch.float32))
    with pytest.raises(CheckpointError, match="weight_block_size"):
        list(
            dequantize_checkpoint(
                [("a.weight", q), ("a.weight_scale_inv", s[:1])], BLOCK_FORMAT, torch.float32
            )
        )
    with pytest.raises(CheckpointError, match="quantization_config"):
        list(dequantize_checkpoint([("a.weight", q), ("a.weight_scale_inv", s)], None, torch.float32))


@pytest.mark.parametrize(
    "qc",
    [
        {"quant_method": "gptq", "bits": 4},
        {"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]},
    ],
)
def test_unsupported_quantization_configs_are_refused(qc: dict[str, object]) -> None:
    with pytest.raises(ModelLoadError):
        fp8_format({"quantization_config": qc})


@pytest.fixture(scope="module")
def fp8_pair() -> Iterator[tuple[Path, Path]]:
    """(FP8 checkpoint, float checkpoint holding exactly the dequantised weights)."""
    src = deepseek_checkpoint("group_limited")
    root = Path(tempfile.mkdtemp(prefix="shardinfer-fp8-"))
    fp8_dir, float_dir = root / "fp8", root / "float"
    shutil.copytree(src, fp8_dir)
    shutil.copytree(src, float_dir)
    tensors = load_file(str(src / "model.safetensors"))
    quantised: dict[str, torch.Tensor] = {}
    scales: dict[str, torch.Tensor] = {}
    dequantised: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if t.dim() == 2 and not name.endswith(NOT_QUANTISED):
            q, s = quantize(t, BLOCK)
            quantised[name], scales[name + "_scale_inv"] = q, s
            dequantised[name] = float_reference(q, s, BLOCK).float()
        else:
            quantised[name] = dequantised[name] = t
    # Scales in their own shard, read before the weights: the loader must pair across shards.
    (fp8_dir / "model.safetensors").unlink()
    save_file(scales, str(fp8_dir / "a-scales.safetensors"))
    save_file(quantised, str(fp8_dir / "model.safetensors"))
    weight_map = {n: "model.safetensors" for n in quantised} | {n: "a-scales.safetensors" for n in scales}
    (fp8_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    cfg = json.loads((fp8_dir / "config.json").read_text())
    cfg["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": list(BLOCK),
    }
    (fp8_dir / "config.json").write_text(json.dumps(cfg))
    save_file(dequantised, str(float_dir / "model.safetensors"))
    yield fp8_dir, float_dir
    shutil.rmtree(root, ignore_errors=True)


def test_fp8_checkpoint_equals_its_dequantised_float_twin(fp8_pair: tuple[Path, Path]) -> None:
    fp8_dir, float_dir = fp8_pair
    from_fp8, from_float = load_model(fp8_dir), load_model(float_dir)
    float_params = dict(from_float.named_parameters())
    for name, p in from_fp8.named_parameters():
        assert torch.equal(p, float_params[name]), name
    prompts = [[4, 8, 15, 16, 23, 42], [1, 2, 3]]
    gen, logits = generate_batch(PagedRunner(from_fp8), prompts, 3)
    hf = load_hf(float_dir)
    for prompt, g, got in zip(prompts, gen, logits, strict=True):
        assert (got - hf_logits(hf, prompt + g[:-1])).abs().max().item() <= 1e-4
