"""Speculative decoding against plain decoding on one model shape, in the same run.

    python bench/spec_decode.py --workload dense-8b|moe-16b [--batches 1 4 16 32 64 256]
        [--alphas 0.6 0.8 0.9] [--depths 1 2 3] [--prompt-len 128] [--output-len 128]

Weights are random, so no real drafter is accepted often enough to say anything; the replay
drafter (shardinfer/testing/replay_drafter.py) proposes the plain run's own continuation with each
draft token replaced by a wrong one with probability 1 - alpha, which makes the acceptance rate a
dial while the engine does all a real drafter's work (asynchronous scheduling, verify graphs).
Per batch size B: B requests of prompt-len random tokens, output-len sampled tokens each (T = 1,
seeded), all admitted at once; plain decoding first (the recording), then each (alpha, depth).
Output tok/s counts the whole generate call (prefill included) for both. `identical` says whether
the speculative outputs equal the plain ones token for token and logprob for logprob.

`--workload demo` measures real drafters instead: the bundled trained demo model
(examples/models/tiny-dsv3-demo) on generated chat tasks, plain against prompt lookup and against
its MTP layer (chained for depth > 1), with the acceptance by draft position.

Writes bench/results/spec-<workload>-<stamp>.json and, where matplotlib is installed, a PNG of
speedup against batch per alpha. --max-seconds stops starting new points once the run has used
that much time (the points done so far are written).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import step_gaps
from bench.gpu_timing import copy_bandwidth, decode_bytes
from bench.workloads import SHAPES, bench_commit, build_checkpoint, requests
from shardinfer import LLM, SamplingParams
from shardinfer.engine.draft_budget import DraftBudget
from shardinfer.engine.drafting import Drafter
from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.engine.outputs import RequestOutput
from shardinfer.testing.replay_drafter import ReplayProposer


def sync_device() -> None:
    """Wait for the GPU's queued work (nothing on a CPU run)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def add_requests(engine: LLMEngine, reqs: list[tuple[list[int], int]]) -> None:
    """Admit every request as r0, r1, ...: T = 1, seeded, exactly its output length."""
    for i, (ids, out) in enumerate(reqs):
        engine.add_request(
            f"r{i}", ids, SamplingParams(temperature=1.0, max_tokens=out, ignore_eos=True, seed=1000 + i)
        )


def draft_fixed(drafter: Drafter, depth: int, proposer: ReplayProposer | None = None) -> None:
    """Draft `depth` tokens a step (0: plain decoding), with no schedule; from `proposer` if given."""
    drafter.depth = depth
    drafter.budget = DraftBudget(depth, None, None)
    if proposer is not None:
        drafter.proposer = proposer


def run_batch(
    llm: LLM, reqs: list[tuple[list[int], int]], tag: str
) -> tuple[float, dict[str, RequestOutput], list[float]]:
    """Generate every request (ids r0, r1, ...) and return (wall seconds, outputs by id, host
    milliseconds of each engine.step() call). With asynchronous scheduling a call returns once the
    previous step's results are back, so in steady decoding it tracks the device's step time, and
    the calls around the prefill show what a run spends outside its steady steps."""
    engine = llm.llm_engine
    add_requests(engine, reqs)
    sync_device()
    start = time.perf_counter()
    done: dict[str, RequestOutput] = {}
    step_ms: list[float] = []
    last = start
    while engine.has_unfinished():
        for o in engine.step():
            done[o.request_id] = o
        now = time.perf_counter()
        step_ms.append((now - last) * 1000)
        last = now
    sync_device()
    wall = time.perf_counter() - start
    print(f"  {tag}: {wall:.2f} s", flush=True)
    return wall, done, step_ms


