"""Host time of a speculative decode step against a plain one, on the CPU.

    python bench/spec_host_overhead.py [--batches 1 4 32] [--depths 1 3] [--output-len 64]
        [--profile-batch 32 --profile-depth 1 --profile-top 25]

With asynchronous scheduling on a GPU, a step's host work (scheduling, drafting, building the
inputs and the index tensors, queueing the forward and the sampling, reading the previous step back
and accepting its tokens) overlaps the device's step only while it is shorter than that step;
a speculative step that costs the host more than a plain one loses what its drafts gained. This
script measures that host work on a tiny model (shardinfer.testing's tiny qwen3 shape) run on the
CPU with asynchronous scheduling forced on, so the engine takes its GPU path (input fixups,
device-side acceptance) with the CPU reference kernels.

Per step it reports the engine thread's time (process CPU time, which other processes on a shared
machine disturb less than the wall clock; the CPU kernels run on one thread), the time spent inside the model (forward and logits) and the
token choice (the sampler's kernel and its noise), which stand in for the device's work, and the
difference: the host time. Configurations: plain decoding on an engine without a drafter, plain
decoding through a drafting engine at depth 0 (what bench/spec_decode.py's plain points run), and
the replay drafter (alpha 0.8, as bench/spec_decode.py) and prompt lookup at each depth.
CPU host time is a proxy for what a speculative step adds to the host's share, never a GPU speed:
a CPU op costs its compute where a GPU launch costs a few microseconds.

--profile-batch B adds a cProfile of one replay run at that batch and --profile-depth (0: plain),
printing the functions with the most time of their own and the most cumulative time.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.workloads import SHAPES, requests
from shardinfer import LLM, SamplingParams
from shardinfer.engine import sampler
from shardinfer.engine.draft_budget import DraftBudget
from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.kernels import ops
from shardinfer.testing.replay_drafter import ReplayProposer
from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint


class DeviceClock:
    """Seconds spent in the calls that stand in for device work, added up while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.depth = 0  # > 0 while inside a stand-in call
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: Any, name: str) -> None:
        original = getattr(owner, name)
        had_own = name in vars(owner) if not isinstance(owner, type) else True

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.process_time()
            self.depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self.depth -= 1
                self.seconds += time.process_time() - t

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, original) if had_own else delattr(owner, name))

    def install(self, engine: LLMEngine) -> None:
        model = engine.runner.model
        self.wrap(model, "forward")
        self.wrap(model, "compute_logits")
        self.wrap(ops, "sample_with_logprobs")
        self.wrap(sampler, "gumbel_noise")

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()


class OpCounter(TorchDispatchMode):
    """Counts the torch operators the engine itself runs (outside the model and the token choice):
    on a GPU each is a kernel launch or a copy, the host cost a CPU run understates."""

    def __init__(self, clock: DeviceClock) -> None:
        super().__init__()
        self.clock = clock
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not self.clock.depth:
            self.ops += 1
        return func(*args, **(kwargs or {}))


def run(
    engine: LLMEngine, reqs: list[tuple[list[int], int]], clock: DeviceClock, counter: OpCounter | None = None
) -> dict[str, float]:
    """Generate every request; returns the decode steps, their wall and device-stand-in seconds,
    and with `counter` the engine's own torch operators (the counting slows the run)."""
    for i, (ids, out) in enumerate(reqs):
        engine.add_request(
            f"r{i}", ids, SamplingParams(temperature=1.0, max_tokens=out, ignore_eos=True, seed=1000 + i)
        )
    # Prefill first, untimed: the points compare decode steps.
    while engine.scheduler.waiting or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running
    ):
        engine.step()
    steps = engine.counters["steps"]
    clock.seconds = 0.0
    clock.install(engine)
    start = time.process_time()
    with counter if counter is not None else contextlib.nullcontext():
        while engine.has_unfinished():
            engine.step()
    wall = time.process_time() - start
    clock.remove()
    return {
        "steps": engine.counters["steps"] - steps,
        "wall_s": wall,
        "device_s": clock.seconds,
        "ops": counter.ops if counter is not None else 0,
    }


def build(model_dir: Path, batch: int, depth: int, drafting: bool, max_len: int) -> LLMEngine:
    kwargs: dict[str, Any] = dict(
        device="cpu", dtype="float32", async_scheduling=True, max_num_seqs=batch, max_model_len=max_len
    )
    if drafting:
        kwargs.update(speculative="ngram", speculative_depth=max(1, depth), speculative_budget="fixed")
    return LLM(model_dir, **kwargs).llm_engine


