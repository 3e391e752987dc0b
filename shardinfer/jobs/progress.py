"""Progress, logs and the final summary, for a terminal or for a scheduler's log collector.

On a TTY: a live tqdm line with rows and splits done of total, output tokens/s now and on
average, the ETA and the error rows so far (progress_counts.py keeps those numbers). Otherwise
(cron, Airflow, Kubernetes) a bar's carriage returns make unreadable logs, so the same numbers
come out as plain lines every `interval_s` (numbers, not strings, with --log-format json). `--log-format json` makes every line (logs, progress and the
summary) one JSON object carrying the run id, for log pipelines.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, TextIO

from shardinfer.jobs.progress_counts import JobProgress

# `{postfix}` arrives from tqdm as ", " plus the text, so it follows `{elapsed}` directly.
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} rows [{elapsed}{postfix}]"


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Reporter:
    def __init__(
        self,
        run_id: str,
        log_format: str = "text",
        verbose: bool = False,
        stream: TextIO | None = None,
        interval_s: float = 10.0,
    ) -> None:
        self.run_id = run_id
        self.json = log_format == "json"
        self.verbose = verbose
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._bar: Any = None
        self.progress = JobProgress(0, 0)
        self._last_line = 0.0

    # ---- logs -----------------------------------------------------------------------------
    def log(self, level: str, message: str, **fields: Any) -> None:
        if level == "debug" and not self.verbose:
            return
        with self._lock:
            if self.json:
                record = {**self._json_head(level, message), **fields}
                line = json.dumps(record, default=str)
            else:
                extra = " ".join(f"{k}={v}" for k, v in fields.items())
                line = f"[shardinfer] {level.upper()} {message}" + (f" ({extra})" if extra else "")
            if self._bar is not None:
                self._bar.write(line, file=self.stream)
            else:
                print(line, file=self.stream, flush=True)

    def _json_head(self, level: str, message: str) -> dict[str, Any]:
        """The keys every JSON line starts with, the summary's included, so a log pipeline can
        route each line by level and run without knowing which kind of line it is."""
        return {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "level": level,
            "run_id": self.run_id,
            "msg": message,
        }

    def info(self, message: str, **fields: Any) -> None:
        self.log("info", message, **fields)

    def warn(self, message: str, **fields: Any) -> None:
        self.log("warning", message, **fields)

    def error(self, message: str, **fields: Any) -> None:
        self.log("error", message, **fields)

    # ---- progress -------------------------------------------------------------------------
    def start(self, total_records: int, total_splits: int) -> None:
        self.progress = JobProgress(total_records, total_splits)
        self._last_line = time.monotonic()
        if not self.json and self.stream.isatty():
            from tqdm import tqdm

            # tqdm puts ", " before a non-empty postfix itself, so the format has no separator of
            # its own; passing the postfix up front keeps the first line drawn from lacking it.
            self._bar = tqdm(
                total=total_records,
                unit="rows",
                file=self.stream,
                dynamic_ncols=True,
                desc="shardinfer",
                bar_format=BAR_FORMAT,
                postfix=self.progress.postfix(),
            )

    def add_work(self, records: int, splits: int) -> None:
        """More work than `start` was told of (damaged splits recomputed at the end): the totals
        grow, so rows and splits done never run past them."""
        with self._lock:
            self.progress.total_records += records
            self.progress.total_splits += splits
            if self._bar is not None:
                self._bar.total = self.progress.total_records
            self._refresh_bar(force=True)

    def handle(self, event: dict[str, Any]) -> None:
        """A worker event: 'progress' (records/tokens finished) or 'split_done' (a commit)."""
        kind = event.get("event")
        worker = str(event.get("worker", "0"))
        with self._lock:
            if kind == "progress":
                self.progress.generated(
                    worker, int(event.get("records", 0)), int(event.get("completion_tokens", 0))
                )
            elif kind == "split_done":
                self.progress.split_done(worker, event)
            self._refresh_bar(force=kind == "split_done")
        if kind == "split_done":
            self.log(
                "debug",
                "split committed" if event.get("won") else "split lost the commit race",
                split=event.get("split"),
                records=event.get("records"),
                worker=worker,
            )
        self._maybe_line()

    def worker_lost(self, worker: str) -> None:
        """A dead worker's rows of uncommitted splits will be generated again: uncount them."""
        with self._lock:
            self.progress.worker_lost(str(worker))
            self._refresh_bar(force=True)

    def _refresh_bar(self, force: bool) -> None:
        if self._bar is None:
            return
        self._bar.n = self.progress.rows_done  # can go back when a dead worker's rows are uncounted
        self._bar.set_postfix_str(self.progress.postfix(), refresh=False)
        now = time.monotonic()
        if force or now - self._last_line >= 0.2:
            self._last_line = now
            self._bar.refresh()

    @property
    def tokens_per_s(self) -> float:
        return self.progress.tokens_per_s_avg()

    def _maybe_line(self, force: bool = False) -> None:
        if self._bar is not None:
            return
        now = time.monotonic()
        if not force and now - self._last_line < self.interval_s:
            return
        self._last_line = now
        p = self.progress
        if self.json:
            self.log("info", "progress", **p.fields())
        else:
            eta = p.eta_s()
            self.log(
                "info",
                "progress",
                rows=f"{p.rows_done}/{p.total_records}",
                splits=f"{p.splits_done}/{p.total_splits}",
                tok_per_s_now=round(p.tokens_per_s_now(), 1),
                tok_per_s_avg=round(p.tokens_per_s_avg(), 1),
                eta=_duration(eta) if eta is not None else "?",
                error_rows=p.error_rows,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._refresh_bar(force=True)
            self._bar.close()
            self._bar = None

    # ---- summary --------------------------------------------------------------------------
    def summary(self, summary: dict[str, Any], out: TextIO | None = None) -> None:
        out = out if out is not None else sys.stdout
        if self.json:
            print(
                json.dumps(
                    {**self._json_head("info", "summary"), "event": "summary", **summary}, default=str
                ),
                file=out,
                flush=True,
            )
            return
        wall = summary.get("wall_time_s", 0.0)
        if summary.get("task") == "score":  # it reads tokens and generates none: say what it read
            read = summary.get("run_prompt_tokens", 0)
            work = [
                f"tokens given   {summary.get('prompt_tokens', 0)} (contexts and what they score, the records' "
                "prompt_tokens; num_tokens counts the tokens scored)",
                f"this run       {read} tokens fed to the model in {wall:.1f} s = "
                f"{read / wall if wall else 0.0:.1f} tok/s (a span's last token is scored, never fed)",
            ]
        else:
            work = [
                f"cut by length  {summary.get('rows_cut_by_max_tokens', 0)} (finish_reason length: max_tokens reached)",
                f"tokens in      {summary.get('prompt_tokens', 0)}",
                f"tokens out     {summary.get('completion_tokens', 0)}",
                f"this run       {summary.get('run_completion_tokens', 0)} tokens generated in "
                f"{wall:.1f} s = {summary.get('output_tokens_per_s', 0.0):.1f} tok/s",
            ]
        lines = [
            f"rows ok        {summary.get('rows_ok', 0)}",
            f"rows error     {summary.get('rows_error', 0)}",
            *work,
            *_engine_start(summary),
            f"prefix cache   {summary.get('prefix_cache_hit_rate', 0.0):.1%} hit rate",
            *_expert_parallel(summary),
            f"numerics       {_numerics(summary.get('numerics') or {})}",
            *_mixed_revisions(summary),
            f"splits         {summary.get('splits', 0)}",
        ]
        if "run_split_attempts" in summary:
            lines.append(_split_counts(summary))
        if summary.get("rows_empty_text"):
            lines.append(_empty_texts(summary))
        if summary.get("duplicate_row_ids"):
            lines.append(
                f"duplicate ids  {summary['duplicate_row_ids']} input row(s) repeat an earlier row's id "
                "(they share seeds; job.unique_ids = true makes a repeat an error)"
            )
        if summary.get("run_worker_restarts"):
            lines.append(f"restarts       {summary['run_worker_restarts']} worker(s) replaced")
        for name, w in sorted(summary.get("run_workers", {}).items()):
            lines.append(
                f"worker {name:<7} {w.get('generated_tokens', 0)} tokens, "
                f"{w.get('output_tokens_per_s', 0.0):.1f} tok/s"
            )
        print(f"shardinfer: job {summary.get('run_id')} done", file=out)
        for line in lines:
            print("  " + line, file=out)
        out.flush()


def _split_counts(summary: dict[str, Any]) -> str:
    """The run's splits: those computed (a split found committed by another run when its turn came
    was handed out but not computed), committed, lost to another run's commit, and redone."""
    skipped = summary.get("run_splits_skipped", 0)
    lost = summary.get("run_splits_lost", 0)
    redone = summary.get("run_splits_redone", 0)
    why = ", ".join(f"{n}x {reason}" for reason, n in summary.get("run_redo_reasons", {}).items())
    line = (
        f"this run       {summary.get('run_split_attempts', 0) - skipped} split(s) computed, "
        f"{summary.get('run_splits_committed', 0)} committed"
    )
    if lost:
        line += f", {lost} lost the commit race (another attempt committed them first)"
    if skipped:
        line += f", {skipped} skipped (already committed by another run)"
    line += f", {redone} redone"
    if redone:
        line += f" ({why}; {summary.get('run_rows_redone', 0)} rows generated again)"
    return line


def _engine_start(summary: dict[str, Any]) -> list[str]:
    """The engine build's line: its seconds and, where kernels were compiled ahead, how many in how
    long (a fresh machine's first run compiles every kernel; later runs load them from the cache);
    then the batch the engines ran and, where requests were preempted, how many."""
    if "engine_start_s" not in summary:
        return []
    line = f"engine start   {summary['engine_start_s']:.1f} s"
    if summary.get("kernels_compiled_ahead"):
        line += (
            f" ({summary['kernels_compiled_ahead']} kernel variants compiled or loaded ahead in "
            f"{summary.get('kernels_compiled_ahead_s', 0.0):.1f} s)"
        )
    lines = [line]
    if "max_num_seqs" in summary:
        batch = f"batch          up to {summary['max_num_seqs']} sequences a step"
        if summary.get("run_preemptions"):
            batch += (
                f"; {summary['run_preemptions']} preemption(s): their tokens were computed again, as "
                "the KV cache could not hold the batch's contexts (a smaller engine.max_num_seqs avoids them)"
            )
        lines.append(batch)
    return lines


def _expert_parallel(summary: dict[str, Any]) -> list[str]:
    """Expert-parallel ranks: how many, their balance (moe_lb: the busiest rank's expert rows over
    the mean rank's, 1.0 balanced) and each rank's rows."""
    ep = summary.get("expert_parallel")
    if not ep:
        return []
    rows = ", ".join(str(r) for r in ep.get("rank_expert_rows", []))
    moved = f", {ep['rebalances']} rebalance(s)" if ep.get("rebalances") else ""
    return [
        f"experts        {ep['ranks']} ranks, moe_lb {ep['moe_lb']:.2f}{moved} (expert rows per rank: {rows})"
    ]


def _mixed_revisions(summary: dict[str, Any]) -> list[str]:
    """A line when the job's parts were written under more than one numerics revision (runs of
    versions whose kernels compute differently each committed splits); none otherwise."""
    revisions = summary.get("numerics_revisions") or {}
    if len(revisions) < 2:
        return []
    counts = ", ".join(f"{parts} under {name}" for name, parts in revisions.items())
    return [
        f"revisions      parts written by kernels that compute differently: {counts} (may differ in bits)"
    ]


def _numerics(n: dict[str, Any]) -> str:
    """dtype, weights, KV cache and invariance from a job's engine.numerics fingerprint component."""
    weights = n.get("quantization") or "as stored"
    return (
        f"{n.get('dtype', '?')} on {n.get('device_type', '?')}, weights {weights}, "
        f"KV cache {n.get('kv_cache_dtype', 'auto')}, batch invariant {'on' if n.get('batch_invariant', True) else 'off'}"
    )


def _empty_texts(summary: dict[str, Any]) -> str:
    """Records that ended before any text. Most of a job's rows so is the mark of a chat model given
    raw prompt text, which it answers with its end of turn: what messages_column is for."""
    empty, ok = summary["rows_empty_text"], summary.get("rows_ok", 0)
    line = f"empty texts    {empty} of {ok} ok record(s) ended before any text"
    if summary.get("prompts_as_written") and ok and empty * 2 > ok:
        line += (
            " (input.prompt_column sends the text as written, without the chat template: a chat model "
            "often ends at once; input.messages_column renders its chat template, docs/jobs.md)"
        )
    return line
