"""Train the bundled demo model: a tiny DeepSeek-V3-architecture LM with one MTP layer and its tokenizer.

Everything comes from data on disk (this Python's standard-library source) and tasks generated here with a
fixed seed, so no download is needed. Output, in Hugging Face layout: config.json, model.safetensors,
tokenizer.json, tokenizer_config.json (with the chat template), generation_config.json, metrics.json (the
recorded numbers and the fixed CI evaluation data) and README.md.

    python tools/train_demo_model.py --out examples/models/tiny-dsv3-demo            # GPU: minutes
    python tools/train_demo_model.py --smoke --out /tmp/demo-smoke                   # CPU: a quick end-to-end check
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo_training import corpus, evaluate, model, report, tasks, train

NAME = "tiny-dsv3-demo"
CI_WINDOWS = 4  # 4 x 512 tokens: about 2k tokens of held-out text for the CI perplexity check
CI_TASKS = 50


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("examples/models") / NAME)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="seconds of training; fixes the step count (at most --steps) after 40 timed steps",
    )
    p.add_argument("--batch-rows", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--train-tasks", type=int, default=400_000)
    p.add_argument("--eval-tasks", type=int, default=700)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--smoke", action="store_true", help="tiny data and a few steps, to check the pipeline")
    p.add_argument("--skip-eval", action="store_true", help="stop after saving the model files")
    return p.parse_args()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main() -> None:
    args = parse_args()
    if args.smoke:
        args.steps, args.batch_rows, args.seq_len = min(args.steps, 6), 4, 128
        args.vocab, args.train_tasks, args.eval_tasks = 1024, 3000, 60
    t0 = time.time()
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    if args.device.startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    # --- data -------------------------------------------------------------------------------------
    files = corpus.stdlib_files()
    if args.smoke:
        files = files[:120]
    held = [(r, t) for r, t in files if corpus.is_held_out(r)]
    train_files = [(r, t) for r, t in files if not corpus.is_held_out(r)]
    eval_set = tasks.eval_tasks(args.seed, args.eval_tasks)
    train_set = tasks.train_tasks(args.seed, args.train_tasks, {t.prompt for t in eval_set})
    log(
        f"stdlib {corpus.stdlib_dir()}: {len(train_files)} train / {len(held)} held-out files; "
        f"{len(train_set)} train tasks, {len(eval_set)} eval tasks"
    )

    tok_texts = [t for _, t in train_files] + [f"{t.prompt}\n{t.answer}" for t in train_set[:30_000]]
    tok = corpus.train_tokenizer(tok_texts, args.vocab)
    bos, eos, pad = (special_id(tok, x) for x in (corpus.BOS, corpus.EOS, corpus.PAD))
    log(f"tokenizer: {tok.get_vocab_size()} tokens")

    def encode_docs(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]

    stdlib_docs = [[bos, *ids, eos] for ids in encode_docs([t for _, t in train_files])]
    chat_docs = encode_docs([corpus.render_chat(t.messages(True), False) for t in train_set])
    held_docs = [[bos, *ids, eos] for ids in encode_docs([t for _, t in held])]
    docs = stdlib_docs + chat_docs
    random.Random(f"shuffle-{args.seed}").shuffle(docs)
    stream = torch.tensor([i for d in docs for i in d], dtype=torch.int64)
    log(
        f"train stream {stream.numel():,} tokens ({sum(map(len, stdlib_docs)):,} stdlib, "
        f"{sum(map(len, chat_docs)):,} chat)"
    )

    # --- model and training -----------------------------------------------------------------------
    raw_cfg = model.model_config_dict(tok.get_vocab_size(), bos, eos, pad, max_positions=2048)
    cfg = model.hf_config(raw_cfg)
    torch.manual_seed(args.seed)
    main_model = model.DeepseekV3ForCausalLM(cfg).to(args.device)
    mtp = model.MTPLayer(cfg, cfg.num_hidden_layers)
    train.init_mtp(mtp, cfg.initializer_range)
    mtp.to(args.device)
    impl = choose_experts_impl(main_model, mtp, cfg, args.device)
    n_main = sum(p.numel() for p in main_model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    log(f"params: main {n_main:,}, mtp {n_mtp:,}; experts implementation {impl}")

    settings = train.TrainSettings(
        steps=args.steps,
        batch_rows=args.batch_rows,
        seq_len=args.seq_len,
        time_budget_s=args.time_budget,
        log_every=5 if args.smoke else 100,
    )
    t_train = time.time()
    train.train(main_model, mtp, stream, settings, args.device, args.seed, log=log)
    train_wall = time.time() - t_train

    # --- save in HF layout ------------------------------------------------------------------------
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    tensors = model.export_state_dict(main_model, mtp)
    model.add_shared_head(tensors, main_model)
    from safetensors.torch import save_file

    save_file(
        {k: v.cpu() for k, v in sorted(tensors.items())},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (out / "config.json").write_text(json.dumps(raw_cfg, indent=2) + "\n")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(corpus.tokenizer_config(2048), indent=2) + "\n")
    gen_cfg = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    log(f"saved {out} ({(out / 'model.safetensors').stat().st_size / 1e6:.2f} MB weights)")
    if args.skip_eval:
        return

    # --- reload with transformers and record the metrics ------------------------------------------
    ref, mtp_ref, load_info = reload(out, args.device, impl)
    check_reload(main_model, ref, stream[: 4 * args.seq_len].view(4, -1).to(args.device))
    eval_windows = evaluate.windows(held_docs, args.seq_len)[: 64 if args.smoke else 400]
    ci_windows = [w for w in eval_windows if len(w) == args.seq_len][:CI_WINDOWS]
    heldout_total, heldout_n = evaluate.nll_sum(ref, eval_windows, args.device)
    ci_ppl = evaluate.perplexity(ref, ci_windows, args.device)
    prompts = [encode_docs([corpus.render_chat(t.messages(False), True)])[0] for t in eval_set]
    acc, by_kind, completions = evaluate.task_accuracy(ref, eval_set, prompts, tok.decode, eos, args.device)
    ci_hits = [
        tasks.is_correct(t, c) for t, c in zip(eval_set[:CI_TASKS], completions[:CI_TASKS], strict=True)
    ]
    chat_seqs = [
        p + tok.encode(c, add_special_tokens=False).ids + [eos]
        for p, c in zip(prompts[:CI_TASKS], completions[:CI_TASKS], strict=True)
    ]
    metrics = {
        "name": NAME,
        "config": raw_cfg,
        "params": {"main": n_main, "mtp": n_mtp, "file_tensors": sum(v.numel() for v in tensors.values())},
        "training": {
            "seed": args.seed,
            "steps": settings.steps,
            "batch_rows": args.batch_rows,
            "seq_len": args.seq_len,
            "lr": settings.lr,
            "mtp_lambda": settings.mtp_lambda,
            "device": device_name(args.device),
            "experts_implementation": impl,
            "wall_s": train_wall,
            "total_wall_s": None,
            "tokens_seen": settings.steps * args.batch_rows * args.seq_len,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "stdlib_train_files": len(train_files),
            "stdlib_heldout_files": len(held),
            "stdlib_train_tokens": sum(map(len, stdlib_docs)),
            "train_tasks": len(train_set),
            "task_train_tokens": sum(map(len, chat_docs)),
            "final_loss": settings.history[-1]["loss"],
            "final_mtp_loss": settings.history[-1]["mtp_loss"],
            "history": settings.history,
            "smoke": args.smoke,
        },
        "load_check": load_info,
        "eval": {
            "heldout_ppl": float(torch.tensor(heldout_total / heldout_n).exp()),
            "heldout_tokens": heldout_n,
            "heldout_windows": len(eval_windows),
            "ci_ppl": ci_ppl,
            "ci_ppl_tokens": sum(len(w) - 1 for w in ci_windows),
            "task_count": len(eval_set),
            "task_accuracy": acc,
            "task_accuracy_by_kind": by_kind,
            "ci_task_accuracy": sum(ci_hits) / len(ci_hits),
            "mtp_heldout_text": evaluate.mtp_agreement(ref, mtp_ref, eval_windows[:64], args.device),
            "mtp_chat_tasks": evaluate.mtp_agreement(ref, mtp_ref, chat_seqs, args.device),
        },
        "ci": {
            "ppl_windows": ci_windows,
            "tasks": [
                {
                    "kind": t.kind,
                    "prompt": t.prompt,
                    "answer": t.answer,
                    "prompt_token_ids": p,
                    "completion": c,
                    "correct": h,
                }
                for t, p, c, h in zip(eval_set[:CI_TASKS], prompts, completions, ci_hits, strict=False)
            ],
            "mtp_sequences": chat_seqs,
        },
    }
    metrics["training"]["total_wall_s"] = time.time() - t0
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    (out / "README.md").write_text(report.model_card(NAME, metrics))
    ev = metrics["eval"]
    log(
        f"held-out ppl {ev['heldout_ppl']:.3f}; CI ppl {ci_ppl:.4f}; tasks {acc:.3f} {by_kind}; "
        f"CI tasks {ev['ci_task_accuracy']:.3f}; MTP agreement {ev['mtp_heldout_text']['mtp_top1_agreement']:.3f} "
        f"text / {ev['mtp_chat_tasks']['mtp_top1_agreement']:.3f} chat; total {time.time() - t0:.0f} s"
    )


def special_id(tok: Tokenizer, name: str) -> int:
    found = tok.token_to_id(name)
    if found is None:
        raise RuntimeError(f"the trained tokenizer lacks special token {name}")
    return found


def choose_experts_impl(main_model, mtp, cfg, device: str) -> str:
    """The fastest experts implementation that runs forward and backward here (grouped_mm needs newer GPUs)."""
    ids = torch.randint(0, cfg.vocab_size, (2, 16), device=device)
    for impl in ("grouped_mm", "eager") if device.startswith("cuda") else ("eager",):
        cfg._experts_implementation = impl
        try:
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
                a, b = train.losses(main_model, mtp, ids)
            (a + b).backward()
            main_model.zero_grad(set_to_none=True)
            mtp.zero_grad(set_to_none=True)
            return impl
        except Exception as exc:  # any failure means: use the next, simpler implementation
            log(f"experts implementation {impl} failed here ({type(exc).__name__}: {exc}); trying the next")
    raise RuntimeError("no experts implementation ran")


def reload(out: Path, device: str, impl: str):
    """Load the saved directory with transformers (main model) and rebuild the MTP layer from its tensors."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    loaded: Any = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, output_loading_info=True)
    ref, info = loaded
    if info.get("missing_keys"):
        raise RuntimeError(f"transformers found no tensor for {sorted(info['missing_keys'])}")
    ref.config._experts_implementation = impl if device.startswith("cuda") else "eager"
    ref.to(device).eval()
    mtp_ref = model.load_mtp(load_file(str(out / "model.safetensors")), ref.config).to(device).eval()
    unexpected = sorted(info.get("unexpected_keys") or [])
    return (
        ref,
        mtp_ref,
        {
            "missing_keys": [],
            "unexpected_keys": len(unexpected),
            "unexpected_all_mtp": all(
                k.startswith(f"model.layers.{ref.config.num_hidden_layers}.") for k in unexpected
            ),
        },
    )


@torch.no_grad()
def check_reload(trained, ref, ids: torch.Tensor) -> None:
    """The reloaded model must equal the trained one with its weights rounded to bf16 (same tensors)."""
    saved = {k: v.clone() for k, v in trained.state_dict().items()}
    for k, v in trained.state_dict().items():
        if v.is_floating_point() and not k.endswith(("mlp.gate.weight", "e_score_correction_bias")):
            v.copy_(v.to(torch.bfloat16).float())
    want = trained(input_ids=ids, use_cache=False).logits.float()
    got = ref(input_ids=ids, use_cache=False).logits.float()
    trained.load_state_dict(saved)
    diff = float((want - got).abs().max())
    log(f"reload check: max |logit difference| {diff:.3g}")
    if diff > 1e-3:
        raise RuntimeError(f"transformers' reload disagrees with the trained model (max diff {diff})")


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(0) if device.startswith("cuda") else f"CPU ({platform.machine()})"


if __name__ == "__main__":
    main()
