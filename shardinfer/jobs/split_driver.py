"""The driver loop every multi-worker executor shares: answer split requests, watch for deaths.

Workers (local processes or Ray actors) send events into one inbox; the loop runs on the
driver's thread:

    want_split     -> the scheduler's next split, or None (no more work: the worker finishes)
    split_done     -> the scheduler marks it committed or lost; progress counts it
    split_skipped  -> already committed when the worker reached it
    progress       -> the progress display
    worker_done    -> the worker's engine statistics, for the summary
    exited         -> a clean exit, or a death: the dead worker's splits go back to the
                      scheduler, and a replacement starts on the same slot (GPU) when more
                      splits wait than the live workers can take at once (at most
                      `max_restarts` in a run; past that, the survivors take the rest)

How a worker is started, told a split, or stopped is the executor's business (`WorkerHandle`).
"""

from __future__ import annotations

import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from shardinfer.errors import (
    EXIT_CONFIG,
    EXIT_DATA,
    EXIT_NO_INPUT,
    EXIT_RETRYABLE,
    EXIT_USAGE,
    Interrupted,
    JobError,
    Retryable,
)
from shardinfer.jobs.progress import Reporter
from shardinfer.jobs.split_scheduler import SplitScheduler
from shardinfer.pipeline.runner import WorkerResult

Inbox = queue.Queue[tuple[str, dict[str, Any]]]
# The name under which the finish step's recomputation of damaged splits is counted: it runs its
# own engine in the driver, after the workers are done.
REPAIR_WORKER = "repair"
STOP_GRACE_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds
# A worker that exits with one of these failed on something another worker would fail on too
# (a damaged checkpoint, a bad config): the job stops with that code instead of retrying.
DETERMINISTIC_EXITS = (EXIT_USAGE, EXIT_DATA, EXIT_NO_INPUT, EXIT_CONFIG)


class WorkerFailed(JobError):
    """A worker's deterministic failure, passed on with the worker's own exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class WorkerHandle(Protocol):
    """The driver's side of one worker."""

    name: str

    def give(self, split: Any | None) -> None:
        """Answer the worker's split request (None: no more work)."""

    def terminate(self) -> None:
        """Ask the worker to stop (it abandons uncommitted splits and exits 75)."""

    def kill(self) -> None:
        """Stop it now."""


