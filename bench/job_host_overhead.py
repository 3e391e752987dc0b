"""Host cost of the job path per row and per token, with the engine stubbed out (CPU).

    python bench/job_host_overhead.py [--rows 20000] [--prompt-words 50] [--max-tokens 256]
                                      [--logprobs 1] [--profile FILE.prof]

Reader, row preparation (tokenising), result assembly, Arrow table building and part writing
run as in a real job; the engine is `shardinfer.testing.stub_engine.StubEngine`, which answers
every request with preset tokens at once. The wall time is therefore all host overhead: on a
GPU it is what competes with the engine thread for the interpreter. `--profile FILE` writes
cProfiles of the engine thread (FILE), the preparation thread (FILE.prepare_loop) and the
writer thread (FILE.write_loop).
"""

from __future__ import annotations

import argparse
import cProfile
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import pyarrow as pa
import pyarrow.parquet as pq

from shardinfer.pipeline.config import JobConfig
from shardinfer.pipeline.job import finalize_job, open_job, run_worker, write_plan
from shardinfer.testing.stub_engine import StubEngine, write_stub_model_dir

WORDS = ["fox", "engine", "parquet", "shard", "hello", "world", "split", "commit", "token", "seed"]


def write_input(path: Path, rows: int, words: int, max_tokens: int) -> None:
    text = [" ".join(WORDS[(i + k) % 10] for k in range(words)) + f" {i}" for i in range(rows)]
    table = pa.table({"prompt": text, "max_tokens": pa.array([max_tokens] * rows, pa.int64())})
    pq.write_table(table, path, row_group_size=4096)


def profile_threads(prefix: str) -> None:
    """Profile the preparation and writer threads too, each into `prefix.<method>`."""
    from shardinfer.pipeline.runner import SplitWorker

    for name in ("_prepare_loop", "_write_loop"):
        original = getattr(SplitWorker, name)

        def profiled(self: SplitWorker, *a: object, _original=original, _name=name) -> None:  # type: ignore[no-untyped-def]
            prof = cProfile.Profile(time.thread_time)
            prof.enable()
            try:
                _original(self, *a)
            finally:
                prof.disable()
                prof.dump_stats(f"{prefix}.{_name.strip('_')}")

        setattr(SplitWorker, name, profiled)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--prompt-words", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--logprobs", type=int, default=1)
    ap.add_argument("--split-rows", type=int, default=1000)
    ap.add_argument("--max-splits-in-flight", type=int, default=4)
    ap.add_argument("--step-ms", type=float, default=0.0, help="device wait per step (GIL released)")
    ap.add_argument(
        "--switch-interval-ms", type=float, default=0.0, help="sys.setswitchinterval; 0 = default"
    )
    ap.add_argument("--profile", default="", help="write a cProfile of the run to this file")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_stub_model_dir(root / "tok")
        write_input(root / "in.parquet", args.rows, args.prompt_words, args.max_tokens)
        sampling = {"temperature": 1.0, "ignore_eos": True, "max_tokens": 16}
        if args.logprobs:
            sampling["logprobs"] = args.logprobs
        config = JobConfig.from_dict(
            {
                "job": {
                    "seed": 1,
                    "split_rows": args.split_rows,
                    "run_id": "bench",
                    "max_splits_in_flight": args.max_splits_in_flight,
                    "max_inflight_requests": 1024,
                },
                "input": {
                    "path": str(root / "in.parquet"),
                    "prompt_column": "prompt",
                    "override_columns": ["max_tokens"],
                },
                "model": {"path": str(root / "tok"), "device": "cpu"},
                "sampling": sampling,
                "output": {"path": str(root / "out")},
            }
        )
        engine = StubEngine(
            root / "tok", max_model_len=args.max_tokens + 4096, max_num_seqs=256, step_s=args.step_ms / 1e3
        )
        if args.switch_interval_ms:
            sys.setswitchinterval(args.switch_interval_ms / 1e3)
        job = open_job(config)
        write_plan(job, "bench")
        profiler = cProfile.Profile(time.thread_time) if args.profile else None
        if profiler is not None:
            profile_threads(args.profile)
            profiler.enable()
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        run_worker(job, job.splits, threading.Event(), "bench", engine=engine)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        summary = finalize_job(job, "bench", {})
        tokens = int(summary.get("summary", summary)["completion_tokens"])
        steps = int(engine.stats()["steps"])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"rows {args.rows}  tokens {tokens}  wall {wall:.2f} s  cpu {cpu:.2f} s  "
        f"{1e6 * wall / args.rows:.1f} us/row  {1e9 * wall / max(tokens, 1):.0f} ns/token  "
        f"peak rss {peak:.0f} MB  steps {steps}  wall/step {1e3 * wall / steps:.2f} ms"
    )


if __name__ == "__main__":
    main()
