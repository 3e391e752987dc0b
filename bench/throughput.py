"""Side-by-side throughput: shardinfer and transformers on one checkpoint and request list.

    python bench/throughput.py --workload dense-small [--requests 1024] [--hf-requests 64]
                               [--batch-invariant on|off] [--quantization fp8] [--kv-cache-dtype fp8]
                               [--baseline] [--compare-unfused] [--variant-fp8-tiling FIELD=VALUE,...]
                               [--variant-flags MODULE.NAME=VALUE,...] [--variant-settings NAME=VALUE,...]
                               [--out bench/results]

Prints output tok/s of each and the ratio; for the decode phase, the step time against the HBM
floor (weights + KV of the running batch / measured copy bandwidth; FP8 weights and KV count one
byte per value, plus their scales). With --quantization fp8 it also measures, in the same run, the
device's FP8 matmul ceiling (torch._scaled_mm) and the engine's FP8 GEMM at a prefill size
against it. Writes
bench/results/<workload>-<stamp>.json (the format of docs/performance.md); `python bench/record.py` then rebuilds
bench/RESULTS.md from all of them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.gpu_timing import StepBytes, copy_bandwidth, decode_bytes, fp8_gemm_rates, gpu_probe
from bench.record import variant_changes
from bench.slow_steps import SlowStepSampler, summary_lines
from bench.workloads import SHAPES, add_step_limit_args, bench_commit, build_checkpoint, requests
from shardinfer import LLM, SamplingParams
from shardinfer.kernels import fp8_matmul, matmul

KV_SAMPLE_EVERY = 4


def run_shardinfer(
    model_dir: Path, reqs: list[tuple[list[int], int]], args: argparse.Namespace
) -> dict[str, Any]:
    probe = gpu_probe()  # before this engine takes the free memory for its cache
    llm = LLM(
        model_dir,
        device="cuda",
        dtype="bfloat16",
        batch_invariant=args.batch_invariant == "on",
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        admission_batch=args.admission_batch,
        quantization=None if args.quantization == "auto" else args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        async_scheduling={"auto": None, "on": True, "off": False}[args.async_scheduling],
    )
    engine = llm.llm_engine
    params = [
        SamplingParams(
            temperature=1.0,
            max_tokens=out,
            ignore_eos=True,
            seed=i,
            logprobs=getattr(args, "logprobs", 0) or None,
        )
        for i, (_, out) in enumerate(reqs)
    ]
    warm = [SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, seed=1)] * 4
    llm.generate([r[0] for r in reqs[:4]], warm)
    for i, ((ids, _), p) in enumerate(zip(reqs, params, strict=True)):
        engine.add_request(f"r{i}", ids, p)
    # GPU idle time between steps: an event before and after each launch; the device time from one
    # step's end event to the next step's start event is time it waited for the host.
    marks: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    launch = engine._launch

    def timed_launch(batch: Any, previous: Any) -> Any:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launched = launch(batch, previous)
        end.record()
        marks.append((start, end))
        return launched

    engine._launch = timed_launch  # type: ignore[method-assign]
    # The engine thread's only wait on the device is reading a launched step's tokens back: the
    # time it spends there is time the host was ahead of the GPU. Near zero: the GPU waited for the
    # host instead (a host-bound run), which the idle time between launches does not see when the
    # wait falls inside a launch (the batch built before its forward is queued).
    read_back = engine.outputs.read_back
    read_back_s = 0.0

    def timed_read_back(step: Any) -> Any:
        nonlocal read_back_s
        s = time.perf_counter()
        accepted = read_back(step)
        read_back_s += time.perf_counter() - s
        return accepted

    engine.outputs.read_back = timed_read_back  # type: ignore[method-assign]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out_tokens = 0
    # (batch size, seconds, kv tokens or -1): the batch's context is summed on every
    # KV_SAMPLE_EVERY-th graphed step only, as that pass over the running requests is host time
    # between the steps being timed.
    decode_steps: list[tuple[int, float, int]] = []
    step_ms: list[float] = []  # every step's wall, in order (kept with --keep-step-times)
    busy = 0.0
    graphed_s = eager_s = 0.0
    graphed_n = eager_n = 0
    sampler = SlowStepSampler()
    while engine.has_unfinished():
        s = time.perf_counter()
        sampler.begin(graphed_n + eager_n)
        for out in engine.step():
            out_tokens += len(out.outputs[0].token_ids)
        sampler.end()
        step_s = time.perf_counter() - s
        busy += step_s
        step_ms.append(round(step_s * 1e3, 2))
        if engine.runner.last_step_graphed:
            graphed_s, graphed_n = graphed_s + step_s, graphed_n + 1
            running = engine.scheduler.running
            kv = sum(r.num_tokens for r in running) if (graphed_n - 1) % KV_SAMPLE_EVERY == 0 else -1
            decode_steps.append((len(running), step_s, kv))
        else:
            eager_s, eager_n = eager_s + step_s, eager_n + 1
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    slow_step_stacks = sampler.close()
    engine._launch = launch  # type: ignore[method-assign]
    engine.outputs.read_back = read_back  # type: ignore[method-assign]
    idle_ms = sum(max(0.0, marks[i][1].elapsed_time(marks[i + 1][0])) for i in range(len(marks) - 1))
    stats = engine.stats()
    step_bytes = decode_bytes(engine)
    return {
        "output_tok_s": out_tokens / wall,
        "wall_s": wall,
        "output_tokens": out_tokens,
        "steps": stats["steps"],
        "preemptions": stats["preemptions"],
        "max_num_seqs": engine.scheduler.max_num_seqs,  # in effect: given, or the engine's choice
        "kv_cache_tokens": engine.runner.kv_cache_tokens,
        "prefix_cache_hit_rate": stats["prefix_cache_hit_rate"],
        "host_gap_s": wall - busy,
        "decode_steps": decode_steps,
        "gpu_idle_between_steps_s": idle_ms / 1e3,
        "read_back_wait_s": read_back_s,
        "async_scheduling": engine.async_scheduling,
        "graphed_steps": graphed_n,
        "graphed_s": graphed_s,
        "eager_steps": eager_n,
        "eager_s": eager_s,
        "weight_bytes": step_bytes.dense + step_bytes.experts,
        "kv_bytes_per_token": step_bytes.kv_per_token,
        "step_bytes": dataclasses.asdict(step_bytes),
        "slow_step_stacks": slow_step_stacks,
        "gpu_probe_before": probe,
        **({"step_ms": step_ms} if getattr(args, "keep_step_times", False) else {}),
    }


def run_transformers(model_dir: Path, reqs: list[tuple[list[int], int]], out_len: int) -> dict[str, Any]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    gc = transformers.GenerationConfig(
        max_new_tokens=out_len, min_new_tokens=out_len, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    inputs = [ids for ids, _ in reqs]
    try:
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = model.generate_batch(inputs=inputs, generation_config=gc)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
        n = sum(len(v.generated_tokens) for v in out.values())
        mode = "generate_batch"
        if n == 0:  # it logs per-request failures instead of raising
            raise RuntimeError("generate_batch returned no tokens")
    except Exception as exc:  # MLA models: its paged cache assumes equal K/V head dims (docs/performance.md)
        print(f"generate_batch failed ({type(exc).__name__}: {exc}); using static generate", flush=True)
        t, n = time.perf_counter(), 0
        for i in range(0, len(inputs), 64):
            chunk = inputs[i : i + 64]
            width = max(map(len, chunk))
            ids = torch.tensor([[0] * (width - len(c)) + c for c in chunk], device="cuda")
            mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in chunk], device="cuda")
            with torch.no_grad():
                g = model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
            n += (g.shape[1] - width) * len(chunk)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
        mode = "static generate, batches of 64"
    del model
    torch.cuda.empty_cache()
    return {"output_tok_s": n / wall, "wall_s": wall, "output_tokens": n, "mode": mode}


def _fp8_shapes(workload: str) -> set[tuple[int, int]]:
    """The (N, K) problems of the workload's projections, and fp8_gemm_rates' prefill problem."""
    from bench.kernels.bench_matmul import MODELS

    shape = SHAPES[workload]
    shapes = set(MODELS[{"dense-8b": "8b", "dense-small": "0.6b"}.get(workload, workload)][1].values())
    shapes.add((2 * int(shape["intermediate_size"]), int(shape["hidden_size"])))
    return shapes


def _override_tilings(workload: str, change: dict[str, Any]) -> None:
    """Override every tiling of the workload's FP8 projection shapes with `change` applied to it."""
    from shardinfer.kernels.tuning import Tiling

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    for n, k in _fp8_shapes(workload):
        t = fp8_matmul.tiling(n, k, gpu)  # what the run would use: the GPU's measured tilings, if any
        fp8_matmul.CONFIG_OVERRIDES[(n, k)] = Tiling(
            dataclasses.replace(t.rest, **change),
            tuple((m, dataclasses.replace(c, **change)) for m, c in t.by_m),
        )


