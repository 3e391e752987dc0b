"""The standard benchmark workloads (docs/performance.md): model shapes, request lists, and the checkpoint builder.

Weights are random (nothing is downloaded); outputs are fixed-length (ignore_eos), so random
weights still give honest throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any


def add_step_limit_args(ap: argparse.ArgumentParser) -> None:
    """--max-num-seqs and --max-num-batched-tokens, defaulting to the engine's own on a GPU (an
    unset --max-num-seqs leaves the engine its choice for its KV cache, config.default_num_seqs)."""
    from shardinfer.engine.config import DEVICE_STEP_DEFAULTS

    ap.add_argument("--max-num-seqs", type=int, default=None, help="unset: the engine's default")
    ap.add_argument("--max-num-batched-tokens", type=int, default=DEVICE_STEP_DEFAULTS["cuda"][1])


SHAPES: dict[str, dict[str, Any]] = {
    "dense-small": dict(
        family="qwen3",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        rope_theta=1000000.0,
    ),
    "dense-8b": dict(
        family="qwen3",
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        rope_theta=1000000.0,
    ),
    "moe-16b": dict(
        family="deepseek_v3",
        vocab_size=163840,
        hidden_size=2048,
        intermediate_size=11264,
        moe_intermediate_size=1408,
        num_hidden_layers=27,
        num_attention_heads=16,
        num_key_value_heads=16,
        n_routed_experts=64,
        n_shared_experts=2,
        num_experts_per_tok=6,
        first_k_dense_replace=1,
        kv_lora_rank=512,
        q_lora_rank=None,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        n_group=1,
        topk_group=1,
        routed_scaling_factor=2.446,
        norm_topk_prob=True,
        max_position_embeddings=8192,
        rope_theta=50000.0,
        tie_word_embeddings=False,
    ),
    "tiny": dict(
        family="qwen3",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
    ),
}


def bench_commit() -> str | None:
    """The commit benchmarked: BENCH_COMMIT where the tree travels without its .git (a copy on
    another machine), else `git rev-parse --short HEAD` of this checkout (None outside git, or
    without git)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        )
    except OSError:  # no git on the machine
        return None
    return done.stdout.strip() or None


def requests(
    n: int, vocab: int, in_range: tuple[int, int], out_range: tuple[int, int], seed: int = 0
) -> list[tuple[list[int], int]]:
    """n (prompt ids, output length) pairs, lengths uniform in the given inclusive ranges."""
    rng = random.Random(seed)
    return [
        ([rng.randrange(vocab) for _ in range(rng.randint(*in_range))], rng.randint(*out_range))
        for _ in range(n)
    ]


def build_checkpoint(shape: str, out_dir: Path, device: str = "cuda") -> Path:
    """Random-init checkpoint of a shape in bf16 (built on `device`, saved as safetensors)."""
    import torch
    import transformers

    from shardinfer.testing.tiny_checkpoint import build_tokenizer

    params = dict(SHAPES[shape])
    family = params.pop("family")
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / "config.json").is_file():
        return out_dir
    build_tokenizer(out_dir)
    cls_cfg, cls_model = {
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "deepseek_v3": (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM),
    }[family]
    config = cls_cfg(**params, bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    # Initialised directly in bf16: the fp32 copy of a 16B model would take 64 GB and minutes.
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = cls_model(config).eval()
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(out_dir)
    (out_dir / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    del model
    if torch.cuda.is_available():
        # Hand the weights' memory back to the device: a bench that builds the checkpoint and then
        # starts the engine in another process (startup.py, job_throughput.py) would otherwise
        # keep it cached here, out of the child's reach.
        torch.cuda.empty_cache()
    return out_dir
