"""Test helpers for the DeepSeek-V3 model: load it from a checkpoint directory, and drive it
through a paged latent cache the way the engine's runner does (varlen batches of several
requests, blocks scattered over the pool, prefill then decode), without the engine."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import torch

from shardinfer.engine.forward_context import AttentionMetadata, ForwardContext
from shardinfer.engine.models.base import Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.deepseek_v3 import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
from shardinfer.engine.models.loader import iter_checkpoint_tensors
from shardinfer.testing.tiny_checkpoint import FAMILY_DEFAULTS, build_tokenizer, make_tiny_checkpoint
from tests.engine.hf_reference import hf_logits  # transformers' logits [len, vocab] (float32), no cache

# Tiny configs, one per regime the tests cover (transformers DeepseekV3Config keys).
YARN_MSCALE = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 32,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
YARN_PLAIN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
REGIMES: dict[str, dict[str, Any]] = {
    # n_group = topk_group = 2, no query LoRA, plain RoPE.
    "base": {},
    # query LoRA, YaRN with mscale_all_dim (softmax-scale correction), a single expert group.
    "qlora_yarn_mscale": dict(
        q_lora_rank=16, rope_scaling=YARN_MSCALE, max_position_embeddings=128, n_group=1, topk_group=1
    ),
    # YaRN without mscale keys (cos/sin attention factor only), rotate-half RoPE, 4 groups all kept.
    "yarn_halves_groups4": dict(
        rope_scaling=YARN_PLAIN,
        max_position_embeddings=128,
        rope_interleave=False,
        n_routed_experts=16,
        n_group=4,
        topk_group=4,
        num_experts_per_tok=3,
    ),
    # Group-limited routing that really drops groups (2 of 4), with query LoRA.
    "group_limited": dict(
        q_lora_rank=16, n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=3
    ),
}

# DeepSeek-V2: softmax routing, plain top-k or limited to the best experts' groups.
V2_REGIMES: dict[str, dict[str, Any]] = {
    "v2_greedy": dict(topk_method="greedy", q_lora_rank=None),
    "v2_group_limited": dict(
        topk_method="group_limited_greedy",
        n_routed_experts=16,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=3,
        q_lora_rank=16,
        rope_scaling=YARN_MSCALE,
        max_position_embeddings=128,
    ),
}

_CACHE: dict[str, Path] = {}


def deepseek_checkpoint(regime: str) -> Path:
    """A random-init transformers DeepseekV3 (or V2, for V2_REGIMES) checkpoint, built once per process."""
    if regime not in _CACHE:
        root = Path(tempfile.mkdtemp(prefix="shardinfer-deepseek-"))
        atexit.register(shutil.rmtree, root, True)
        if regime in V2_REGIMES:
            _CACHE[regime] = make_deepseek_v2_checkpoint(root / regime, **V2_REGIMES[regime])
        else:
            _CACHE[regime] = make_tiny_checkpoint(root / regime, "deepseek_v3", **REGIMES[regime])
    return _CACHE[regime]


def make_deepseek_v2_checkpoint(out: Path, seed: int = 0, **overrides: Any) -> Path:
    """A random-init transformers DeepseekV2 checkpoint with the shared test tokenizer."""
    import transformers
    from tokenizers import Tokenizer

    vocab = build_tokenizer(out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    params = {k: v for k, v in FAMILY_DEFAULTS["deepseek_v3"].items() if k != "routed_scaling_factor"}
    params.update(
        vocab_size=max(vocab, 384),
        bos_token_id=tok.token_to_id("<|bos|>"),
        eos_token_id=tok.token_to_id("<|eos|>"),
        pad_token_id=tok.token_to_id("<|eos|>"),
        n_shared_experts=2,
        routed_scaling_factor=1.5,
        norm_topk_prob=False,
    )
    params.update(overrides)
    config = transformers.DeepseekV2Config(**params)
    torch.manual_seed(seed)
    model = transformers.DeepseekV2ForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)
    return out


def load_hf(model_dir: str | Path, dtype: torch.dtype = torch.float32):  # type: ignore[no-untyped-def]
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).eval()


def read_config(model_dir: Path) -> dict[str, Any]:
    return dict(json.loads((model_dir / "config.json").read_text()))


def load_model(
    model_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    batch_invariant: bool = True,
    max_positions: int = 256,
) -> DeepseekV3ForCausalLM:
    config = ModelConfig.from_dir(model_dir)
    cls = DeepseekV2ForCausalLM if config.architecture == "DeepseekV2ForCausalLM" else DeepseekV3ForCausalLM
    model = cls(config, Numerics(dtype, batch_invariant), max_positions)
    model.load_weights(iter_checkpoint_tensors(model_dir))
    return model.eval()


@torch.no_grad()
def hf_greedy(hf_model, prompt: list[int], steps: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Greedy continuation by transformers, recomputing the whole sequence each step (no eos stop)."""
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(hf_logits(hf_model, ids)[-1].argmax()))
    return ids[len(prompt) :]


