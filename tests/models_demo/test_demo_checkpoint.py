"""The demo checkpoint's files: HF layout, the MTP layer's tensors, tokenizer and chat template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from jinja2.sandbox import ImmutableSandboxedEnvironment
from safetensors import safe_open
from tokenizers import Tokenizer

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]


def test_files_and_size(model_dir: Path) -> None:
    names = {p.name for p in model_dir.iterdir()}
    for need in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "README.md",
        "metrics.json",
    ):
        assert need in names, need
    weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    assert weights <= 20_000_000


def test_config_is_deepseek_v3_with_one_mtp_layer(model_dir: Path) -> None:
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["model_type"] == "deepseek_v3"
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    assert cfg["num_nextn_predict_layers"] == 1
    assert cfg["n_shared_experts"] == 1 and cfg["n_group"] > 1
    assert cfg["first_k_dense_replace"] >= 1


def test_mtp_tensors_in_deepseek_layout(model_dir: Path) -> None:
    cfg = json.loads((model_dir / "config.json").read_text())
    n, hidden, vocab = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        mtp = f"model.layers.{n}."
        assert f.get_tensor(mtp + "eh_proj.weight").shape == (hidden, 2 * hidden)
        for name in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
            assert f.get_tensor(mtp + name).shape == (hidden,)
        head = f.get_tensor(mtp + "shared_head.head.weight")
        assert head.shape == (vocab, hidden)
        assert torch.equal(head, f.get_tensor("lm_head.weight"))  # the head is shared, stored twice
        for e in range(cfg["n_routed_experts"]):
            assert f"{mtp}mlp.experts.{e}.gate_proj.weight" in keys
        assert mtp + "mlp.shared_experts.down_proj.weight" in keys
        assert mtp + "self_attn.kv_a_proj_with_mqa.weight" in keys
        assert f"model.layers.{n + 1}.enorm.weight" not in keys
        assert f.get_tensor("model.layers.1.mlp.gate.e_score_correction_bias").dtype == torch.float32
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
        # Non-negative biases keep masking unchosen groups with 0 (transformers) equal to -inf (DeepSeek).
        for layer in range(cfg["first_k_dense_replace"], n + 1):
            assert float(f.get_tensor(f"model.layers.{layer}.mlp.gate.e_score_correction_bias").min()) >= 0.0


def test_tokenizer_and_chat_template(model_dir: Path) -> None:
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert [tok.token_to_id(s) for s in SPECIALS] == list(range(6))
    tcfg: dict[str, Any] = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert (tcfg["bos_token"], tcfg["eos_token"]) == ("<|bos|>", "<|eos|>")
    template = ImmutableSandboxedEnvironment().from_string(tcfg["chat_template"])
    text = template.render(
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
        add_generation_prompt=True,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
    )
    assert text == "<|bos|><|user|>What is 2 + 2?<|eos|><|assistant|>"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids[:2] == [0, 4] and ids[-2:] == [1, 5]
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 1 and gen["bos_token_id"] == 0


def test_transformers_loads_it_ignoring_only_the_mtp_layer(model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    loaded: Any = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, output_loading_info=True
    )
    info = loaded[1]
    n = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    assert not info["missing_keys"]
    assert info["unexpected_keys"]
    assert all(k.startswith(f"model.layers.{n}.") for k in info["unexpected_keys"])
