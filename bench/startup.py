"""An engine's start-up with a cold Triton cache, compiling ahead (engine/precompile.py) or not.

    python bench/startup.py [--workload dense-8b] [--quantization fp8] [--kv-cache-dtype fp8]
                            [--modes cold-off,cold-on,warm-on] [--requests 64] [--prompt-len 512]

Each mode runs in a fresh process: `cold` gives it an empty Triton cache directory, `warm` the
one the previous cold run filled (the same commit's kernels, as a machine's second job finds
them); `on` / `off` sets SHARDINFER_PRECOMPILE. Each process imports shardinfer, builds the engine
(LLM) and generates a first batch: `--requests` prompts of `--prompt-len` random tokens, 16 tokens
each with ignore_eos, enough to fill the first prefill steps and a few graphed decode steps. It
reports the engine's start-up phases, what was compiled ahead, the kernels the first batch still
compiled at their launch, and the seconds from the process's start to the first batch's end.
All modes run in one invocation on one commit.

The result goes to bench/results/startup-<workload>-<stamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workloads import SHAPES, add_step_limit_args, bench_commit, build_checkpoint, requests

MODES = ("cold-off", "cold-on", "warm-off", "warm-on")


def child(args: argparse.Namespace) -> None:
    """One start-up, measured from this process's start; prints its result as the last line."""
    started = time.perf_counter()
    from shardinfer import LLM, SamplingParams

    imported = time.perf_counter()
    llm = LLM(
        args.model_dir,
        device=args.device,
        dtype="bfloat16" if args.device == "cuda" else "float32",
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        quantization=None if args.quantization == "auto" else args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    built = time.perf_counter()
    engine = llm.llm_engine
    late: list[str] = []  # kernels the first batch compiled at their launch: what compiling ahead missed
    if args.device == "cuda":
        from triton import knobs

        def note(*, fn: Any, **_: Any) -> None:
            late.append(fn.name)

        knobs.runtime.jit_cache_hook = note
    prompts = [
        ids for ids, _ in requests(args.requests, args.vocab, (args.prompt_len, args.prompt_len), (16, 16))
    ]
    params = [
        SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=i) for i in range(len(prompts))
    ]
    llm.generate(prompts, params, use_tqdm=False)
    done = time.perf_counter()
    ahead = engine.runner.compiled_ahead
    print(
        "STARTUP "
        + json.dumps(
            {
                "import_s": imported - started,
                "engine_build_s": built - imported,
                "first_batch_s": done - built,
                "total_s": done - started,
                "phases": dict(getattr(engine, "startup_phases", {}) or {}),
                "compiled_in_first_batch": late,
                "compiled_ahead": None
                if ahead is None
                else {"variants": ahead.variants, "workers": ahead.workers, "drain_s": ahead.drain_s},
            }
        )
    )


def run_mode(args: argparse.Namespace, mode: str, model_dir: Path, caches: dict[str, str]) -> dict[str, Any]:
    cache, precompile = mode.split("-")
    if cache == "cold":
        caches[precompile] = tempfile.mkdtemp(prefix="triton-cold-")
        cache_dir = caches[precompile]
    else:  # the cache the same setting's cold run filled, or a fresh one if it did not run
        cache_dir = caches.get(precompile) or caches.setdefault(
            precompile, tempfile.mkdtemp(prefix="triton-")
        )
    env = dict(
        os.environ, TRITON_CACHE_DIR=cache_dir, SHARDINFER_PRECOMPILE="1" if precompile == "on" else "0"
    )
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--model-dir",
        str(model_dir),
        "--vocab",
        str(SHAPES[args.workload]["vocab_size"]),
        *forwarded(args),
    ]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    line = next((ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("STARTUP ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"{mode}: exit {done.returncode}\n{done.stderr[-4000:]}")
    return {"mode": mode, "process_wall_s": wall, **json.loads(line[len("STARTUP ") :])}


def forwarded(args: argparse.Namespace) -> list[str]:
    return [
        "--device",
        args.device,
        "--quantization",
        args.quantization,
        "--kv-cache-dtype",
        args.kv_cache_dtype,
        "--requests",
        str(args.requests),
        "--prompt-len",
        str(args.prompt_len),
        "--max-model-len",
        str(args.max_model_len),
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
    ] + (["--max-num-seqs", str(args.max_num_seqs)] if args.max_num_seqs is not None else [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="dense-small", choices=sorted(SHAPES))
    ap.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="cpu: a smoke run of the bench itself (nothing compiles there)",
    )
    ap.add_argument("--quantization", default="auto", choices=["auto", "fp8", "none"])
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    ap.add_argument(
        "--modes",
        default="cold-off,cold-on,warm-on",
        help=f"comma-separated, run in this order, from {', '.join(MODES)}",
    )
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--max-model-len", type=int, default=4096)
    add_step_limit_args(ap)
    ap.add_argument("--ckpt-dir", default=str(Path(tempfile.gettempdir()) / "shardinfer-bench"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--vocab", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"--modes: unknown {bad}; choose from {', '.join(MODES)}")
    model_dir = build_checkpoint(args.workload, Path(args.ckpt_dir) / args.workload, device=args.device)
    caches: dict[str, str] = {}
    runs = [run_mode(args, m, model_dir, caches) for m in modes]

    import torch

    stamp = datetime.now(UTC)
    result = {
        "bench": "startup",
        "workload": args.workload,
        "commit": bench_commit(),
        "date": stamp.isoformat(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpus": len(os.sched_getaffinity(0)),
        "quantization": args.quantization,
        "kv_cache_dtype": args.kv_cache_dtype,
        "requests": args.requests,
        "prompt_len": args.prompt_len,
        "runs": runs,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"startup-{args.workload}-{stamp.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(
        f"{'mode':<9} {'import':>7} {'build':>7} {'ahead':>7} {'warm-up':>8} {'capture':>8} {'1st batch':>9} "
        f"{'total':>7} {'variants':>8} {'late':>5}"
    )
    for r in runs:
        ph = r["phases"]
        ahead = r["compiled_ahead"] or {}
        print(
            f"{r['mode']:<9} {r['import_s']:7.1f} {r['engine_build_s']:7.1f} {ph.get('precompile_s', 0.0):7.1f} "
            f"{ph.get('warm_up_s', 0.0):8.1f} {ph.get('graph_capture_s', 0.0):8.1f} {r['first_batch_s']:9.1f} "
            f"{r['total_s']:7.1f} {ahead.get('variants', '-'):>8} {len(r['compiled_in_first_batch']):>5}"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