class RunStats:
    """Numbers of this run (not of the whole job) for the summary."""

    def __init__(self) -> None:
        self.engine: list[dict[str, Any]] = []
        self.per_worker: dict[str, dict[str, Any]] = {}
        self.rows_kept: dict[str, int] = {}
        # Tokens each worker reported as it went (progress events) and in the splits it committed:
        # a worker that dies never sends its engine's statistics, but what it generated was this
        # run's work, and what it committed is in the output.
        self.tokens_reported: dict[str, int] = {}
        self.tokens_kept: dict[str, int] = {}
        # Prompt tokens of the committed splits: progress events carry none, so for a dead worker
        # these are all that is known of what it read (a score job's only work).
        self.prompt_kept: dict[str, int] = {}
        self.restarts = 0
        self.repair_counts = {"run_split_attempts": 0, "run_splits_committed": 0, "run_splits_lost": 0}

    def add(self, result: dict[str, Any], worker: str = "0") -> None:
        stats = dict(result.get("engine_stats", {}))
        self.engine.append(stats)
        self.per_worker[worker] = stats

    def kept(self, worker: str, records: int, completion_tokens: int = 0, prompt_tokens: int = 0) -> None:
        self.rows_kept[worker] = self.rows_kept.get(worker, 0) + records
        self.tokens_kept[worker] = self.tokens_kept.get(worker, 0) + completion_tokens
        self.prompt_kept[worker] = self.prompt_kept.get(worker, 0) + prompt_tokens

    def kept_split(self, worker: str, event: dict[str, Any]) -> None:
        """A split_done event this worker won: the counts its commit carries."""
        self.kept(
            worker,
            int(event.get("records", 0)),
            int(event.get("completion_tokens", 0)),
            int(event.get("prompt_tokens", 0)),
        )

    def reported(self, worker: str, completion_tokens: int) -> None:
        self.tokens_reported[worker] = self.tokens_reported.get(worker, 0) + completion_tokens

    def _unfinished_tokens(self, worker: str) -> int:
        """What a worker that never reported its engine's statistics (it died) generated, at least:
        its progress reports, or the tokens of the splits it committed where those say more (the
        last report before a death may not have been sent)."""
        return max(self.tokens_reported.get(worker, 0), self.tokens_kept.get(worker, 0))

    def _generated(self, worker: str) -> int:
        if worker in self.per_worker:
            return int(self.per_worker[worker].get("generated_tokens", 0))
        return self._unfinished_tokens(worker)

    def repaired(self, result: WorkerResult) -> None:
        """The finish step's recomputation of damaged splits: splits computed and tokens generated
        by this run like any other, so the run's split counts and throughput include them."""
        self.add({"engine_stats": result.engine_stats}, REPAIR_WORKER)
        self.repair_counts["run_split_attempts"] += len(result.committed) + len(result.lost)
        self.repair_counts["run_splits_committed"] += len(result.committed)
        self.repair_counts["run_splits_lost"] += len(result.lost)

    def _workers(self, wall_s: float) -> dict[str, dict[str, Any]]:
        out = {}
        names = set(self.per_worker) | set(self.rows_kept) | set(self.tokens_reported)
        for name in sorted(names, key=lambda n: (len(n), n)):
            generated = self._generated(name)
            out[name] = {
                "rows_committed": self.rows_kept.get(name, 0),
                "generated_tokens": generated,
                "output_tokens_per_s": round(generated / wall_s, 2) if wall_s > 0 else 0.0,
                "finished": name in self.per_worker,  # a dead worker never reports its engine stats
            }
        return out

    def _speculative(self) -> dict[str, Any]:
        """Speculative decoding over the run's engines: drafts, acceptance (overall and by draft
        position), the mean depth the budget chose, the steps that probed while the requests
        skipped proposing (draft_budget.py), and (means over the engines that speculate)
        the draft tokens verified per step and the share of steps the budget switched speculation
        off. Empty when no engine drafted and none switched speculation off (it is off)."""
        drafted = sum(e.get("draft_tokens", 0.0) for e in self.engine)
        # Engines with a drafter report the budget's choices, also when it never drafted.
        speculating = [e for e in self.engine if "speculation_off_share" in e]
        if not drafted and not any(e["speculation_off_share"] for e in speculating):
            return {}
        accepted = sum(e.get("accepted_draft_tokens", 0.0) for e in self.engine)
        drafting = [e for e in self.engine if e.get("draft_tokens")]
        out: dict[str, Any] = {
            "draft_tokens": int(drafted),
            "accepted_draft_tokens": int(accepted),
            "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
        }
        if drafting:
            out["mean_draft_depth"] = round(
                sum(e.get("mean_draft_depth", 0.0) for e in drafting) / len(drafting), 3
            )
        probes = sum(e.get("draft_probe_steps", 0.0) for e in self.engine)
        if probes:
            out["probe_steps"] = int(probes)  # steps that verified drafts only to keep learning
        for name in ("mean_draft_tokens_per_step", "speculation_off_share"):
            if speculating:
                out[name] = round(sum(e.get(name, 0.0) for e in speculating) / len(speculating), 4)
        j = 1
        while any(f"draft_acceptance_p{j}" in e for e in drafting):
            # Weighted by each engine's drafts: an engine that drafted little says little.
            rates = [
                (e[f"draft_acceptance_p{j}"], e["draft_tokens"])
                for e in drafting
                if f"draft_acceptance_p{j}" in e
            ]
            out[f"acceptance_p{j}"] = round(sum(r * w for r, w in rates) / sum(w for _, w in rates), 4)
            j += 1
        return out

    def summary(self, wall_s: float, workers: int, scheduler: SplitScheduler | None = None) -> dict[str, Any]:
        prompt = sum(e.get("prompt_tokens", 0.0) for e in self.engine)
        generated = sum(e.get("generated_tokens", 0.0) for e in self.engine)
        dead = (set(self.rows_kept) | set(self.tokens_reported)) - set(self.per_worker)
        generated += sum(self._unfinished_tokens(name) for name in dead)
        # Weighted by each engine's prompt tokens, so an idle worker does not dilute the rate (a dead
        # worker's prompt tokens below come without a hit rate and stay out of it).
        hit = sum(e.get("prefix_cache_hit_rate", 0.0) * e.get("prompt_tokens", 0.0) for e in self.engine)
        read_by_dead = sum(self.prompt_kept.get(name, 0) for name in dead)
        out: dict[str, Any] = {
            "workers": workers,
            "wall_time_s": round(wall_s, 3),
            "run_prompt_tokens": int(prompt) + read_by_dead,
            "run_completion_tokens": int(generated),
            "output_tokens_per_s": round(generated / wall_s, 2) if wall_s > 0 else 0.0,
            "prefix_cache_hit_rate": round(hit / prompt, 4) if prompt else 0.0,
            "run_worker_restarts": self.restarts,
        }
        # Engines build in parallel (one per worker): the slowest is what the run waited for.
        starts = [e["engine_start_s"] for e in self.engine if "engine_start_s" in e]
        if starts:
            out["engine_start_s"] = round(max(starts), 3)
        caps = [e["max_num_seqs"] for e in self.engine if "max_num_seqs" in e]
        if caps:  # each engine's batch cap in effect (docs/jobs.md, engine.max_num_seqs)
            out["max_num_seqs"] = int(max(caps))
            out["run_preemptions"] = int(sum(e.get("preemptions", 0.0) for e in self.engine))
        ahead = [e for e in self.engine if "compiled_ahead_variants" in e]
        if ahead:
            out["kernels_compiled_ahead"] = int(max(e["compiled_ahead_variants"] for e in ahead))
            out["kernels_compiled_ahead_s"] = round(max(e.get("compiled_ahead_s", 0.0) for e in ahead), 3)
        speculative = self._speculative()
        if speculative:
            out["speculative"] = speculative
        parallel = [e for e in self.engine if "expert_parallel_size" in e]
        if parallel:
            # One expert-parallel engine per worker: its ranks' expert rows, and their balance.
            rows = [
                [e[f"rank{i}_expert_rows"] for i in range(int(e["expert_parallel_size"]))] for e in parallel
            ]
            out["expert_parallel"] = {
                "ranks": int(parallel[0]["expert_parallel_size"]),
                "moe_lb": round(max(e["moe_lb"] for e in parallel), 4),
                "rank_expert_rows": [int(sum(col)) for col in zip(*rows, strict=True)],
                "rebalances": int(sum(e.get("expert_rebalances", 0) for e in parallel)),
            }
        if workers > 1:
            out["run_workers"] = self._workers(wall_s)
        if scheduler is not None:
            out.update(scheduler.counts.to_summary())
            for key, count in self.repair_counts.items():
                out[key] = out.get(key, 0) + count
        return out


