"""End to end: what grammar-constrained decoding adds to a decode step of the engine.

    python bench/structured_decode.py --workload dense-small --requests 256     # a GPU
    python bench/structured_decode.py --workload tiny --requests 16             # CPU smoke run
        [--max-tokens 128] [--tokenizer-vocab V] [--independent-matchers [auto|on|off]] [--mask-threads N] [--templates K]
        [--async-scheduling auto|on|off] [--max-num-seqs 256] [--out bench/results]

Runs N requests constrained by the JSON Schema of bench/structured_masks.py, then the same N
requests unconstrained, each with ignore_eos and max_tokens set to the number of tokens its
constrained twin produced: both runs compute the same tokens per request, so their decode steps
have the same batch sizes, and the only difference is the grammar (masks filled on the host,
applied before sampling, matchers advanced after it). One difference remains: under asynchronous
scheduling a request that ends on its own (grammar complete, eos) is found a step late and
computed once more, discarded, so the constrained run's mean batch is slightly larger (both are
reported). Reports the mean time of the pure-decode steps of each run, of all of them and of
those with at least 90% of max_num_seqs sequences (the cost at full batch), and

    constrained decoding cost = (t_constrained - t_plain) / t_plain

With more requests than max_num_seqs (e.g. --requests 1024), the batch stays near full for most
of the run, new requests being admitted as others end.

Weights are random (bench/workloads.py). So that mask filling costs what it would with a real
vocabulary, the checkpoint's 384-token tokenizer is replaced by a byte-level BPE of
--tokenizer-vocab tokens trained on Python sources (default 32000 where the model's vocabulary has
room, else the checkpoint's own). Writes structured-decode-<workload>-<stamp>.json to --out.
Timings from a CPU run say nothing about GPU performance.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.slow_steps import SlowStepSampler, summary_lines
from bench.structured_masks import SCHEMA, stdlib_sources
from bench.workloads import SHAPES, bench_commit, build_checkpoint, requests
from shardinfer import LLM, SamplingParams
from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.engine.structured import StructuredOutputCompiler
from shardinfer.testing.tiny_checkpoint import SPECIAL_TOKENS

# Compact JSON, as the recorded runs used: a random-init model samples blanks as readily as any
# token, and free whitespace would let its samples run to max_tokens instead of closing the object.
SO_ARGS = {"schema_type": "json", "schema": SCHEMA, "whitespace": "compact"}
COUNTERS = (
    "steps",
    "generated_tokens",
    "preemptions",
    "synchronous_steps",
    "deferred_sampling_steps",
    "grammar_mask_wait_s",
)


def with_tokenizer(model_dir: Path, vocab: int, out_dir: Path) -> Path:
    """A copy of model_dir (weights linked, not copied) whose tokenizer is a byte-level BPE of
    `vocab` tokens; the special tokens keep the checkpoint's ids (bos 0, eos 1)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    target = out_dir / f"{model_dir.name}-tok{vocab}"
    if (target / "tokenizer.json").is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():
        if item.name != "tokenizer.json" and not (target / item.name).exists():
            (target / item.name).symlink_to(item.resolve())
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(stdlib_sources(), trainer)
    tok.save(str(target / "tokenizer.json"))
    return target