def step_times(step_ms: list[float], head: int = 4) -> dict[str, Any]:
    """The first `head` step calls' host milliseconds, the median of the rest, and the time the run
    spent beyond (number of calls x that median): its cost outside steady steps."""
    rest = sorted(step_ms[head:])
    median = rest[len(rest) // 2] if rest else float("nan")
    return {
        "first_steps_ms": [round(t, 3) for t in step_ms[:head]],
        "median_step_ms": round(median, 3),
        "beyond_steady_ms": round(sum(step_ms) - median * len(step_ms), 3) if rest else None,
    }


def profile_steps(
    llm: LLM,
    reqs: list[tuple[list[int], int]],
    recorded: dict[str, list[int]],
    vocab: int,
    batch: int,
    depths: list[int],
) -> dict[str, Any]:
    """Per depth (0 = plain): device milliseconds per engine step, by kernel, over one run (alpha 1.0, so
    every step verifies its full width). What a verify step costs beyond a plain one, and where. (On a
    CPU, a smoke test: host operator time instead.)"""
    from torch.profiler import ProfilerActivity, profile

    engine = llm.llm_engine
    drafter = engine.drafter
    assert drafter is not None
    found: dict[str, Any] = {}
    for depth in depths:
        draft_fixed(drafter, depth, ReplayProposer(recorded, 1.0, vocab, seed=batch))
        steps_before = engine.stats()["steps"]
        on_gpu = torch.cuda.is_available()
        with profile(activities=[ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU]) as prof:
            run_batch(llm, reqs, f"batch {batch} profiled (depth {depth})")
        steps = engine.stats()["steps"] - steps_before
        by_kernel: dict[str, float] = {}
        for ev in prof.key_averages():
            us = ev.self_device_time_total if on_gpu else ev.self_cpu_time_total
            if us > 0:
                by_kernel[ev.key[:90]] = us / 1000 / steps
        top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:15]
        total = sum(by_kernel.values())
        print(f"  batch {batch} depth {depth}: {total:.2f} device ms/step over {steps} steps; top kernels:")
        for name, ms in top[:8]:
            print(f"    {ms:8.3f} ms  {name}")
        found[str(depth)] = {
            "steps": steps,
            "device_ms_per_step": total,
            "top_kernels_ms_per_step": dict(top),
        }
    return found


def trace_steps(
    llm: LLM,
    reqs: list[tuple[list[int], int]],
    recorded: dict[str, list[int]],
    vocab: int,
    batch: int,
    depths: list[int],
    out_dir: Path,
    skip: int = 8,
    window: int = 12,
) -> dict[str, Any]:
    """Per depth (0 = plain; alpha 1.0): where the device waits for the host in steady decoding.
    After `skip` steps (prefill, first verify steps), `window` steps under torch.profiler with CPU
    and CUDA activities give the device's busy and idle time per step; the next `window` steps,
    traced again with Python stacks, say which engine function the host was in during the idle
    gaps (bench/step_gaps.py; the Python tracer slows the host, so that pass's idle time is not
    the step's). Both traces are written to out_dir as gzipped Chrome traces. Requests too short
    for both windows give shorter ones (each summary counts the steps it traced)."""
    from torch.profiler import ProfilerActivity, profile

    engine = llm.llm_engine
    drafter = engine.drafter
    assert drafter is not None
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    found: dict[str, Any] = {}
    for depth in depths:
        draft_fixed(drafter, depth, ReplayProposer(recorded, 1.0, vocab, seed=batch))
        add_requests(engine, reqs)
        for _ in range(skip):
            engine.step()
        passes: dict[str, Any] = {}
        for name, with_stack in (("timing", False), ("stacks", True)):
            sync_device()
            with profile(activities=activities, with_stack=with_stack) as prof:
                traced = 0
                while traced < window and engine.has_unfinished():  # decoding steps only
                    engine.step()
                    traced += 1
                sync_device()
            trace = out_dir / f"timeline-b{batch}-d{depth}-{name}.json"
            prof.export_chrome_trace(str(trace))
            events = json.loads(trace.read_text())["traceEvents"]
            with gzip.open(f"{trace}.gz", "wt") as f:
                json.dump(events, f)
            trace.unlink()
            passes[name] = step_gaps.summarize(events, traced)
        while engine.has_unfinished():
            engine.step()
        timing, stacks = passes["timing"], passes["stacks"]
        print(
            f"  batch {batch} depth {depth}: device busy {timing['device_busy_ms_per_step']:.2f} ms, idle "
            f"{timing['device_idle_ms_per_step']:.2f} ms per step ({timing['gaps_per_step']:.1f} gaps)"
        )
        for label, part in (("timing pass", timing), ("with stacks", stacks)):
            print(f"    idle charged to ({label}, ms/step):")
            for host_event, ms in list(part["host_during_gaps"].items())[:8]:
                print(f"      {ms:7.3f}  {host_event[:110]}")
        found[str(depth)] = passes
    return found