def drive(
    scheduler: SplitScheduler,
    inbox: Inbox,
    start_worker: Callable[[str, int], WorkerHandle],
    num_workers: int,
    reporter: Reporter,
    stats: RunStats,
    stop: threading.Event,
    max_restarts: int,
) -> None:
    """Run workers until every split is done; raises Interrupted on stop, Retryable when workers
    keep dying (committed splits are kept either way)."""
    workers: dict[str, WorkerHandle] = {}
    slot_of: dict[str, int] = {}
    exhausted: set[str] = set()  # told "no more work": they will not ask again

    def launch(slot: int) -> str:
        name = str(len(workers))  # a replacement gets a new name; it keeps the dead one's slot (GPU)
        workers[name] = start_worker(name, slot)
        slot_of[name] = slot
        return name

    for slot in range(num_workers):
        launch(slot)
    live = set(workers)
    stop_deadline: float | None = None
    gave_up = False
    fatal: WorkerFailed | None = None  # the first deterministic failure: every worker is stopped
    while live:
        halting = stop.is_set() or fatal is not None
        if halting and stop_deadline is None:
            stop_deadline = time.monotonic() + STOP_GRACE_S
            for name in live:
                workers[name].terminate()
        if stop_deadline is not None and time.monotonic() > stop_deadline:
            for name in live:
                workers[name].kill()
        try:
            name, event = inbox.get(timeout=0.1)
        except queue.Empty:
            continue
        kind = event.get("event")
        if kind == "want_split":
            split = None if (halting or gave_up) else scheduler.next_split(name)
            if split is None:
                exhausted.add(name)
            workers[name].give(split)
        elif kind == "split_done":
            scheduler.finish(name, int(event["split"]), "committed" if event.get("won") else "lost")
            if event.get("won"):
                stats.kept_split(name, event)
            reporter.handle({**event, "worker": name})
        elif kind == "progress":
            stats.reported(name, int(event.get("completion_tokens", 0)))
            reporter.handle({**event, "worker": name})
        elif kind == "split_skipped":
            scheduler.finish(name, int(event["split"]), "skipped")
        elif kind == "worker_done":
            stats.add(event, name)
        elif kind == "exited":
            live.discard(name)
            code = int(event.get("code", 1))
            if code == 0 and not scheduler.held_by(name):
                continue
            if halting and code in (EXIT_RETRYABLE, -signal.SIGTERM):
                # Stopped on request, not dead: a worker that is told to stop before it has set up its
                # own handling of SIGTERM (still starting) ends by the signal itself.
                continue
            reason = str(event.get("reason") or f"exit code {code}")
            if code in DETERMINISTIC_EXITS:
                if fatal is None:
                    fatal = WorkerFailed(f"worker {name} failed ({reason}); stopping the job", code)
                continue
            requeued = scheduler.worker_lost(name, reason)
            reporter.worker_lost(name)
            reporter.error(
                f"worker {name} died ({reason}); its splits {requeued} go to another worker",
                worker=name,
                exit_code=code,
            )
            askers = len(live - exhausted)  # live workers that will still ask for splits
            if halting or gave_up or scheduler.pending <= askers:
                continue  # the live workers can take every split still waiting
            if stats.restarts >= max_restarts:
                if askers:
                    continue  # slower without a replacement, but the survivors take the rest
                gave_up = True
                reporter.error(
                    f"{stats.restarts} worker restarts used up; stopping", max_restarts=max_restarts
                )
                continue
            stats.restarts += 1
            live.add(launch(slot_of[name]))
            reporter.warn("started a replacement worker", slot=slot_of[name], restarts=stats.restarts)
        else:
            reporter.handle({**event, "worker": name})
    if fatal is not None:
        raise fatal
    if stop.is_set():
        raise Interrupted("stopped by a signal; uncommitted splits were abandoned — rerun to finish")
    if not scheduler.finished:
        raise Retryable(
            f"workers kept dying ({stats.restarts} restarts); committed splits are kept, rerun to finish "
            "the rest"
        )