def set_drafter(engine: LLMEngine, depth: int, proposer: Any) -> None:
    drafter = engine.drafter
    assert drafter is not None
    drafter.depth = depth
    drafter.budget = DraftBudget(depth, None, None)
    drafter.proposer = proposer


def recorded_outputs(engine: LLMEngine, reqs: list[tuple[list[int], int]]) -> dict[str, list[int]]:
    """The plain run's continuations, for the replay drafter."""
    outs: dict[str, list[int]] = {}
    for i, (ids, out) in enumerate(reqs):
        engine.add_request(
            f"r{i}", ids, SamplingParams(temperature=1.0, max_tokens=out, ignore_eos=True, seed=1000 + i)
        )
    while engine.has_unfinished():
        for o in engine.step():
            outs[o.request_id] = list(o.outputs[0].token_ids)
    return outs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 32])
    ap.add_argument("--depths", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--alpha", type=float, default=0.8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="runs per point; the fastest counts")
    ap.add_argument("--profile-batch", type=int, default=None)
    ap.add_argument("--profile-depth", type=int, default=1)
    ap.add_argument("--profile-top", type=int, default=25)
    args = ap.parse_args()
    torch.set_num_threads(1)
    shape = dict(SHAPES["tiny"])
    shape.pop("family")
    vocab = shape["vocab_size"]
    max_len = args.prompt_len + args.output_len + 16
    clock = DeviceClock()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_checkpoint(Path(tmp), "qwen3", **shape)
        print(
            f"{'batch':>5} {'config':<18} {'steps':>5} {'wall ms/step':>12} {'model+sample':>12} "
            f"{'host ms/step':>12} {'host us/req':>11} {'ops/step':>8}"
        )
        for batch in args.batches:
            reqs = requests(
                batch,
                vocab,
                (args.prompt_len, args.prompt_len),
                (args.output_len, args.output_len),
                seed=batch,
            )
            plain_engine = build(model_dir, batch, 0, False, max_len)
            engine = build(model_dir, batch, max(args.depths), True, max_len)
            assert engine.drafter is not None
            lookup = engine.drafter.proposer  # the engine's prompt-lookup drafter
            set_drafter(engine, 0, lookup)
            recorded = recorded_outputs(engine, reqs)
            configs: list[tuple[str, LLMEngine, int, Any]] = [
                ("plain (no drafter)", plain_engine, 0, None),
                ("plain (depth 0)", engine, 0, lookup),
            ]
            for depth in args.depths:
                configs.append(
                    (
                        f"replay depth {depth}",
                        engine,
                        depth,
                        ReplayProposer(recorded, args.alpha, vocab, seed=batch),
                    )
                )
                configs.append((f"ngram depth {depth}", engine, depth, lookup))
            for name, eng, depth, proposer in configs:
                best: dict[str, float] | None = None
                for _ in range(args.repeats):
                    if eng.drafter is not None:
                        set_drafter(eng, depth, proposer)
                    got = run(eng, reqs, clock)
                    if best is None or got["wall_s"] - got["device_s"] < best["wall_s"] - best["device_s"]:
                        best = got
                assert best is not None
                if eng.drafter is not None:
                    set_drafter(eng, depth, proposer)
                counted = run(eng, reqs, clock, OpCounter(clock))
                steps = max(1.0, best["steps"])
                wall, dev = best["wall_s"] * 1e3 / steps, best["device_s"] * 1e3 / steps
                print(
                    f"{batch:>5} {name:<18} {int(steps):>5} {wall:>12.2f} {dev:>12.2f} {wall - dev:>12.2f} "
                    f"{(wall - dev) * 1e3 / batch:>11.0f} {counted['ops'] / max(1.0, counted['steps']):>8.0f}",
                    flush=True,
                )
            if batch == args.profile_batch:
                set_drafter(
                    engine,
                    args.profile_depth,
                    ReplayProposer(recorded, args.alpha, vocab, seed=batch) if args.profile_depth else lookup,
                )
                prof = cProfile.Profile()
                prof.enable()
                run(engine, reqs, clock)
                prof.disable()
                stats = pstats.Stats(prof)
                # The engine's own functions and the drafter's; the model and kernels are the
                # device's stand-ins, already counted apart in the table.
                own = r"shardinfer/(engine/[a-z_]+\.py|testing/)"
                stats.sort_stats("tottime").print_stats(own, args.profile_top)
                stats.sort_stats("cumulative").print_stats(own, args.profile_top)


if __name__ == "__main__":
    main()