class PagedRunner:
    """A miniature model runner: owns the latent caches, a block pool and per-sequence block tables."""

    def __init__(
        self,
        model: DeepseekV3ForCausalLM,
        num_blocks: int = 96,
        block_size: int = 4,
        include_mtp: bool = False,
        seed: int = 0,
        device: str = "cpu",
    ) -> None:
        self.model = model
        self.device = torch.device(device)
        self.block_size = block_size
        specs = model.kv_cache_specs() + (model.mtp_kv_cache_specs() if include_mtp else [])
        dtype = model.numerics.dtype
        self.caches = [
            tuple(
                torch.zeros(num_blocks, block_size, *shape, dtype=dtype, device=self.device)
                for shape in spec.entries
            )
            for spec in specs
        ]
        # A shuffled free list scatters each sequence's blocks over the pool.
        gen = torch.Generator().manual_seed(seed)
        self.free = torch.randperm(num_blocks, generator=gen).tolist()
        self.blocks: dict[Hashable, list[int]] = {}
        self.lens: dict[Hashable, int] = {}

    def share_prefix(self, src: Hashable, dst: Hashable, num_tokens: int) -> None:
        """Let dst start with src's first num_tokens (whole blocks) cached, as prefix caching does."""
        if num_tokens % self.block_size:
            raise ValueError("a shared prefix must be whole blocks")
        self.blocks[dst] = list(self.blocks[src][: num_tokens // self.block_size])
        self.lens[dst] = num_tokens

    def prepare(
        self, batch: list[tuple[Hashable, list[int]]]
    ) -> tuple[torch.Tensor, torch.Tensor, ForwardContext]:
        """Append each sequence's new tokens: (input_ids [T], positions [T], ctx) for one step."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        qsl = [0]
        seq_lens: list[int] = []
        for key, new in batch:
            start = self.lens.get(key, 0)
            table = self.blocks.setdefault(key, [])
            end = start + len(new)
            while len(table) * self.block_size < end:
                table.append(self.free.pop())
            for pos in range(start, end):
                slots.append(table[pos // self.block_size] * self.block_size + pos % self.block_size)
            ids.extend(new)
            positions.extend(range(start, end))
            qsl.append(qsl[-1] + len(new))
            seq_lens.append(end)
            self.lens[key] = end
        width = max(len(self.blocks[k]) for k, _ in batch)
        tables = torch.full((len(batch), width), -1, dtype=torch.int32)
        for i, (key, _) in enumerate(batch):
            tables[i, : len(self.blocks[key])] = torch.tensor(self.blocks[key], dtype=torch.int32)
        dev = self.device
        attn = AttentionMetadata(
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=tables.to(dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_size=self.block_size,
            max_query_len=max(len(n) for _, n in batch),
            max_seq_len=max(seq_lens),
            query_start_loc_cpu=qsl,
            seq_lens_cpu=seq_lens,
        )
        ctx = ForwardContext(
            attn=attn, kv_caches=self.caches, batch_invariant=self.model.numerics.batch_invariant
        )
        return (
            torch.tensor(ids, dtype=torch.int64, device=dev),
            torch.tensor(positions, dtype=torch.int64, device=dev),
            ctx,
        )

    @torch.no_grad()
    def step(self, batch: list[tuple[Hashable, list[int]]]) -> list[torch.Tensor]:
        """Run one step; returns each sequence's logits [new tokens, vocab] (float32)."""
        ids, positions, ctx = self.prepare(batch)
        logits = self.model.compute_logits(self.model(ids, positions, ctx)).cpu()
        bounds = ctx.attn.query_start_loc_cpu
        return [logits[bounds[i] : bounds[i + 1]] for i in range(len(batch))]

    def kv_bytes_per_token(self) -> int:
        """Bytes the allocated caches spend per token slot, read off the tensors themselves."""
        total = sum(t.untyped_storage().nbytes() for entry in self.caches for t in entry)
        slots = self.caches[0][0].shape[0] * self.caches[0][0].shape[1]
        return total // slots


@torch.no_grad()
def generate_batch(
    runner: PagedRunner, prompts: list[list[int]], steps: int
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy decode all prompts together: one varlen prefill, then batched decode steps.

    Returns (generated ids per prompt, logits per prompt for every position [len + steps - 1, vocab]).
    """
    outs = runner.step([(i, p) for i, p in enumerate(prompts)])
    logits = [[o] for o in outs]
    generated: list[list[int]] = [[int(o[-1].argmax())] for o in outs]
    for _ in range(steps - 1):
        outs = runner.step([(i, [g[-1]]) for i, g in enumerate(generated)])
        for i, o in enumerate(outs):
            logits[i].append(o)
            generated[i].append(int(o[-1].argmax()))
    return generated, [torch.cat(chunks) for chunks in logits]


def mtp_tensors(model_dir: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors for MTP layer `num_hidden_layers`, shaped like the checkpoint's last layer
    (an MoE block) plus enorm, hnorm, eh_proj, shared_head and an embedding copy."""
    from safetensors.torch import load_file

    cfg = read_config(model_dir)
    last, mtp = cfg["num_hidden_layers"] - 1, cfg["num_hidden_layers"]
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, t in load_file(str(model_dir / "model.safetensors")).items():
        prefix = f"model.layers.{last}."
        if name.startswith(prefix):
            out[f"model.layers.{mtp}." + name[len(prefix) :]] = _random_like(name, t, gen)
    extra = {
        "enorm.weight": (hidden,),
        "hnorm.weight": (hidden,),
        "shared_head.norm.weight": (hidden,),
        "eh_proj.weight": (hidden, 2 * hidden),
        "shared_head.head.weight": (vocab, hidden),
        "embed_tokens.weight": (vocab, hidden),
    }
    for name, shape in extra.items():
        out[f"model.layers.{mtp}.{name}"] = _random_like(name, torch.empty(shape), gen)
    return out


def _random_like(name: str, t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return (1 + 0.1 * torch.randn(t.shape, generator=gen)).to(t.dtype)
    scale = 0.1 if name.endswith("e_score_correction_bias") else 0.08
    return (scale * torch.randn(t.shape, generator=gen)).to(t.dtype)


def write_with_extra_shard(
    src: Path, dst: Path, extra: dict[str, torch.Tensor], shard: str = "model-extra.safetensors"
) -> Path:
    """Copy checkpoint src to dst, adding `extra` tensors in their own shard and an index naming both."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    shutil.copytree(src, dst)
    save_file(extra, str(dst / shard))
    with safe_open(str(dst / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    weight_map = {n: "model.safetensors" for n in names} | {n: shard for n in extra}
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst
