"""Host cost of an eager (not graphed) engine step: the prefill step that opens every run.

    python bench/eager_step.py --workload moe-16b [--batch 1] [--prompt-len 128] [--repeats 5]

Decode steps replay CUDA graphs, so the host's cost per kernel is paid once at capture; a prefill
step runs the model eagerly, launching every kernel from Python. At small batch that host work can
outlast the device's work for the step, and every run (plain or speculative) pays it once per
prefill. Per repeat this script admits `batch` fresh requests (new random prompts, so no prefix
hits), times the engine.step() call that launches their prefill and the call after it (which
reads the prefill's tokens back), and the device time between the step's first and last
kernel (CUDA events around the call). One more repeat runs under cProfile: the functions with the
most time of their own and the most cumulative time, which say where the host's share goes.

Writes bench/results/eager-<workload>-<stamp>.json.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.spec_decode import add_requests, sync_device
from bench.workloads import SHAPES, bench_commit, build_checkpoint, requests
from shardinfer import LLM


def first_calls(
    llm: LLM, reqs: list[tuple[list[int], int]], profiler: cProfile.Profile | None = None
) -> dict[str, float]:
    """Run the requests to the end; the host ms of the first two step() calls, and (on CUDA) the
    device ms from the first call's start to the end of the work it queued."""
    engine = llm.llm_engine
    add_requests(engine, reqs)
    sync_device()
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start_ev.record()
    t0 = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    engine.step()
    if profiler is not None:
        profiler.disable()
    t1 = time.perf_counter()
    if on_gpu:
        end_ev.record()
    engine.step()
    t2 = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    sync_device()
    found = {"first_call_ms": (t1 - t0) * 1000, "second_call_ms": (t2 - t1) * 1000}
    if on_gpu:
        found["first_call_device_span_ms"] = start_ev.elapsed_time(end_ev)
    return found


def top_functions(stats: pstats.Stats, key: str, n: int) -> list[dict[str, Any]]:
    """The n functions with the largest `key` ("tottime" or "cumtime"), in ms, with call counts."""
    rows = []
    for (path, line, name), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        short = "/".join(Path(path).parts[-3:]) if path != "~" else "builtin"
        rows.append(
            {
                "function": f"{short}:{line} {name}",
                "calls": calls,
                "tottime_ms": tottime * 1000,
                "cumtime_ms": cumtime * 1000,
            }
        )
    return sorted(rows, key=lambda r: -r[f"{key}_ms"])[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="moe-16b", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of the script (--workload tiny)")
    ap.add_argument("--ckpt-dir", default=str(Path(tempfile.gettempdir()) / "shardinfer-bench"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    for flag, value in (
        ("--batch", args.batch),
        ("--prompt-len", args.prompt_len),
        ("--output-len", args.output_len),
        ("--repeats", args.repeats),
    ):
        if value < 1:
            ap.error(f"{flag} {value}: give at least 1")
    shape = SHAPES[args.workload]
    model_dir = build_checkpoint(args.workload, Path(args.ckpt_dir) / args.workload, args.device)
    llm = LLM(
        model_dir,
        device=args.device,
        dtype="bfloat16" if args.device == "cuda" else "float32",
        max_num_seqs=max(args.batch, 8),
        max_num_batched_tokens=16384,
        max_model_len=args.prompt_len + args.output_len + 16,
    )
    vocab = shape["vocab_size"]

    def fresh(seed: int) -> list[tuple[list[int], int]]:
        return requests(
            args.batch,
            vocab,
            (args.prompt_len, args.prompt_len),
            (args.output_len, args.output_len),
            seed=seed,
        )

    first_calls(llm, fresh(10_000))  # compiles and first-shape work out of the timing
    timed = [first_calls(llm, fresh(10_001 + r)) for r in range(args.repeats)]
    profiler = cProfile.Profile()
    profiled = first_calls(llm, fresh(20_000), profiler)
    stats = pstats.Stats(profiler)
    median = {k: sorted(t[k] for t in timed)[len(timed) // 2] for k in timed[0]}
    now = dt.datetime.now(dt.UTC)
    result = {
        "workload": args.workload,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "commit": bench_commit(),
        "date": now.isoformat(),
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "timed": timed,
        "median": median,
        "profiled_call": profiled,
        "by_own_time": top_functions(stats, "tottime", args.top),
        "by_cumulative_time": top_functions(stats, "cumtime", args.top),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"eager-{args.workload}-{now.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print("median over repeats: " + ", ".join(f"{k} {v:.2f}" for k, v in median.items()))
    for title, key in (("own time", "tottime"), ("cumulative time", "cumtime")):
        print(f"profiled first call, by {title} (ms, calls):")
        for row in result["by_own_time" if key == "tottime" else "by_cumulative_time"][: args.top]:
            print(f"  {row[key + '_ms']:8.2f} {row['calls']:6d}  {row['function'][:100]}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
