"""The MTP draft step against a float64 computation of the same module.

transformers' DeepseekV3 drops the MTP layer, so the test adds random MTP tensors
(`model.layers.{num_hidden_layers}.*`, in an extra shard named by the index) and computes the
module in float64 itself: transformers' float64 main model for h_i, then
eh_proj([enorm(emb(t_{i+1})) ; hnorm(h_i)]), transformers' float64 decoder block (loaded with the
MTP block's tensors), shared_head.norm and shared_head.head.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from deepseek_helpers import (
    PagedRunner,
    deepseek_checkpoint,
    load_hf,
    load_model,
    mtp_tensors,
    read_config,
    write_with_extra_shard,
)

from shardinfer.errors import CheckpointError

PROMPT = [7, 3, 19, 44, 2, 81, 5, 60, 12, 9, 33]


@pytest.fixture(scope="module")
def mtp_checkpoint() -> Iterator[tuple[Path, dict[str, torch.Tensor]]]:
    src = deepseek_checkpoint("base")
    extra = mtp_tensors(src)
    root = Path(tempfile.mkdtemp(prefix="shardinfer-mtp-"))
    yield write_with_extra_shard(src, root / "ckpt", extra, "model-mtp.safetensors"), extra
    shutil.rmtree(root, ignore_errors=True)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w.double() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@torch.no_grad()
def float64_draft_logits(
    model_dir: Path, mtp: dict[str, torch.Tensor], tokens: list[int], next_tokens: list[int]
) -> torch.Tensor:
    """Draft logits [len(tokens), vocab]: row i from h_i (main model over tokens) and next_tokens[i]."""
    import transformers

    cfg = read_config(model_dir)
    n_layers, eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    pre = f"model.layers.{n_layers}."
    w = {k[len(pre) :]: v.double() for k, v in mtp.items()}
    hf = load_hf(model_dir).double()
    hf.config._experts_implementation = "eager"  # the grouped-GEMM default has no float64 kernel
    ids = torch.tensor([tokens])
    hidden = hf.model(ids).last_hidden_state  # [1, T, H], after the final norm
    embeds = torch.nn.functional.embedding(torch.tensor([next_tokens]), w["embed_tokens.weight"])
    x = torch.cat([_rms(embeds, w["enorm.weight"], eps), _rms(hidden, w["hnorm.weight"], eps)], dim=-1)
    x = x @ w["eh_proj.weight"].T

    block = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3DecoderLayer(hf.config, n_layers)
    block = block.double().eval()
    n_exp = cfg["n_routed_experts"]
    state = {
        k: v
        for k, v in w.items()
        if not k.startswith(("mlp.experts.", "enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens"))
    }
    state["mlp.experts.gate_up_proj"] = torch.stack(
        [
            torch.cat([w[f"mlp.experts.{e}.gate_proj.weight"], w[f"mlp.experts.{e}.up_proj.weight"]])
            for e in range(n_exp)
        ]
    )
    state["mlp.experts.down_proj"] = torch.stack(
        [w[f"mlp.experts.{e}.down_proj.weight"] for e in range(n_exp)]
    )
    missing, unexpected = block.load_state_dict(state, strict=False)
    assert not unexpected and not missing, (missing, unexpected)

    t = len(tokens)
    positions = torch.arange(t).unsqueeze(0)
    cos_sin = hf.model.rotary_emb(x, positions)
    causal = torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1).view(1, 1, t, t)
    y = block(x, attention_mask=causal, position_ids=positions, position_embeddings=cos_sin)
    y = _rms(y, w["shared_head.norm.weight"], eps)
    return (y @ w["shared_head.head.weight"].T)[0]


def test_mtp_draft_step_matches_float64(mtp_checkpoint: tuple[Path, dict[str, torch.Tensor]]) -> None:
    model_dir, extra = mtp_checkpoint
    model = load_model(model_dir)
    assert model.num_mtp_layers == 1
    assert len(model.mtp_kv_cache_specs()) == 1
    runner = PagedRunner(model, include_mtp=True)
    with torch.no_grad():
        # Prefill: main model over the prompt, then the draft step over the same positions with the
        # tokens shifted by one (the last one being the main model's greedy next token).
        ids, positions, ctx = runner.prepare([("s", PROMPT)])
        hidden = model(ids, positions, ctx)
        t_next = int(model.compute_logits(hidden[-1:]).argmax())
        draft_in = torch.tensor([*PROMPT[1:], t_next])
        draft = model.mtp_compute_logits(model.mtp_forward(draft_in, positions, hidden, ctx))
        want = float64_draft_logits(model_dir, extra, PROMPT, [*PROMPT[1:], t_next])
        assert (draft.double() - want).abs().max().item() <= 1e-4

        # Decode: one more main step, then the draft step at that position, reading the MTP
        # layer's cache written during prefill.
        ids, positions, ctx = runner.prepare([("s", [t_next])])
        hidden = model(ids, positions, ctx)
        t_after = int(model.compute_logits(hidden).argmax())
        draft = model.mtp_compute_logits(model.mtp_forward(torch.tensor([t_after]), positions, hidden, ctx))
        seq = [*PROMPT, t_next]
        want = float64_draft_logits(model_dir, extra, seq, [*seq[1:], t_after])[-1:]
        assert (draft.double() - want).abs().max().item() <= 1e-4


def test_partial_mtp_layer_is_a_checkpoint_error(
    mtp_checkpoint: tuple[Path, dict[str, torch.Tensor]],
) -> None:
    _model_dir, extra = mtp_checkpoint
    partial = {k: v for k, v in extra.items() if not k.endswith("eh_proj.weight")}
    root = Path(tempfile.mkdtemp(prefix="shardinfer-mtp-"))
    try:
        broken = write_with_extra_shard(deepseek_checkpoint("base"), root / "ckpt", partial)
        with pytest.raises(CheckpointError, match="eh_proj"):
            load_model(broken)
    finally:
        shutil.rmtree(root, ignore_errors=True)