def prefer_tma_tilings(workload: str) -> None:
    """Override the FP8 tilings of the workload's projection shapes with their TMA variants."""
    _override_tilings(workload, {"tma": True})


def parse_tiling_change(text: str) -> dict[str, Any]:
    """Parse "split_k=1,num_stages=3" -> {"split_k": 1, "num_stages": 3}, checked
    against Fp8TileConfig's fields so a typo fails before any run."""
    import ast

    fields = {f.name for f in dataclasses.fields(fp8_matmul.Fp8TileConfig)}
    change: dict[str, Any] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep or name.strip() not in fields:
            raise SystemExit(
                f"--variant-fp8-tiling: {item!r} is not FIELD=VALUE with FIELD one of {sorted(fields)}"
            )
        change[name.strip()] = ast.literal_eval(value.strip())
    return change


@contextlib.contextmanager
def changed_tilings(workload: str, change: dict[str, Any]) -> Iterator[None]:
    """Every tiling of the workload's FP8 projection shapes with `change` applied, for the block."""
    saved = dict(fp8_matmul.CONFIG_OVERRIDES)
    _override_tilings(workload, change)
    try:
        yield
    finally:
        fp8_matmul.CONFIG_OVERRIDES.clear()
        fp8_matmul.CONFIG_OVERRIDES.update(saved)