def same(a: dict[str, RequestOutput], b: dict[str, RequestOutput]) -> bool:
    return (
        all(
            a[k].outputs[0].token_ids == b[k].outputs[0].token_ids
            and a[k].outputs[0].logprobs == b[k].outputs[0].logprobs
            for k in a
        )
        and a.keys() == b.keys()
    )


DEMO = Path(__file__).resolve().parent.parent / "examples" / "models" / "tiny-dsv3-demo"


def demo_chats(n: int) -> list[list[dict[str, str]]]:
    """n chat tasks of the kinds the demo model was trained on (arithmetic, reversal, sorting, JSON)."""
    import random

    rng = random.Random(0)
    words = ["zebra", "anchor", "kitten", "maple", "orbit", "lantern", "quartz", "willow", "ember", "harbor"]
    names = ["Vera", "Omar", "Lena", "Tariq", "Mina", "Jonas"]
    cities = ["Lima", "Oslo", "Quito", "Pune", "Perth", "Graz"]
    tasks = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            text = f"What is {rng.randint(100, 9999)} + {rng.randint(10, 999)}?"
        elif kind == 1:
            text = "Reverse the letters: " + " ".join(rng.choice(words))
        elif kind == 2:
            text = "Sort these words alphabetically: " + " ".join(rng.sample(words, 4))
        else:
            text = (
                f"Extract name, age and city as JSON: {rng.choice(names)}, {rng.randint(18, 90)}, "
                f"lives in {rng.choice(cities)}."
            )
        tasks.append([{"role": "user", "content": text}])
    return tasks


def _timed_chat(
    chats: list[list[dict[str, str]]], params: list[SamplingParams], llm: LLM
) -> tuple[float, list[Any]]:
    """Seconds of a second chat call over the tasks (the first compiles and warms the graphs), and its outputs."""
    llm.chat(chats, params, use_tqdm=False)
    sync_device()
    t = time.perf_counter()
    outs = llm.chat(chats, params, use_tqdm=False)
    sync_device()
    return time.perf_counter() - t, outs


def demo_points(device: str, batches: list[int], depths: list[int]) -> list[dict[str, Any]]:
    """Real drafters on the demo model: (drafter, depth, batch, temperature) points."""
    dtype = "bfloat16" if device == "cuda" else "float32"
    points: list[dict[str, Any]] = []
    for batch in batches:
        chats = demo_chats(batch)
        for temperature in (0.0, 0.8):
            params = [SamplingParams(temperature=temperature, max_tokens=96, seed=i) for i in range(batch)]

            plain_wall, plain = _timed_chat(
                chats, params, LLM(DEMO, device=device, dtype=dtype, max_num_seqs=max(batches))
            )
            tokens = sum(len(o.outputs[0].token_ids) for o in plain)
            for drafter in ("ngram", "mtp"):
                for depth in depths:
                    llm = LLM(
                        DEMO,
                        device=device,
                        dtype=dtype,
                        max_num_seqs=max(batches),
                        speculative=drafter,
                        speculative_depth=depth,
                        speculative_budget="fixed",
                    )
                    before = llm.llm_engine.stats()
                    wall, outs = _timed_chat(chats, params, llm)
                    st = llm.llm_engine.stats()
                    point = {
                        "drafter": drafter,
                        "depth": depth,
                        "batch": batch,
                        "temperature": temperature,
                        "plain_tok_s": tokens / plain_wall,
                        "spec_tok_s": tokens / wall,
                        "identical": [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]
                        == [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in plain],
                        "acceptance_rate": st.get("draft_acceptance_rate"),
                        "acceptance_by_position": [
                            st.get(f"draft_acceptance_p{j}") for j in range(1, depth + 1)
                        ],
                        "steps": st["steps"] - before["steps"],
                    }
                    print(
                        f"  demo batch {batch} T={temperature} {drafter} depth {depth}: "
                        f"{point['spec_tok_s'] / point['plain_tok_s']:.2f}x, accept {point['acceptance_by_position']}",
                        flush=True,
                    )
                    points.append(point)
    return points


