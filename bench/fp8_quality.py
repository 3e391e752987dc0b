"""What FP8 costs in quality: each FP8 option against the model-dtype run, on the bundled demo model.

    python bench/fp8_quality.py [--model examples/models/tiny-dsv3-demo] [--device cpu|cuda]
                                [--dtype bfloat16] [--out bench/results]

For each option (FP8 weights, FP8 KV cache, both) and the baseline (the checkpoint's weights and a
KV cache in the engine dtype, --dtype), in one invocation on one commit (plus the same run in
float32, which shows how far the baseline's own rounding moves the numbers):
  - teacher-forced over the demo model's held-out windows (metrics.json `ci.ppl_windows`, the
    bundled subset of its held-out text): each position's log-probability of the true next token
    and its top-1 token; mean and max |logprob difference| against the baseline, top-1 agreement
    with the baseline, and perplexity;
  - greedy exact-match accuracy on the 50 held-out chat tasks (metrics.json `ci.tasks`).
Prints a table and writes bench/results/fp8-quality-<stamp>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.workloads import bench_commit
from shardinfer import LLM, SamplingParams

DEMO = Path(__file__).resolve().parent.parent / "examples" / "models" / "tiny-dsv3-demo"
OPTIONS = {  # name: (quantization, kv_cache_dtype, dtype: None = --dtype)
    "baseline": ("none", "auto", None),
    "fp8 weights": ("fp8", "auto", None),
    "fp8 kv cache": ("none", "fp8", None),
    "fp8 weights + kv": ("fp8", "fp8", None),
    # The same weights computed in float32: how far the baseline's own rounding moves the numbers.
    "float32 engine": ("none", "auto", "float32"),
}


def teacher_forced(llm: LLM, windows: list[list[int]]) -> tuple[list[float], list[int]]:
    """(logprob of each true next token, the top-1 token there), over every window's positions."""
    outs = llm.generate(windows, SamplingParams(max_tokens=1, prompt_logprobs=1), use_tqdm=False)
    logprobs: list[float] = []
    top1: list[int] = []
    for o in outs:
        logprobs += [float(lp) for lp in o.prompt_logprobs[1:]]
        top1 += [int(top[0][0]) for top in o.prompt_top_logprobs[1:]]
    return logprobs, top1


def task_accuracy(llm: LLM, tasks: list[dict[str, Any]]) -> float:
    convs = [[{"role": "user", "content": t["prompt"]}] for t in tasks]
    outs = llm.chat(convs, SamplingParams(temperature=0.0, max_tokens=48), use_tqdm=False)
    return sum(o.outputs[0].text.strip() == t["answer"] for o, t in zip(outs, tasks, strict=True)) / len(
        tasks
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(DEMO))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    metrics = json.loads((Path(args.model) / "metrics.json").read_text())
    windows, tasks = metrics["ci"]["ppl_windows"], metrics["ci"]["tasks"]
    rows: dict[str, dict[str, Any]] = {}
    base_lp: list[float] = []
    base_top: list[int] = []
    for name, (quantization, kv, dtype) in OPTIONS.items():
        if dtype == args.dtype:
            continue
        llm = LLM(
            args.model,
            device=args.device,
            dtype=dtype or args.dtype,
            quantization=quantization,
            kv_cache_dtype=kv,
        )
        lp, top = teacher_forced(llm, windows)
        if name == "baseline":
            base_lp, base_top = lp, top
        diffs = [abs(a - b) for a, b in zip(lp, base_lp, strict=True)]
        rows[name] = {
            "quantization": quantization,
            "kv_cache_dtype": kv,
            "dtype": dtype or args.dtype,
            "positions": len(lp),
            "perplexity": math.exp(-sum(lp) / len(lp)),
            "mean_abs_logprob_diff": sum(diffs) / len(diffs),
            "max_abs_logprob_diff": max(diffs),
            "top1_agreement": sum(a == b for a, b in zip(top, base_top, strict=True)) / len(top),
            "task_accuracy": task_accuracy(llm, tasks),
        }
        del llm
    now = dt.datetime.now(dt.UTC)
    result = {
        "bench": "fp8_quality",
        "model": Path(args.model).name,
        "device": args.device,
        "dtype": args.dtype,
        "commit": bench_commit(),
        "date": now.isoformat(),
        "tasks": len(tasks),
        "options": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"fp8-quality-{now.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(result, indent=2))
    print(
        f"| option | mean abs dlogprob | max abs dlogprob | top-1 agreement | perplexity | tasks ({len(tasks)}) |"
    )
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['mean_abs_logprob_diff']:.4f} | {r['max_abs_logprob_diff']:.4f} | "
            f"{r['top1_agreement']:.2%} | {r['perplexity']:.3f} | {r['task_accuracy']:.0%} |"
        )
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
