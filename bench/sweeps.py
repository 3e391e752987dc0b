"""docs/performance.md's `decode` and `prefill` workloads for one model shape.

    python bench/sweeps.py --workload dense-small [--batches 1 8 32 128 256 512] [--batch-invariant on|off]
                           [--quantization fp8] [--kv-cache-dtype fp8]

decode: B requests of 512 prompt tokens, 256 output tokens each, all admitted at once; the median
step time of the steady decode phase (graph-replayed steps with all B running) against the HBM
floor (weights + the batch's KV over the measured copy bandwidth).
prefill: 256 requests of 2048 tokens, 1 output token; prompt tokens/s and achieved TFLOP/s
(2 * active params * tokens, attention excluded) against the measured bf16 matmul rate.
With --quantization fp8 the weights are FP8 (the floor counts their bytes and scales) and prefill's
achieved rate is set against the measured FP8 matmul rate instead of the bf16 one.
Writes bench/results/<decode|prefill>-<workload>-<stamp>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.gpu_timing import copy_bandwidth, decode_bytes, fp8_matmul_rate, matmul_rate
from bench.workloads import SHAPES, bench_commit, build_checkpoint, requests
from shardinfer import LLM, SamplingParams


def decode_point(
    llm: LLM, batch: int, vocab: int, bw: float, profile_to: Path | None = None
) -> dict[str, Any]:
    """One batch size; with profile_to, also a kernel profile of 8 steady steps written there."""
    engine = llm.llm_engine
    reqs = requests(batch, vocab, (512, 512), (256, 256), seed=batch)
    for i, (ids, out) in enumerate(reqs):
        engine.add_request(
            f"d{batch}-{i}", ids, SamplingParams(temperature=1.0, max_tokens=out, ignore_eos=True, seed=i)
        )
    times: list[float] = []
    kv: list[int] = []
    profiler = None
    while engine.has_unfinished():
        if profile_to is not None and len(times) == 64 and profiler is None:
            profiler = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            )
            profiler.__enter__()
        s = time.perf_counter()
        engine.step()
        dt_s = time.perf_counter() - s
        running = engine.scheduler.running
        if engine.runner.last_step_graphed and len(running) == batch:
            times.append(dt_s)
            kv.append(sum(r.num_tokens for r in running))
        if profiler is not None and profile_to is not None and len(times) == 72:
            torch.cuda.synchronize()
            profiler.__exit__(None, None, None)
            table = profiler.key_averages().table(sort_by="cuda_time_total", row_limit=40)
            profile_to.write_text(table)
            print(table[:6000])
            profiler, profile_to = None, None
    step_bytes = decode_bytes(engine)
    times_sorted = sorted(times)
    med = times_sorted[len(times) // 2] if times else float("nan")
    med_kv = sorted(kv)[len(kv) // 2] if kv else 0
    floor = step_bytes.floor_s(batch, med_kv, bw)
    return {
        "batch": batch,
        "median_step_ms": med * 1e3,
        "floor_ms": floor * 1e3,
        "floor_fraction": floor / med if times else None,
        "steps_measured": len(times),
        "output_tok_s": batch / med if times else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="dense-small", choices=sorted(SHAPES))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128, 256, 512])
    ap.add_argument("--batch-invariant", default="on", choices=["on", "off"])
    ap.add_argument("--skip-prefill", action="store_true")
    ap.add_argument(
        "--quantization",
        default="auto",
        choices=["auto", "fp8", "none"],
        help="auto: as the checkpoint says; fp8: quantise a bf16 checkpoint at load",
    )
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    ap.add_argument("--profile-prefill", action="store_true", help="kernel profile of 32 prompts' prefill")
    ap.add_argument(
        "--profile-batch", type=int, default=None, help="kernel profile of 8 steady steps at this batch"
    )
    ap.add_argument("--ckpt-dir", default=str(Path(tempfile.gettempdir()) / "shardinfer-bench"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    shape = SHAPES[args.workload]
    model_dir = build_checkpoint(args.workload, Path(args.ckpt_dir) / args.workload)
    bw = copy_bandwidth()
    numerics: dict[str, Any] = {
        "quantization": None if args.quantization == "auto" else args.quantization,
        "kv_cache_dtype": args.kv_cache_dtype,
    }
    llm = LLM(
        model_dir,
        device="cuda",
        dtype="bfloat16",
        batch_invariant=args.batch_invariant == "on",
        max_num_seqs=max(args.batches),
        max_num_batched_tokens=16384,
        max_model_len=1024,
        **numerics,
    )
    now = dt.datetime.now(dt.UTC)
    common = {
        "gpu": torch.cuda.get_device_name(0),
        "commit": bench_commit(),
        "date": now.isoformat(),
        "batch_invariant": args.batch_invariant == "on",
        "copy_bandwidth_GBps": bw / 1e9,
        "torch": torch.__version__,
        "quantization": args.quantization,
        "kv_cache_dtype": args.kv_cache_dtype,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = now.strftime("%Y%m%d-%H%M%S")
    points = [
        decode_point(
            llm,
            b,
            shape["vocab_size"],
            bw,
            out_dir / f"profile-{args.workload}-b{b}-{stamp}.txt" if b == args.profile_batch else None,
        )
        for b in args.batches
    ]
    print(f"{'batch':>6} {'step ms':>9} {'floor ms':>9} {'floor frac':>10} {'tok/s':>9}")
    for p in points:
        print(
            f"{p['batch']:>6} {p['median_step_ms']:>9.2f} {p['floor_ms']:>9.2f} "
            f"{p['floor_fraction'] or float('nan'):>10.2f} {p['output_tok_s'] or float('nan'):>9.0f}"
        )
    decode = {
        "workload": f"decode-{args.workload}",
        **common,
        "points": points,
        "shardinfer_output_tok_s": max((p["output_tok_s"] or 0) for p in points),
        "transformers_output_tok_s": None,
        "decode_floor_fraction": next((p["floor_fraction"] for p in points if p["batch"] == 256), None),
    }
    (out_dir / f"decode-{args.workload}-{stamp}.json").write_text(json.dumps(decode, indent=2))
    if args.skip_prefill:
        return
    rate = fp8_matmul_rate() if args.quantization == "fp8" else matmul_rate()
    reqs = requests(256, shape["vocab_size"], (2048, 2048), (1, 1), seed=9)
    # Free the decode engine first: llm2 sizes its KV cache from the memory the device has free.
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    llm2 = LLM(
        model_dir,
        device="cuda",
        dtype="bfloat16",
        batch_invariant=args.batch_invariant == "on",
        max_num_seqs=256,
        max_num_batched_tokens=16384,
        max_model_len=4096,
        enable_prefix_caching=False,
        **numerics,
    )
    torch.cuda.synchronize()
    t = time.perf_counter()
    llm2.generate([ids for ids, _ in reqs], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    torch.cuda.synchronize()
    wall = time.perf_counter() - t
    if args.profile_prefill:  # a second, profiled pass over the first 32 prompts (timing above is clean)
        prompts = [[(t + 1) % shape["vocab_size"] for t in ids] for ids, _ in reqs[:32]]
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        ) as prof:
            llm2.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
        (out_dir / f"profile-prefill-{args.workload}-{stamp}.txt").write_text(table)
        print(table[:5000])
    model = llm2.llm_engine.model
    params = sum(p.numel() for p in model.parameters())
    # Routed experts: only top-k of E run per token.
    routed = sum(p.numel() for n, p in model.named_parameters() if n.endswith(("w_gate_up", "w_down")))
    hf = llm2.llm_engine.model_config.hf
    if routed and hf.get("n_routed_experts"):
        params -= int(routed * (1 - hf["num_experts_per_tok"] / hf["n_routed_experts"]))
    tokens = 256 * 2048
    flops = 2 * params * tokens
    prefill = {
        "workload": f"prefill-{args.workload}",
        **common,
        "prompt_tok_s": tokens / wall,
        "wall_s": wall,
        "achieved_TFLOPs": flops / wall / 1e12,
        "matmul_TFLOPs": rate / 1e12,
        "fraction_of_matmul_rate": flops / wall / rate,
        "params": params,
        "note": "FLOPs = 2 * active parameters * tokens (attention excluded; MoE: top-k of the routed "
        "experts); matmul_TFLOPs is the FP8 rate (torch._scaled_mm) with --quantization fp8",
    }
    print(
        f"prefill: {tokens / wall:.0f} prompt tok/s, {flops / wall / 1e12:.0f} TFLOP/s "
        f"of {rate / 1e12:.0f} measured ({flops / wall / rate:.0%})"
    )
    (out_dir / f"prefill-{args.workload}-{stamp}.json").write_text(json.dumps(prefill, indent=2))


if __name__ == "__main__":
    main()