def parse_flags(text: str) -> dict[tuple[str, str], Any]:
    """Parse "kernels.paged_attention.FP8_NUM_STAGES=2" -> {("shardinfer.kernels.paged_attention",
    "FP8_NUM_STAGES"): 2}; the module must exist and already define the name."""
    import ast
    import importlib

    flags: dict[tuple[str, str], Any] = {}
    for item in text.split(","):
        path, sep, value = item.partition("=")
        module, _, name = path.strip().rpartition(".")
        if not sep or not module:
            raise SystemExit(f"--variant-flags: {item!r} is not MODULE.NAME=VALUE")
        full = f"shardinfer.{module}"
        if not hasattr(importlib.import_module(full), name):
            raise SystemExit(f"--variant-flags: {full} has no setting {name!r}")
        flags[(full, name)] = ast.literal_eval(value.strip())
    return flags


# The engine's settings, and `logprobs` (every request's SamplingParams.logprobs, as a job's
# `sampling.logprobs` asks: the top-k logprobs of each token; 0 in the main run unless --logprobs).
ENGINE_SETTINGS = ("max_num_seqs", "max_num_batched_tokens", "admission_batch", "logprobs")


def parse_settings(text: str) -> dict[str, int]:
    """Parse "max_num_seqs=512" -> {"max_num_seqs": 512}: engine settings of the same-call variant run,
    checked so a typo fails before any run."""
    settings: dict[str, int] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in ENGINE_SETTINGS or not value.strip().isdigit() or int(value) < 1:
            raise SystemExit(
                f"--variant-settings: {item!r} is not NAME=POSITIVE_INT with NAME one of "
                f"{list(ENGINE_SETTINGS)}"
            )
        settings[name] = int(value)
    return settings


@contextlib.contextmanager
def changed_flags(flags: dict[tuple[str, str], Any]) -> Iterator[None]:
    """Module-level settings changed for the block, restored after."""
    import importlib

    saved = {(m, n): getattr(importlib.import_module(m), n) for m, n in flags}
    for (m, n), value in flags.items():
        setattr(importlib.import_module(m), n, value)
    try:
        yield
    finally:
        for (m, n), value in saved.items():
            setattr(importlib.import_module(m), n, value)