def plot(points: list[dict[str, Any]], path: Path, title: str) -> bool:
    """Speedup against batch, one line per (alpha, depth); False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for alpha, depth in sorted({(p["alpha"], p["depth"]) for p in points}):
        pts = sorted(
            (p["batch"], p["spec_tok_s"] / p["plain_tok_s"])
            for p in points
            if p["alpha"] == alpha and p["depth"] == depth
        )
        ax.plot([b for b, _ in pts], [s for _, s in pts], marker="o", label=f"alpha {alpha}, depth {depth}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch (requests decoding together)")
    ax.set_ylabel("speculative / plain output tok/s")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="dense-8b", choices=[*sorted(SHAPES), "demo"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 32, 64, 256])
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.6, 0.8, 0.9])
    ap.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of the script (--workload tiny)")
    ap.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.8,
        help="KV budget share; verify graphs of every width keep their logits, so leave room",
    )
    ap.add_argument("--no-schedule", action="store_true", help="skip the confidence-scheduled points")
    ap.add_argument("--max-seconds", type=float, default=float("inf"))
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="time each batch's plain run and points this many times (each point records its repeat)",
    )
    ap.add_argument(
        "--profile-batches",
        type=int,
        nargs="*",
        default=[],
        help="at these batch sizes, one more run per depth under the torch profiler: device time "
        "per step split by kernel (written to the JSON, the top kernels printed)",
    )
    ap.add_argument(
        "--timeline-batches",
        type=int,
        nargs="*",
        default=[],
        help="at these batch sizes, traces of steady decoding per depth: the device's idle time per "
        "step and the host work it waited for (bench/step_gaps.py; traces written beside the JSON)",
    )
    ap.add_argument(
        "--timeline-skip",
        type=int,
        default=8,
        help="engine steps run before a timeline's traced window (0: the window starts at the prefill)",
    )
    ap.add_argument("--ckpt-dir", default=str(Path(tempfile.gettempdir()) / "shardinfer-bench"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    if min(args.depths) < 1:
        ap.error(f"--depths {args.depths}: every depth must be >= 1 (plain decoding always runs beside them)")
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: give at least 1")
    if args.timeline_skip < 0:
        ap.error(f"--timeline-skip {args.timeline_skip}: give 0 or more steps")
    for flag, chosen in (
        ("--profile-batches", args.profile_batches),
        ("--timeline-batches", args.timeline_batches),
    ):
        if missing := sorted(set(chosen) - set(args.batches)):
            ap.error(f"{flag} {missing}: not among --batches {args.batches}; add them there")
    begin = time.perf_counter()
    now = dt.datetime.now(dt.UTC)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    if args.workload == "demo":
        demo = {
            "workload": "demo",
            "gpu": gpu,
            "commit": bench_commit(),
            "date": now.isoformat(),
            "points": demo_points(args.device, args.batches, args.depths),
        }
        path = out_dir / f"spec-demo-{now.strftime('%Y%m%d-%H%M%S')}.json"
        path.write_text(json.dumps(demo, indent=2))
        print(f"wrote {path}")
        return
    shape = SHAPES[args.workload]
    model_dir = build_checkpoint(args.workload, Path(args.ckpt_dir) / args.workload, args.device)
    # Measured before the engine takes its KV budget (the copy needs 4 GiB of free memory).
    bandwidth = copy_bandwidth() if args.device == "cuda" else None
    # One engine for everything: graphs for verify widths up to 1 + max depth; the drafter's depth
    # is set per point (depth 0 = plain decoding, the width-1 graphs).
    llm = LLM(
        model_dir,
        device=args.device,
        dtype="bfloat16" if args.device == "cuda" else "float32",
        max_num_seqs=max(args.batches),
        max_num_batched_tokens=16384,
        max_model_len=args.prompt_len + args.output_len + 16,
        speculative="ngram",
        speculative_depth=max(args.depths),
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    engine = llm.llm_engine
    drafter = engine.drafter
    assert drafter is not None
    schedule = drafter.budget  # the engine's, with the verify graphs' measured step times
    if not schedule.scheduled:
        print("no step-time table (no CUDA graphs): scheduled points use the fixed depth")
    vocab = shape["vocab_size"]
    step_bytes = decode_bytes(engine)
    print(f"engine ready after {time.perf_counter() - begin:.0f} s", flush=True)
    points: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    timelines: dict[str, Any] = {}
    for batch in args.batches:
        if time.perf_counter() - begin > args.max_seconds:
            print(f"time budget spent: batch {batch} and later skipped")
            break
        reqs = requests(
            batch, vocab, (args.prompt_len, args.prompt_len), (args.output_len, args.output_len), seed=batch
        )
        tokens = batch * args.output_len
        draft_fixed(drafter, 0)
        run_batch(llm, reqs, f"batch {batch} warm-up (plain)")  # first-shape compiles out of the timing
        plain_before = engine.stats()["steps"]
        plain_wall, plain, plain_ms = run_batch(llm, reqs, f"batch {batch} plain")
        plain_times = step_times(plain_ms)
        plain_steps = engine.stats()["steps"] - plain_before
        # A step's HBM floor at the mean context (every request is mid-way through its output on
        # average); over a run, tokens / (its steps x that floor) is what the run could reach if
        # each step only read its bytes: plain decoding's ceiling, and speculation's at the
        # tokens per step it achieved.
        context = batch * (args.prompt_len + args.output_len // 2)
        plain_floor = step_bytes.floor_s(batch, context, bandwidth) if bandwidth is not None else None
        recorded = {k: list(o.outputs[0].token_ids) for k, o in plain.items()}
        # Every verify width meets its own eager shapes (prefill tails, the acceptance kernels) the
        # first time it runs at this batch: one untimed pass per depth keeps Triton's compiles out
        # of the points, as the plain warm-up above does for plain decoding.
        for depth in sorted(set(args.depths)):
            draft_fixed(drafter, depth, ReplayProposer(recorded, args.alphas[0], vocab, seed=batch))
            run_batch(llm, reqs, f"batch {batch} warm-up (depth {depth})")
        if batch in args.profile_batches:
            profiles[str(batch)] = profile_steps(
                llm, reqs, recorded, vocab, batch, sorted(set([0, *args.depths]))
            )
        if batch in args.timeline_batches:
            timelines[str(batch)] = trace_steps(
                llm, reqs, recorded, vocab, batch, sorted(set([0, *args.depths])), out_dir, args.timeline_skip
            )
        for repeat in range(args.repeats):
            if repeat:  # plain decoding timed again beside each repetition of the points
                draft_fixed(drafter, 0)
                plain_wall, again, plain_ms = run_batch(llm, reqs, f"batch {batch} plain (repeat {repeat})")
                plain_times = step_times(plain_ms)
                assert same(plain, again), "plain decoding changed between repetitions"
            for alpha in args.alphas:
                # Fixed depths, then (unless --no-schedule) the confidence schedule up to the largest.
                settings = [(d, False) for d in args.depths] + (
                    [] if args.no_schedule else [(max(args.depths), True)]
                )
                for depth, scheduled in settings:
                    if time.perf_counter() - begin > args.max_seconds:
                        break
                    draft_fixed(drafter, depth, ReplayProposer(recorded, alpha, vocab, seed=batch))
                    if scheduled:
                        # A fresh budget per point: the schedule learns this alpha's acceptance from
                        # its prior. The step times it measured carry over (one engine on one GPU, as
                        # in a long job), so each (width, bucket) is explored once, not once per point.
                        drafter.budget = DraftBudget(depth, schedule.step_ms, schedule.buckets)
                        drafter.budget.times = schedule.times
                    before = engine.stats()
                    depth_before = (engine.counters["draft_depth_sum"], engine.counters["draft_depth_steps"])
                    label = "scheduled up to" if scheduled else "depth"
                    wall, got, spec_ms = run_batch(llm, reqs, f"batch {batch} alpha {alpha} {label} {depth}")
                    spec_times = step_times(spec_ms)
                    after = engine.stats()
                    drafted = after["draft_tokens"] - before["draft_tokens"]
                    accepted = after["accepted_draft_tokens"] - before["accepted_draft_tokens"]
                    steps = after["steps"] - before["steps"]
                    # A verify step computes each request's newest token and its drafts: with experts,
                    # the draft rows touch more of them than a plain step's rows.
                    spec_rows = round(batch + drafted / max(1, steps))
                    spec_floor = (
                        step_bytes.floor_s(spec_rows, context, bandwidth) if bandwidth is not None else None
                    )
                    points.append(
                        {
                            "batch": batch,
                            "repeat": repeat,
                            "alpha": alpha,
                            "depth": depth,
                            "scheduled": scheduled,
                            "plain_tok_s": tokens / plain_wall,
                            "spec_tok_s": tokens / wall,
                            "identical": same(plain, got),
                            "acceptance": accepted / drafted if drafted else None,
                            "mean_depth": (engine.counters["draft_depth_sum"] - depth_before[0])
                            / max(1.0, engine.counters["draft_depth_steps"] - depth_before[1]),
                            "steps": steps,
                            "graphed_verify_steps": after["graphed_verify_steps"]
                            - before["graphed_verify_steps"],
                            "plain_steps": plain_steps,
                            "plain_step_times": plain_times,
                            "spec_step_times": spec_times,
                            "plain_floor_tok_s": tokens / (plain_steps * plain_floor)
                            if plain_floor
                            else None,
                            "spec_floor_tok_s": tokens / (steps * spec_floor) if spec_floor else None,
                        }
                    )
    now = dt.datetime.now(dt.UTC)
    stamp = now.strftime("%Y%m%d-%H%M%S")
    result = {
        "workload": args.workload,
        "gpu": gpu,
        "commit": bench_commit(),
        "date": now.isoformat(),
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "drafter": "replay",
        "copy_bandwidth_GBps": bandwidth / 1e9 if bandwidth is not None else None,
        "weight_bytes": step_bytes.dense + step_bytes.experts,
        "kv_bytes_per_token": step_bytes.kv_per_token,
        "step_bytes": dataclasses.asdict(step_bytes),
        "points": points,
    }
    if profiles:
        result["kernel_profiles"] = profiles
    if timelines:
        result["step_timelines"] = timelines
    path = out_dir / f"spec-{args.workload}-{stamp}.json"
    path.write_text(json.dumps(result, indent=2))
    print(
        f"{'batch':>6} {'alpha':>6} {'depth':>6} {'plain tok/s':>12} {'spec tok/s':>11} {'speedup':>8} "
        f"{'accept':>7} {'identical':>9} {'sched':>5} {'mean k':>6}"
    )
    for p in points:
        acc = p["acceptance"] if p["acceptance"] is not None else float("nan")
        print(
            f"{p['batch']:>6} {p['alpha']:>6} {p['depth']:>6} {p['plain_tok_s']:>12.0f} {p['spec_tok_s']:>11.0f} "
            f"{p['spec_tok_s'] / p['plain_tok_s']:>8.2f} {acc:>7.2f} {p['identical']!s:>9} {p['scheduled']!s:>5} {p['mean_depth']:>6.2f}"
        )
    png = path.with_suffix(".png")
    if plot(points, png, f"{args.workload} on {result['gpu']}"):
        print(f"wrote {path} and {png}")
    else:
        print(f"wrote {path} (no plot: matplotlib is not installed)")


if __name__ == "__main__":
    main()
