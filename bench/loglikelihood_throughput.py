"""Loglikelihood throughput: shardinfer's lm-evaluation-harness model beside the harness's own `hf`
model, in one run, on one checkpoint and one request list (a 4-choice task, 512-token contexts).

    python bench/loglikelihood_throughput.py --workload dense-8b [--docs 512] [--hf-docs 64]
                                             [--context-tokens 512] [--choices 4] [--out bench/results]

Both sides get the same token-level requests through the harness's `_loglikelihood_tokens` (the
path `loglikelihood` takes after tokenising), so the comparison is the scoring alone. Reports
continuations scored per second and tokens per second (context + continuation tokens of the
requests, and the scored tokens alone), the prefix-cache hit rate of shardinfer's engine, and
the largest logprob difference on the requests both sides scored. Writes
bench/results/loglikelihood-<workload>-<stamp>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.workloads import SHAPES, add_step_limit_args, bench_commit, build_checkpoint

Request = tuple[None, list[int], list[int]]


def make_requests(
    docs: int, context_tokens: int, choices: int, choice_range: tuple[int, int], vocab: int, seed: int = 0
) -> list[Request]:
    """`choices` continuations after each of `docs` random contexts, in the harness's order (a
    document's choices next to each other)."""
    rng = random.Random(seed)
    out: list[Request] = []
    for _ in range(docs):
        context = [rng.randrange(2, vocab) for _ in range(context_tokens)]
        for _ in range(choices):
            out.append((None, context, [rng.randrange(2, vocab) for _ in range(rng.randint(*choice_range))]))
    return out


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(name: str, lm: Any, reqs: list[Request]) -> tuple[dict[str, Any], list[tuple[float, bool]]]:
    lm._loglikelihood_tokens(reqs[: min(8, len(reqs))], disable_tqdm=True)  # warm-up: graphs, tilings
    sync()
    t0 = time.perf_counter()
    answers = lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    sync()
    wall = time.perf_counter() - t0
    tokens = sum(len(c) + len(x) for _, c, x in reqs)
    scored = sum(len(x) for _, _, x in reqs)
    stats = {
        "wall_s": wall,
        "continuations": len(reqs),
        "continuations_per_s": len(reqs) / wall,
        "input_tokens_per_s": tokens / wall,
        "scored_tokens_per_s": scored / wall,
    }
    print(
        f"{name:<12} {len(reqs):>6} continuations in {wall:8.2f} s: {stats['continuations_per_s']:9.1f}/s, "
        f"{stats['input_tokens_per_s']:10.0f} tok/s"
    )
    return stats, answers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="dense-8b", choices=sorted(SHAPES))
    ap.add_argument("--docs", type=int, default=512, help="documents (contexts) for shardinfer")
    ap.add_argument(
        "--hf-docs", type=int, default=64, help="the first N documents for the hf model (0 = skip)"
    )
    ap.add_argument("--hf-batch-size", type=int, default=16)
    ap.add_argument("--context-tokens", type=int, default=512)
    ap.add_argument("--choices", type=int, default=4)
    ap.add_argument("--choice-tokens", type=int, nargs=2, default=(2, 12), help="continuation length range")
    ap.add_argument("--batch-invariant", choices=["on", "off"], default="on")
    add_step_limit_args(ap)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run on the tiny workload")
    ap.add_argument("--checkpoint-dir", default=None, help="reuse or build the random checkpoint here")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    import transformers
    from lm_eval.models.huggingface import HFLM

    from shardinfer.integrations.lm_eval import ShardinferLM

    shape = SHAPES[args.workload]
    model_dir = build_checkpoint(
        args.workload, Path(args.checkpoint_dir or tempfile.mkdtemp()) / args.workload, device=args.device
    )
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    reqs = make_requests(
        args.docs, args.context_tokens, args.choices, tuple(args.choice_tokens), shape["vocab_size"]
    )
    ours_lm = ShardinferLM(
        str(model_dir),
        device=args.device,
        dtype=dtype,
        batch_invariant=args.batch_invariant == "on",
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.context_tokens + args.choice_tokens[1] + 8,
    )
    ours, ours_answers = timed("shardinfer", ours_lm, reqs)
    ours["prefix_cache_hit_rate"] = ours_lm.engine.stats()["prefix_cache_hit_rate"]
    del ours_lm
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    hf = None
    max_diff = None
    if args.hf_docs:
        tok = transformers.PreTrainedTokenizerFast(
            tokenizer_file=str(model_dir / "tokenizer.json"),
            bos_token="<|bos|>",
            eos_token="<|eos|>",
            pad_token="<|eos|>",
        )
        hf_lm = HFLM(
            pretrained=str(model_dir),
            tokenizer=tok,
            dtype=dtype,
            device=args.device,
            batch_size=args.hf_batch_size,
            max_length=args.context_tokens + args.choice_tokens[1] + 8,
        )
        hf_reqs = reqs[: args.hf_docs * args.choices]
        hf, hf_answers = timed("hf", hf_lm, hf_reqs)
        max_diff = max(abs(a[0] - b[0]) for a, b in zip(ours_answers, hf_answers, strict=False))
    now = dt.datetime.now(dt.UTC)
    result = {
        "bench": "loglikelihood",
        "date": now.isoformat(),
        "commit": bench_commit(),
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "workload": args.workload,
        "batch_invariant": args.batch_invariant,
        "docs": args.docs,
        "hf_docs": args.hf_docs,
        "context_tokens": args.context_tokens,
        "choices": args.choices,
        "choice_tokens": list(args.choice_tokens),
        "hf_batch_size": args.hf_batch_size,
        "shardinfer": ours,
        "hf": hf,
        "continuations_per_s_ratio": ours["continuations_per_s"] / hf["continuations_per_s"] if hf else None,
        "max_abs_logprob_diff": max_diff,
        "torch": torch.__version__,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"loglikelihood-{args.workload}-{now.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(
        f"ratio (continuations/s) {result['continuations_per_s_ratio']}; max |dlogprob| {max_diff}; wrote {path}"
    )
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