def _decode_summary(
    steps: list[tuple[int, float, int]], run: dict[str, Any], bw: float
) -> tuple[float | None, dict[str, Any] | None]:
    """(floor fraction, summary) of the decode steps at the largest steady batch: every step reads
    its weights (the experts its rows touch) and the batch's KV."""
    if not steps:
        return None, None
    top = max(b for b, _, _ in steps)
    chosen = [(s, kv) for b, s, kv in steps if b >= 0.9 * top]
    med_s = sorted(s for s, _ in chosen)[len(chosen) // 2]
    sampled_kv = sorted(kv for _, kv in chosen if kv >= 0)
    if not sampled_kv:  # no sampled step at the top batches: those of the largest sampled batch
        widest = max(b for b, _, kv in steps if kv >= 0)
        sampled_kv = sorted(kv for b, _, kv in steps if kv >= 0 and b == widest)
    med_kv = sampled_kv[len(sampled_kv) // 2]
    floor_s = StepBytes(**run["step_bytes"]).floor_s(top, med_kv, bw)
    return floor_s / med_s, {
        "batch": top,
        "median_step_ms": med_s * 1e3,
        "floor_ms": floor_s * 1e3,
        "kv_tokens": med_kv,
        "n_steps": len(chosen),
    }


def _same_call_run(run: dict[str, Any], bw: float) -> dict[str, Any]:
    """What a JSON keeps of a second run in the same call (a variant, the main run repeated): with
    the GPU's idle time between steps and the cache, to tell a host-bound run from a slower GPU."""
    names = (
        "output_tok_s",
        "wall_s",
        "eager_s",
        "graphed_s",
        "gpu_idle_between_steps_s",
        "host_gap_s",
        "read_back_wait_s",
    )
    kept = {k: run[k] for k in (*names, "kv_cache_tokens", "max_num_seqs", "preemptions", "gpu_probe_before")}
    if "step_ms" in run:
        kept["step_ms"] = run["step_ms"]
    return {**kept, "decode": _decode_summary(run.pop("decode_steps"), run, bw)[1]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="dense-small", choices=sorted(SHAPES))
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--in-range", type=int, nargs=2, default=(100, 1024))
    ap.add_argument("--out-range", type=int, nargs=2, default=(100, 1024))
    ap.add_argument(
        "--hf-requests", type=int, default=64, help="requests for the transformers side (0 = skip)"
    )
    ap.add_argument("--hf-out-len", type=int, default=256)
    ap.add_argument("--batch-invariant", default="on", choices=["on", "off"])
    add_step_limit_args(ap)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--admission-batch", type=int, default=None)
    ap.add_argument("--async-scheduling", default="auto", choices=["auto", "on", "off"])
    ap.add_argument(
        "--quantization",
        default="auto",
        choices=["auto", "fp8", "none"],
        help="weights: auto follows the checkpoint (the bench's are bf16), fp8 quantises at load",
    )
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    ap.add_argument(
        "--baseline",
        action="store_true",
        help="also run the checkpoint's own weights and a bf16 KV cache on the same requests in "
        "this invocation (after the main run), so an FP8 gain compares two runs of one commit",
    )
    ap.add_argument(
        "--fp8-tiling",
        default="default",
        choices=["default", "tma"],
        help="tma: the FP8 projections run the TMA variants of their default tilings (the same "
        "tiles and bits, operands through the tensor-memory accelerator); an experiment",
    )
    ap.add_argument(
        "--variant-fp8-tiling",
        default=None,
        metavar="FIELD=VALUE[,FIELD=VALUE]",
        help="a second run in this invocation (result key 'variant') with these Fp8TileConfig "
        "fields changed in every tiling of the workload's FP8 projections (e.g. "
        "split_k=1,num_stages=3), so a launch setting's gain compares two runs "
        "of one commit",
    )
    ap.add_argument(
        "--variant-flags",
        default=None,
        metavar="MODULE.NAME=VALUE[,...]",
        help="the variant run with these module-level settings of shardinfer changed (e.g. "
        "kernels.paged_attention.FP8_NUM_STAGES=2); with --variant-fp8-tiling, both",
    )
    ap.add_argument(
        "--variant-settings",
        default=None,
        metavar="NAME=VALUE[,...]",
        help="the variant run with these engine settings instead (max_num_seqs, "
        "max_num_batched_tokens, admission_batch, or logprobs: every request's top-k "
        "logprobs; e.g. max_num_seqs=512); combines with the other --variant-* options",
    )
    ap.add_argument(
        "--variant-kv-cache-dtype",
        default=None,
        choices=["auto", "fp8"],
        help="the variant run with this KV cache dtype instead (e.g. auto: FP8 weights over a bf16 "
        "cache against the main run's FP8 cache); combines with the other --variant-* options",
    )
    ap.add_argument(
        "--repeat-main",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with a variant: run the main configuration again after it (result key 'main_again') "
        "and print the variant against that repeat. Identical engine runs of one process spread "
        '(docs/performance.md, "Engine runs of one call spread by up to 17%%"); the two main runs '
        "show that spread beside the variant",
    )
    ap.add_argument(
        "--warm-engine-requests",
        type=int,
        default=0,
        help="before the main run, build an engine of the main configuration and run this many of "
        "the requests on it, untimed, then drop it (0: none), so the main run is not the process's "
        'first engine (which did not take the spread of runs away: docs/performance.md, "Engine '
        'runs of one call spread by up to 17%%")',
    )
    ap.add_argument(
        "--keep-step-times",
        action="store_true",
        help="keep every step's wall time, in order, in each run's result (key 'step_ms'): the runs "
        "of one call replay the same schedule, so the series shows where a slow run lost its time",
    )
    ap.add_argument(
        "--logprobs",
        type=int,
        default=0,
        help="every request's SamplingParams.logprobs in the main run (0: none)",
    )
    ap.add_argument(
        "--compare-unfused",
        action="store_true",
        help="also run the same configuration with the fused launches off (an FP8 linear's input "
        "quantised by the linear, the dense prologue op by op; the same bits) in this "
        "invocation, so their gain compares two runs of one commit",
    )
    ap.add_argument("--ckpt-dir", default=str(Path(tempfile.gettempdir()) / "shardinfer-bench"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    if args.warm_engine_requests < 0:
        ap.error(f"--warm-engine-requests: got {args.warm_engine_requests}, need 0 (none) or more requests")
    if args.fp8_tiling == "tma":
        if args.quantization != "fp8":
            ap.error("--fp8-tiling tma: only FP8 weights have FP8 tilings; add --quantization fp8")
        prefer_tma_tilings(args.workload)
    tiling_change = parse_tiling_change(args.variant_fp8_tiling) if args.variant_fp8_tiling else None
    if tiling_change is not None and args.quantization != "fp8":
        ap.error("--variant-fp8-tiling: only FP8 weights have FP8 tilings; add --quantization fp8")
    flag_change = parse_flags(args.variant_flags) if args.variant_flags else None
    settings_change: dict[str, object] | None = (
        dict(parse_settings(args.variant_settings)) if args.variant_settings else None
    )

    shape = SHAPES[args.workload]
    model_dir = build_checkpoint(args.workload, Path(args.ckpt_dir) / args.workload)
    reqs = requests(args.requests, shape["vocab_size"], tuple(args.in_range), tuple(args.out_range))
    bw = copy_bandwidth()
    fp8_gemm = fp8_gemm_rates(shape, args.max_num_batched_tokens) if args.quantization == "fp8" else None
    torch.cuda.empty_cache()
    if args.warm_engine_requests > 0:
        from shardinfer.engine.heap import collect_dropped

        run_shardinfer(model_dir, reqs[: args.warm_engine_requests], args)
        collect_dropped()  # the warm engine's weights and KV cache go before the main one sizes its own
        torch.cuda.empty_cache()
    ours = run_shardinfer(model_dir, reqs, args)
    torch.cuda.empty_cache()
    baseline = None
    if args.baseline:
        gc.collect()  # the first engine's graphs and KV cache go before the second sizes its own
        torch.cuda.empty_cache()
        base_args = argparse.Namespace(**{**vars(args), "quantization": "auto", "kv_cache_dtype": "auto"})
        base = run_shardinfer(model_dir, reqs, base_args)
        baseline = {
            k: base[k]
            for k in (
                "output_tok_s",
                "wall_s",
                "output_tokens",
                "steps",
                "weight_bytes",
                "kv_bytes_per_token",
                "step_bytes",
                "graphed_steps",
                "eager_steps",
            )
        }
        baseline.update(quantization="auto", kv_cache_dtype="auto")
        gc.collect()
        torch.cuda.empty_cache()
    unfused = None
    if args.compare_unfused:
        from shardinfer.engine.models import dense, layers

        gc.collect()
        torch.cuda.empty_cache()
        layers.FUSE_FP8_INPUT, dense.FUSED_PROLOGUE = False, False
        try:
            plain = run_shardinfer(model_dir, reqs, args)
        finally:
            layers.FUSE_FP8_INPUT, dense.FUSED_PROLOGUE = True, True
        unfused = {
            "output_tok_s": plain["output_tok_s"],
            "wall_s": plain["wall_s"],
            "decode": _decode_summary(plain.pop("decode_steps"), plain, bw)[1],
        }
        gc.collect()
        torch.cuda.empty_cache()
    variant = None
    if args.variant_kv_cache_dtype is not None:
        settings_change = {**(settings_change or {}), "kv_cache_dtype": args.variant_kv_cache_dtype}
    if tiling_change is not None or flag_change is not None or settings_change is not None:
        gc.collect()
        torch.cuda.empty_cache()
        with changed_tilings(args.workload, tiling_change or {}), changed_flags(flag_change or {}):
            other = run_shardinfer(
                model_dir, reqs, argparse.Namespace(**{**vars(args), **(settings_change or {})})
            )
        variant = {
            "fp8_tiling": args.variant_fp8_tiling,
            "flags": args.variant_flags,
            "settings": args.variant_settings,
            "kv_cache_dtype": args.variant_kv_cache_dtype,
            **_same_call_run(other, bw),
        }
        gc.collect()
        torch.cuda.empty_cache()
    main_again = None
    if variant is not None and args.repeat_main:
        again = run_shardinfer(model_dir, reqs, args)
        main_again = _same_call_run(again, bw)
        gc.collect()
        torch.cuda.empty_cache()
    hf = None
    if args.hf_requests:
        from shardinfer.engine.heap import collect_dropped

        # The engines above froze their start-up objects out of the collector's view (engine/heap.py):
        # a plain gc.collect() leaves their weights and KV caches allocated, and the transformers
        # model then ran out of memory on dense-8b. Only the next engine's build used to free them.
        collect_dropped()
        torch.cuda.empty_cache()
        hf_reqs = requests(args.hf_requests, shape["vocab_size"], tuple(args.in_range), (1, 1), seed=1)
        try:
            hf = run_transformers(model_dir, hf_reqs, args.hf_out_len)
        except Exception as exc:  # keep our own measurement when the other side cannot run at all
            print(
                f"transformers side failed ({type(exc).__name__}: {exc}); recording shardinfer only",
                flush=True,
            )
            torch.cuda.empty_cache()
    floor_frac, decode_summary = _decode_summary(ours.pop("decode_steps"), ours, bw)
    commit = bench_commit()
    now = dt.datetime.now(dt.UTC)
    gpu = torch.cuda.get_device_name(0)
    result = {
        "workload": args.workload,
        "gpu": gpu,
        "commit": commit,
        "date": now.isoformat(),
        "batch_invariant": args.batch_invariant == "on",
        "quantization": args.quantization,
        "kv_cache_dtype": args.kv_cache_dtype,
        "fp8_gemm": fp8_gemm,
        "fp8_tiling": args.fp8_tiling,
        # Whether this GPU model has a file of measured bf16 tilings (kernels/bench_matmul.py
        # --write-configs): without one, the bf16 projections and LM heads run the default tilings.
        "bf16_tilings": "measured" if matmul.config_path(gpu).is_file() else "default",
        # The same for the FP8 GEMM's tilings (kernels/bench_fp8_matmul.py --write-configs).
        "fp8_tilings": "measured" if fp8_matmul.config_path(gpu).is_file() else "default",
        "shardinfer_output_tok_s": ours["output_tok_s"],
        "transformers_output_tok_s": hf["output_tok_s"] if hf else None,
        "ratio": ours["output_tok_s"] / hf["output_tok_s"] if hf else None,
        "decode_floor_fraction": floor_frac,
        "decode": decode_summary,
        "copy_bandwidth_GBps": bw / 1e9,
        "requests": args.requests,
        "in_range": args.in_range,
        "out_range": args.out_range,
        "warm_engine_requests": args.warm_engine_requests,
        # The host's CPU threads for torch after the engines' builds (engine/host_threads.py), and
        # OMP_NUM_THREADS where the environment set it.
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "settings": {
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "max_model_len": args.max_model_len,
            "admission_batch": args.admission_batch,
            "logprobs": args.logprobs,
        },
        "shardinfer": ours,
        "transformers": hf,
        "torch": torch.__version__,
        "baseline": baseline,
        "unfused": unfused,
        "variant": variant,
        "main_again": main_again,
        "speedup_over_baseline": ours["output_tok_s"] / baseline["output_tok_s"] if baseline else None,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{args.workload}-{now.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(
        f"{'workload':<12} {'bi':<4} {'weights':<8} {'kv':<5} {'ours tok/s':>11} {'hf tok/s':>9} {'ratio':>7} "
        f"{'decode/floor':>13}"
    )
    print(
        f"{args.workload:<12} {args.batch_invariant:<4} {args.quantization:<8} {args.kv_cache_dtype:<5} "
        f"{ours['output_tok_s']:>11.0f} "
        f"{(hf or {}).get('output_tok_s', float('nan')):>9.0f} {result['ratio'] or float('nan'):>7.1f} "
        f"{floor_frac if floor_frac is not None else float('nan'):>13.2f}"
    )
    if baseline:
        print(
            f"baseline (checkpoint weights, bf16 KV) in the same run: {baseline['output_tok_s']:.0f} tok/s; "
            f"this configuration {result['speedup_over_baseline']:.2f}x"
        )
    if unfused:
        print(
            f"fused launches off, same run: {unfused['output_tok_s']:.0f} tok/s, decode step "
            f"{(unfused['decode'] or {}).get('median_step_ms', float('nan')):.2f} ms against "
            f"{(decode_summary or {}).get('median_step_ms', float('nan')):.2f} ms"
        )
    if variant:
        print(
            f"variant ({variant_changes(variant)}), same run: "
            f"{variant['output_tok_s']:.0f} tok/s (prefill {variant['eager_s']:.2f} s, decode step "
            f"{(variant['decode'] or {}).get('median_step_ms', float('nan')):.2f} ms) against "
            f"{ours['output_tok_s']:.0f} tok/s (prefill {ours['eager_s']:.2f} s, decode step "
            f"{(decode_summary or {}).get('median_step_ms', float('nan')):.2f} ms)"
        )
    if main_again:
        print(
            f"main again, after the variant: {main_again['output_tok_s']:.0f} tok/s (prefill "
            f"{main_again['eager_s']:.2f} s, decode step "
            f"{(main_again['decode'] or {}).get('median_step_ms', float('nan')):.2f} ms)"
        )
    probes = [("main", ours), ("variant", variant), ("main again", main_again)]
    print(
        "GPU probe before each run (copy GB/s, bf16 matmul TFLOP/s) and the seconds the host waited "
        "for the GPU's tokens: "
        + "; ".join(
            f"{name} {r['gpu_probe_before']['copy_GBps']:.0f}, {r['gpu_probe_before']['matmul_TFLOPs']:.0f}, "
            f"{r['read_back_wait_s']:.2f} s"
            for name, r in probes
            if r
        )
    )
    if fp8_gemm:
        print(
            f"fp8 GEMM at M={fp8_gemm['m']}, N={fp8_gemm['n']}, K={fp8_gemm['k']}: {fp8_gemm['ours_tflops']:.0f} "
            f"TFLOP/s = {fp8_gemm['fraction_of_ceiling']:.2f} of torch._scaled_mm's {fp8_gemm['ceiling_tflops']:.0f}"
        )
    for line in summary_lines(ours.get("slow_step_stacks", [])):
        print(line)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