class StepClock:
    """Wall time of each engine step, whether its batch was pure decode, and host time spent
    filling grammar masks; wraps the engine's methods without changing what they do."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.decode_s: list[float] = []
        self.decode_batch: list[int] = []
        self._batch: list[int] = []
        # Every step, prefill or decode: (wall ms, rows, mask fill ms, mask wait ms, Python GC ms,
        # CUDA allocator retries), to find slow steps and what made them slow.
        self.steps: list[tuple[float, int, float, float, float, int]] = []
        self._fill_s = 0.0
        self._gc_s = 0.0
        self._gc_t0 = 0.0
        self.slow_step_stacks: list[dict[str, Any]] = []
        schedule = engine.scheduler.schedule
        masks = engine.grammar_masks.fill

        def scheduled() -> Any:
            batch = schedule()
            self._batch = list(batch.num_new_tokens)
            return batch

        def timed_masks(constrained: Any) -> Any:
            t0 = time.perf_counter()
            out = masks(constrained)
            self._fill_s += time.perf_counter() - t0
            return out

        engine.scheduler.schedule = scheduled  # type: ignore[method-assign]
        engine.grammar_masks.fill = timed_masks  # type: ignore[method-assign]

    def unwrap(self) -> None:
        del self.engine.scheduler.schedule, self.engine.grammar_masks.fill  # back to the class's methods

    @property
    def mask_fill_s(self) -> float:
        """Time spent filling grammar masks over the run (the steps' fill column)."""
        return sum(step[2] for step in self.steps) / 1e3

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self._gc_s += time.perf_counter() - self._gc_t0

    @staticmethod
    def _alloc_retries() -> int:
        return int(torch.cuda.memory_stats().get("num_alloc_retries", 0)) if torch.cuda.is_available() else 0

    def run(self, sync: Callable[[], None]) -> list[Any]:
        outs: list[Any] = []
        sync()
        gc.callbacks.append(self._on_gc)
        sampler = SlowStepSampler()
        try:
            while self.engine.has_unfinished():
                # Counter snapshots before the clock starts: the step's time is the engine's alone.
                wait0, self._fill_s, self._gc_s = self.engine.stats()["grammar_mask_wait_s"], 0.0, 0.0
                retries0 = self._alloc_retries()
                sampler.begin(len(self.steps))
                t0 = time.perf_counter()
                outs += self.engine.step()
                elapsed = time.perf_counter() - t0
                sampler.end()
                wait = self.engine.stats()["grammar_mask_wait_s"] - wait0
                self.steps.append(
                    (
                        round(elapsed * 1e3, 3),
                        len(self._batch),
                        round(self._fill_s * 1e3, 3),
                        round(wait * 1e3, 3),
                        round(self._gc_s * 1e3, 3),
                        self._alloc_retries() - retries0,
                    )
                )
                if self._batch and all(n == 1 for n in self._batch):
                    self.decode_s.append(elapsed)
                    self.decode_batch.append(len(self._batch))
        finally:
            gc.callbacks.remove(self._on_gc)
            self.slow_step_stacks = sampler.close()
        sync()
        return outs


def run(
    llm: LLM,
    prompts: list[list[int]],
    params: list[SamplingParams],
    sync: Callable[[], None],
    tag: str,
    full_batch: int,
) -> tuple[dict[str, Any], list[Any]]:
    """One timed run; returns its summary and each request's completion, in request order.
    Decode steps of at least full_batch sequences are also summarised on their own."""
    engine = llm.llm_engine
    for i, (ids, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"{tag}-{i}", ids, p)
    before = engine.stats()
    clock = StepClock(engine)
    t0 = time.perf_counter()
    try:
        outs = clock.run(sync)
    finally:
        clock.unwrap()
    wall = time.perf_counter() - t0
    by_id = {o.request_id: o.outputs[0] for o in outs}
    completions = [by_id[f"{tag}-{i}"] for i in range(len(prompts))]
    lengths = [len(c.token_ids) for c in completions]
    steps = clock.decode_s
    full = [t for t, b in zip(steps, clock.decode_batch, strict=True) if b >= full_batch]
    summary = {
        "wall_s": wall,
        "output_tokens": sum(lengths),
        "decode_steps": len(steps),
        "mean_decode_batch": statistics.fmean(clock.decode_batch) if steps else None,
        "mean_decode_step_ms": statistics.fmean(steps) * 1e3 if steps else None,
        "median_decode_step_ms": statistics.median(steps) * 1e3 if steps else None,
        "full_batch": full_batch,
        "full_batch_decode_steps": len(full),
        "full_batch_mean_step_ms": statistics.fmean(full) * 1e3 if full else None,
        "mask_fill_ms_per_decode_step": clock.mask_fill_s / len(steps) * 1e3 if steps else None,
        # The part of the fill the engine thread waited for (not hidden behind planning the next step).
        "mask_wait_ms_per_decode_step": (
            (engine.stats()["grammar_mask_wait_s"] - before["grammar_mask_wait_s"]) / len(steps) * 1e3
            if steps
            else None
        ),
        "finish_reasons": {
            r: sum(c.finish_reason == r for c in completions)
            for r in sorted({str(c.finish_reason) for c in completions})
        },
        "stats": {k: v - before[k] for k, v in engine.stats().items() if k in COUNTERS},
        "steps_ms_rows_fill_wait_gc_retries": clock.steps,
        "slow_step_stacks": clock.slow_step_stacks,
        "decode_step_ms": [round(t * 1e3, 3) for t in steps],
    }
    return summary, completions


def relative_cost(constrained: float | None, plain: float | None) -> float | None:
    """(t_constrained - t_plain) / t_plain, or None where a run had no such steps."""
    return (constrained - plain) / plain if constrained is not None and plain else None


def paired_cost(constrained: list[float], plain: list[float]) -> float | None:
    """The cost over decode steps paired by order (both runs have the same batch sizes), leaving
    out pairs where either step took over three times its run's median: one-off stalls that hit
    either run (bench/slow_steps.py samples where they come from) and would otherwise decide
    the mean."""
    if not constrained or len(constrained) != len(plain):
        return None
    lim_c, lim_p = 3 * statistics.median(constrained), 3 * statistics.median(plain)
    pairs = [(c, p) for c, p in zip(constrained, plain, strict=True) if c <= lim_c and p <= lim_p]
    return relative_cost(sum(c for c, _ in pairs), sum(p for _, p in pairs)) if pairs else None


def parses_as_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128, help="output budget of a constrained request")
    ap.add_argument("--in-range", type=int, nargs=2, default=(32, 128))
    ap.add_argument(
        "--tokenizer-vocab",
        type=int,
        default=None,
        help="BPE size replacing the checkpoint's tokenizer (0: keep it; default 32000 if it fits)",
    )
    ap.add_argument(
        "--independent-matchers",
        nargs="?",
        const="on",
        default="auto",
        choices=["auto", "on", "off"],
        help="matchers built per request instead of copies of the compiled grammar "
        "(auto: the engine's default, independent from 4 CPUs)",
    )
    ap.add_argument(
        "--mask-threads", type=int, default=None, help="llguidance threads (default: its own choice)"
    )
    ap.add_argument(
        "--templates", type=int, default=None, help="templates per grammar (default: one per thread)"
    )
    ap.add_argument(
        "--parallel-accept",
        default="auto",
        choices=["auto", "on", "off"],
        help="consume each step's grammar tokens on llguidance's thread pool (auto: from 4 mask threads)",
    )
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--async-scheduling", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--ckpt-dir", default=str(Path(tempfile.gettempdir()) / "shardinfer-bench"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    shape = SHAPES[args.workload]
    model_dir = build_checkpoint(args.workload, Path(args.ckpt_dir) / args.workload, device=device)
    tok_vocab = args.tokenizer_vocab
    if tok_vocab is None:
        tok_vocab = 32000 if shape["vocab_size"] >= 32000 else 0
    if tok_vocab:
        if tok_vocab > shape["vocab_size"]:
            raise SystemExit(
                f"--tokenizer-vocab {tok_vocab} exceeds the model's vocabulary ({shape['vocab_size']})"
            )
        model_dir = with_tokenizer(model_dir, tok_vocab, Path(args.ckpt_dir))
    max_num_seqs = min(args.max_num_seqs or args.requests, args.requests)
    llm = LLM(
        model_dir,
        device=device,
        dtype="bfloat16" if device == "cuda" else "float32",
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enable_prefix_caching=False,
        async_scheduling={"auto": None, "on": True, "off": False}[args.async_scheduling],
        structured_independent_matchers={"auto": None, "on": True, "off": False}[args.independent_matchers],
    )
    engine = llm.llm_engine
    if args.mask_threads is not None or args.templates is not None:
        # The engine's own compiler, with this run's thread and template counts (the engine keeps
        # llguidance's thread count and one template per thread).
        engine.grammar_masks._compiler = StructuredOutputCompiler(
            str(engine.tokenizer.path),
            list(engine.tokenizer.eos_token_ids),
            engine.model_config.vocab_size,
            num_threads=args.mask_threads,
            independent_matchers=engine.config.independent_matchers,
            templates=args.templates,
        )
    if args.parallel_accept != "auto":
        engine.grammar_compiler().parallel_accept = args.parallel_accept == "on"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    prompts = [ids for ids, _ in requests(args.requests, shape["vocab_size"], tuple(args.in_range), (1, 1))]
    # Warm-up: kernels, CUDA graphs, llguidance's tokenizer and the schema's compilation.
    llm.generate(
        prompts[:4],
        [
            SamplingParams(temperature=1.0, max_tokens=8, seed=i, so_args=SO_ARGS)
            for i in range(min(4, len(prompts)))
        ],
    )
    llm.generate(prompts[:4], SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, seed=1))

    constrained_params = [
        SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=i, so_args=SO_ARGS)
        for i in range(len(prompts))
    ]
    full_batch = math.ceil(0.9 * max_num_seqs)
    constrained, completions = run(llm, prompts, constrained_params, sync, "constrained", full_batch)
    lengths = [len(c.token_ids) for c in completions]
    stopped = [c.text for c in completions if c.finish_reason == "stop"]
    # A sanity check of the masks: every sample that ended on its own is a JSON document.
    constrained["stopped_samples_parsing_as_json"] = f"{sum(map(parses_as_json, stopped))}/{len(stopped)}"
    # Each plain request generates exactly as many tokens as its constrained twin did.
    plain_params = [
        SamplingParams(temperature=1.0, max_tokens=n, seed=i, ignore_eos=True) for i, n in enumerate(lengths)
    ]
    plain, plain_completions = run(llm, prompts, plain_params, sync, "plain", full_batch)
    if [len(c.token_ids) for c in plain_completions] != lengths:
        raise RuntimeError("the plain run did not generate the constrained run's token counts")
    cost = relative_cost(constrained["mean_decode_step_ms"], plain["mean_decode_step_ms"])
    stall_free = paired_cost(constrained["decode_step_ms"], plain["decode_step_ms"])
    full_cost = relative_cost(constrained["full_batch_mean_step_ms"], plain["full_batch_mean_step_ms"])

    now = dt.datetime.now(dt.UTC)
    result = {
        "bench": "structured_decode",
        "workload": args.workload,
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "commit": bench_commit(),
        "date": now.isoformat(),
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "in_range": args.in_range,
        "tokenizer_vocab": tok_vocab or None,
        "schema": SCHEMA,
        "async_scheduling": engine.async_scheduling,
        "independent_matchers": engine.grammar_compiler().independent_matchers,
        "mask_threads": args.mask_threads,
        "templates": engine.grammar_compiler().templates,
        "parallel_accept": engine.grammar_compiler().parallel_accept,
        "settings": {
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "max_model_len": args.max_model_len,
        },
        "constrained": constrained,
        "plain": plain,
        "constrained_decoding_cost": cost,
        "constrained_decoding_cost_full_batch": full_cost,
        "constrained_decoding_cost_stall_free": stall_free,
        "torch": torch.__version__,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"structured-decode-{args.workload}-{now.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    nan = float("nan")
    print(
        f"{'run':<12} {'decode steps':>12} {'mean batch':>10} {'mean step ms':>13} {'mask fill ms':>13} "
        f"{f'steps >= {full_batch}':>14} {'their mean ms':>14}"
    )
    for name, r in (("constrained", constrained), ("plain", plain)):
        print(
            f"{name:<12} {r['decode_steps']:>12} {r['mean_decode_batch'] or 0:>10.1f} "
            f"{r['mean_decode_step_ms'] or nan:>13.3f} {r['mask_fill_ms_per_decode_step'] or 0:>13.3f} "
            f"{r['full_batch_decode_steps']:>14} {r['full_batch_mean_step_ms'] or nan:>14.3f}"
        )
    note = "  (CPU: not a performance figure)" if device == "cpu" else ""
    print(
        f"constrained decoding cost = (t_constrained - t_plain) / t_plain = {cost if cost is not None else nan:+.1%}"
        f"; at batch >= {full_batch}: {full_cost if full_cost is not None else nan:+.1%}{note}"
    )
    print(
        f"without one-off stalls (steps over 3x their run's median, either run): "
        f"{stall_free if stall_free is not None else nan:+.1%}"
    )
    for name, r in (("constrained", constrained), ("plain", plain)):
        for line in summary_lines(r["slow_step_stacks"]):
            print(f"{name}: {line}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
