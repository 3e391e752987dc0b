"""Build a random-init checkpoint of a supported family, in Hugging Face layout, with no download.

The tokenizer is a byte-level BPE trained with `tokenizers` on a small built-in corpus, with chat
special tokens and a jinja chat template, so every code path (encode, decode, chat, stop strings)
has something real to work on. The model comes from transformers (a test/bench dependency) with
random weights, saved as safetensors. Used by tests (parity with transformers), benchmarks
(real shapes) and the offline demo.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_CORPUS = """
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n    y: int = 0\n
{"name": "Ada", "age": 36, "tags": ["math", "engines"], "ok": true, "score": 3.5e-2, "none": null}
1 + 2 = 3; 12 * 34 = 408; 1000 - 1 = 999; reverse("abc") = "cba"; sorted("dcba") = "abcd".
Parquet shards stream through a reader into the engine; outputs are committed exactly once.
SELECT id, prompt FROM input WHERE length(prompt) > 10 ORDER BY id;
Hello, world! How are you today? I am fine, thank you. What is the capital of France? Paris.
"""

FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    ),
    "qwen2": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    ),
    "qwen3": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
    ),
    "mistral": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        sliding_window=24,
    ),
    "deepseek_v3": dict(
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        n_group=2,
        topk_group=2,
        kv_lora_rank=32,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        max_position_embeddings=512,
    ),
}


def build_tokenizer(out_dir: Path, vocab_size: int = 384) -> int:
    """Train and save tokenizer.json + tokenizer_config.json; returns the tokenizer's vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    cfg = {
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "pad_token": "<|eos|>",
        "chat_template": CHAT_TEMPLATE,
        "add_bos_token": False,
        "model_max_length": 512,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return int(tok.get_vocab_size())


def make_tiny_checkpoint(
    out_dir: str | Path,
    family: str = "qwen3",
    seed: int = 0,
    dtype: str = "float32",
    max_shard_size: str | None = None,
    **overrides: Any,
) -> Path:
    """Write a random-init `family` model (transformers) plus tokenizer into out_dir; returns it."""
    import torch
    import transformers

    out = Path(out_dir)
    tok_vocab = build_tokenizer(out)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    params = dict(FAMILY_DEFAULTS[family])
    params.update(
        vocab_size=max(tok_vocab, 384),
        bos_token_id=tok.token_to_id("<|bos|>"),
        eos_token_id=tok.token_to_id("<|eos|>"),
        pad_token_id=tok.token_to_id("<|eos|>"),
    )
    params.update(overrides)
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "deepseek_v3": (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM),
    }[family]
    config = config_cls(**params)
    torch.manual_seed(seed)
    model = model_cls(config).to(getattr(torch, dtype)).eval()
    # Random init leaves norms at 1 and biases at 0; perturb them so a mix-up would show.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith("e_score_correction_bias"):
                p.copy_(torch.randn_like(p) * 0.1)
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.copy_(torch.randn_like(buf) * 0.1)
    kwargs: dict[str, Any] = {}
    if max_shard_size is not None:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(out, **kwargs)
    gen = {"bos_token_id": params["bos_token_id"], "eos_token_id": params["eos_token_id"]}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return out
