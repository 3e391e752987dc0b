"""Local executors: `local` runs the worker in this process, `local[N]` runs N worker processes.

Workers coordinate only through the output store: each starts with its own share of the splits
(index % N) and then takes the others' from the far end, skipping any split whose commit
marker exists. Two workers may therefore compute the same split near the meeting point; the
create-if-absent marker lets exactly one commit it and the loser deletes its part. A worker
that dies is reported; its splits are picked up by the survivors, by a retry round here, or by
the next run.

Worker processes talk back through stdout, one JSON event per line (progress, commits, their
final result), which the parent folds into one progress display and one summary.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from shardinfer.errors import EXIT_RETRYABLE, Interrupted, Retryable, UsageError
from shardinfer.jobs.progress import Reporter
from shardinfer.pipeline.job import OpenedJob, run_worker, schema_to_text
from shardinfer.pipeline.runner import WORKER_DONE, WorkerResult
from shardinfer.splits import Split

_MASTER = re.compile(r"^local(?:\[(\*|\d+)\])?$")
STOP_GRACE_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds


def parse_master(master: str) -> int:
    """'local' -> 1, 'local[N]' -> N, 'local[*]' -> CPU count (GPU count when CUDA is visible)."""
    m = _MASTER.match(master.strip())
    if not m:
        raise UsageError(
            f"--master {master!r} is not supported: use local, local[N] or local[*] "
            "(ray://... needs the ray executor, which this build does not include)"
        )
    if m.group(1) is None:
        return 1
    if m.group(1) == "*":
        return max(1, _device_count() or os.cpu_count() or 1)
    n = int(m.group(1))
    if n < 1:
        raise UsageError(f"--master {master!r}: N must be >= 1")
    return n


def _device_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def _gpu_env(device: str, worker: int) -> dict[str, str]:
    """One GPU per worker: worker i sees only the i-th visible GPU (round-robin past the count)."""
    if device not in ("auto", "cuda"):
        return {}  # cpu, or an explicit cuda:N the user chose for every worker
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = (
        [d for d in visible.split(",") if d.strip()] if visible else [str(i) for i in range(_device_count())]
    )
    return {"CUDA_VISIBLE_DEVICES": ids[worker % len(ids)].strip()} if ids else {}


def worker_order(splits: list[Split], worker: int, num_workers: int) -> list[Split]:
    """Own splits first (index % N == worker), then everyone else's from the far end."""
    own = [s for s in splits if s.index % num_workers == worker]
    rest = [s for s in splits if s.index % num_workers != worker]
    return own + rest[::-1]


class RunStats:
    """Numbers of this run (not of the whole job) for the summary."""

    def __init__(self) -> None:
        self.engine: list[dict[str, Any]] = []
        self.committed = 0
        self.lost = 0

    def add(self, result: WorkerResult) -> None:
        self.engine.append(result.engine_stats)
        self.committed += len(result.committed)
        self.lost += len(result.lost)

    def summary(self, wall_s: float, workers: int) -> dict[str, Any]:
        prompt = sum(e.get("prompt_tokens", 0.0) for e in self.engine)
        generated = sum(e.get("generated_tokens", 0.0) for e in self.engine)
        # Weighted by each engine's prompt tokens, so an idle worker does not dilute the rate.
        hit = sum(e.get("prefix_cache_hit_rate", 0.0) * e.get("prompt_tokens", 0.0) for e in self.engine)
        return {
            "workers": workers,
            "wall_time_s": round(wall_s, 3),
            "run_prompt_tokens": int(prompt),
            "run_completion_tokens": int(generated),
            "output_tokens_per_s": round(generated / wall_s, 2) if wall_s > 0 else 0.0,
            "prefix_cache_hit_rate": round(hit / prompt, 4) if prompt else 0.0,
            "run_splits_committed": self.committed,
            "run_splits_lost": self.lost,
        }


def run_in_process(job: OpenedJob, stop: threading.Event, reporter: Reporter, stats: RunStats) -> None:
    stats.add(run_worker(job, job.splits, stop, job.config.job.run_id, emit=reporter.handle))


def run_processes(
    job: OpenedJob,
    num_workers: int,
    stop: threading.Event,
    reporter: Reporter,
    stats: RunStats,
    max_rounds: int = 2,
) -> None:
    """N worker processes; a round that loses workers is followed by a retry round (up to max_rounds)."""
    for round_index in range(max_rounds):
        failures = _one_round(job, num_workers, stop, reporter, stats)
        if stop.is_set():
            raise Interrupted("stopped by a signal; uncommitted splits were abandoned — rerun to finish")
        committed = job.store.committed()
        missing = [s.index for s in job.splits if s.index not in committed]
        if not missing:
            return
        if not failures:
            raise Retryable(f"workers exited but splits {missing[:5]} are uncommitted; rerun to finish")
        reporter.warn("re-running the splits of lost workers", splits=len(missing), round=round_index + 2)
        num_workers = max(1, min(num_workers, len(missing)))
    raise Retryable("workers kept dying; committed splits are kept, rerun to finish the rest")


def _one_round(
    job: OpenedJob, num_workers: int, stop: threading.Event, reporter: Reporter, stats: RunStats
) -> list[int]:
    procs: list[subprocess.Popen[str]] = []
    threads = []
    config = job.config.to_dict()
    schema = schema_to_text(job.input_schema)  # read once here, not once per worker
    for worker in range(num_workers):
        payload = json.dumps(
            {"config": config, "worker": worker, "num_workers": num_workers, "input_schema": schema}
        )
        env = dict(os.environ)
        env.update(_gpu_env(job.config.model.device, worker))
        if job.config.model.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            # N CPU workers share the cores; torch's default (all cores each) oversubscribes them.
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // num_workers))
        proc = subprocess.Popen(
            [sys.executable, "-m", "shardinfer.jobs.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert proc.stdin is not None  # stdin=PIPE above
        proc.stdin.write(payload)
        proc.stdin.close()
        procs.append(proc)
        t = threading.Thread(target=_pump, args=(proc, reporter, stats), daemon=True)
        t.start()
        threads.append(t)
    stop_sent = False
    deadline = None
    while any(p.poll() is None for p in procs):
        if stop.is_set() and not stop_sent:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            stop_sent, deadline = True, time.monotonic() + STOP_GRACE_S
        if deadline is not None and time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
    for t in threads:
        t.join(timeout=5)
    failures = []
    for worker, p in enumerate(procs):
        code = p.returncode
        if code == 0 or (stop.is_set() and code == EXIT_RETRYABLE):
            continue
        failures.append(worker)
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        reporter.error(
            f"worker {worker} died ({how}); its uncommitted splits go to the other workers",
            worker=worker,
            exit_code=code,
        )
    return failures


def _pump(proc: subprocess.Popen[str], reporter: Reporter, stats: RunStats) -> None:
    assert proc.stdout is not None  # stdout=PIPE in _one_round
    for line in proc.stdout:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == WORKER_DONE:
            stats.add(WorkerResult.from_event(event))
        else:
            reporter.handle(event)
