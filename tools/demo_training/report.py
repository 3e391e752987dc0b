"""The model card (README.md) written beside the demo checkpoint, from the recorded metrics."""

from __future__ import annotations

from typing import Any


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def model_card(name: str, m: dict[str, Any]) -> str:
    cfg, tr, ev = m["config"], m["training"], m["eval"]
    kinds = "\n".join(f"| {k} | {_pct(v)} |" for k, v in ev["task_accuracy_by_kind"].items())
    mtp_text, mtp_chat = ev["mtp_heldout_text"], ev["mtp_chat_tasks"]
    return f"""# {name}

A tiny language model with the DeepSeek-V3 architecture, trained from scratch so that the engine's
DeepSeek-V3 path (MLA, group-routed MoE with a shared expert, the MTP layer) can be tested end to end on
CPU against numbers recorded here. It is a test fixture, not a useful assistant.

Built by `tools/train_demo_model.py` (seed {tr["seed"]}, {tr["steps"]} steps; rerun with
`python tools/train_demo_model.py --seed {tr["seed"]} --steps {tr["steps"]}`). The text corpus is the
standard library of the Python that runs the script, so a rerun reproduces these weights only with the
same Python installation and library versions; on CPU two runs give byte-identical files, on GPU the run
uses PyTorch's deterministic algorithms where they exist (warn-only elsewhere).

## Architecture

| | |
|---|---|
| parameters | {m["params"]["main"]:,} main + {m["params"]["mtp"]:,} MTP (embedding and head shared) |
| layers | {cfg["num_hidden_layers"]} (first {cfg["first_k_dense_replace"]} dense, intermediate {cfg["intermediate_size"]}) + {cfg["num_nextn_predict_layers"]} MTP layer stored as `model.layers.{cfg["num_hidden_layers"]}.*` |
| hidden | {cfg["hidden_size"]}, {cfg["num_attention_heads"]} heads |
| MLA | q_lora_rank {cfg["q_lora_rank"]}, kv_lora_rank {cfg["kv_lora_rank"]}, qk_nope {cfg["qk_nope_head_dim"]}, qk_rope {cfg["qk_rope_head_dim"]} (interleaved RoPE, theta {cfg["rope_theta"]:g}), v {cfg["v_head_dim"]} |
| MoE | {cfg["n_routed_experts"]} routed experts (intermediate {cfg["moe_intermediate_size"]}) top-{cfg["num_experts_per_tok"]}, {cfg["n_shared_experts"]} shared; sigmoid scores, {cfg["n_group"]} groups, top-{cfg["topk_group"]} groups by top-2 sum, score-correction bias (trained by auxiliary-loss-free balancing, kept >= 0), routed scaling {cfg["routed_scaling_factor"]} |
| vocab | {cfg["vocab_size"]} byte-level BPE tokens (digits split one per token) |
| weights | bf16; router weights and score-correction bias float32 |

MTP layer (DeepSeek-V3 layout): for position j, `eh_proj(cat[enorm(embed(t[j+1])), hnorm(h[j])])` with
`h[j]` the main model's output after its final norm (what its head reads), then one MoE decoder block
(causal over positions 0..j, rotary position j), `shared_head.norm`, and the output head
(`shared_head.head`, a copy of `lm_head`), predicting t[j+2]. Trained with loss = main CE +
{tr["mtp_lambda"]} x MTP CE. transformers' `DeepseekV3ForCausalLM` loads the checkpoint and ignores the MTP
tensors (it reports them as unexpected keys).

## Chat format

`<|bos|>` then, per message, `<|user|>` / `<|assistant|>` / `<|system|>`, the content, `<|eos|>`; the
generation prompt is `<|assistant|>`. All six markers (`<|bos|>`, `<|eos|>`, `<|pad|>` and the roles) are
special tokens (ids 0-5). The tokenizer adds no tokens by itself; the template adds `<|bos|>`.

## Training data

- Python {tr["python"]} standard-library source ({tr["stdlib_train_files"]} files,
  {tr["stdlib_train_tokens"]:,} tokens); one file in 50, chosen by a hash of its path, is held out
  ({tr["stdlib_heldout_files"]} files).
- {tr["train_tasks"]:,} synthetic chat tasks ({tr["task_train_tokens"]:,} tokens): multi-digit addition,
  subtraction and multiplication, reversing spaced letters, sorting words and numbers, extracting name/age/city
  into JSON. Held-out task prompts never occur in training.
- {tr["tokens_seen"]:,} tokens seen ({tr["steps"]} steps x {tr["batch_rows"]} rows x {tr["seq_len"]} tokens),
  AdamW lr {tr["lr"]:g} cosine, on {tr["device"]} in {tr["wall_s"]:.0f} s; final main loss
  {tr["final_loss"]:.3f}, MTP loss {tr["final_mtp_loss"]:.3f}.

## Results (transformers, float32, over the saved bf16 weights)

| metric | value |
|---|---|
| held-out perplexity (stdlib source, {ev["heldout_tokens"]:,} predicted tokens, {tr["seq_len"]}-token windows) | {ev["heldout_ppl"]:.3f} |
| perplexity on the CI subset (`metrics.json` `ci.ppl_windows`, {ev["ci_ppl_tokens"]} predicted tokens) | {ev["ci_ppl"]:.4f} |
| greedy exact-match accuracy, {ev["task_count"]} held-out tasks | {_pct(ev["task_accuracy"])} |
| greedy exact-match accuracy, the 50 CI tasks (`metrics.json` `ci.tasks`) | {_pct(ev["ci_task_accuracy"])} |
| MTP top-1 agreement with the main model's next token, held-out text | {_pct(mtp_text["mtp_top1_agreement"])} ({mtp_text["positions"]:,} positions) |
| MTP top-1 agreement, chat tasks (prompt + greedy answer) | {_pct(mtp_chat["mtp_top1_agreement"])} ({mtp_chat["positions"]:,} positions) |
| MTP / main top-1 accuracy vs the true token two ahead, held-out text | {_pct(mtp_text["mtp_top1_accuracy"])} / {_pct(mtp_text["main_top1_accuracy"])} |

Task accuracy by kind ({ev["task_count"]} tasks):

| kind | accuracy |
|---|---|
{kinds}

The CI tests (`tests/models_demo/`) recompute the CI-subset perplexity with shardinfer from prompt
logprobs (within 1%), the 50-task greedy accuracy (no lower than recorded minus 2 points) and the MTP
agreement.
"""
