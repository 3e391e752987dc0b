"""Progress, logs and the final summary, for a terminal or for a scheduler's log collector.

On a TTY: a tqdm bar counting output records with output tokens/s. Otherwise (cron, Airflow,
Kubernetes) a bar's carriage returns make unreadable logs, so the same numbers come out as
plain lines every `interval_s`. `--log-format json` makes every line (logs, progress and the
summary) one JSON object carrying the run id, for log pipelines.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, TextIO


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
        self._total = 0
        self._records = 0
        self._tokens = 0
        self._splits_done = 0
        self._splits_total = 0
        self._started = time.monotonic()
        self._last_line = 0.0

    # ---- logs -----------------------------------------------------------------------------
    def log(self, level: str, message: str, **fields: Any) -> None:
        if level == "debug" and not self.verbose:
            return
        with self._lock:
            if self.json:
                record = {
                    "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "level": level,
                    "run_id": self.run_id,
                    "msg": message,
                    **fields,
                }
                line = json.dumps(record, default=str)
            else:
                extra = " ".join(f"{k}={v}" for k, v in fields.items())
                line = f"[shardinfer] {level.upper()} {message}" + (f" ({extra})" if extra else "")
            if self._bar is not None:
                self._bar.write(line, file=self.stream)
            else:
                print(line, file=self.stream, flush=True)

    def info(self, message: str, **fields: Any) -> None:
        self.log("info", message, **fields)

    def warn(self, message: str, **fields: Any) -> None:
        self.log("warning", message, **fields)

    def error(self, message: str, **fields: Any) -> None:
        self.log("error", message, **fields)

    # ---- progress -------------------------------------------------------------------------
    def start(self, total_records: int, total_splits: int) -> None:
        self._total, self._splits_total = total_records, total_splits
        self._started = self._last_line = time.monotonic()
        if not self.json and self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_records,
                unit="rows",
                file=self.stream,
                dynamic_ncols=True,
                desc="shardinfer",
                smoothing=0.1,
            )

    def handle(self, event: dict[str, Any]) -> None:
        """A worker event: 'progress' (records/tokens finished) or 'split_done' (a commit)."""
        kind = event.get("event")
        with self._lock:
            if kind == "progress":
                self._records += int(event.get("records", 0))
                self._tokens += int(event.get("completion_tokens", 0))
                if self._bar is not None:
                    self._bar.update(int(event.get("records", 0)))
            elif kind == "split_done":
                self._splits_done += 1
            if self._bar is not None:
                self._bar.set_postfix_str(
                    f"{self.tokens_per_s:.1f} tok/s, splits {self._splits_done}/{self._splits_total}",
                    refresh=kind == "split_done",
                )
        if kind == "split_done":
            self.log(
                "debug",
                "split committed" if event.get("won") else "split lost the commit race",
                split=event.get("split"),
                records=event.get("records"),
            )
        self._maybe_line()

    @property
    def tokens_per_s(self) -> float:
        return self._tokens / max(time.monotonic() - self._started, 1e-9)

    def _maybe_line(self, force: bool = False) -> None:
        if self._bar is not None:
            return
        now = time.monotonic()
        if not force and now - self._last_line < self.interval_s:
            return
        self._last_line = now
        self.log(
            "info",
            "progress",
            records=f"{self._records}/{self._total}",
            splits=f"{self._splits_done}/{self._splits_total}",
            tok_per_s=round(self.tokens_per_s, 1),
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # ---- summary --------------------------------------------------------------------------
    def summary(self, summary: dict[str, Any], out: TextIO | None = None) -> None:
        out = out if out is not None else sys.stdout
        if self.json:
            print(
                json.dumps({"event": "summary", "run_id": self.run_id, **summary}, default=str),
                file=out,
                flush=True,
            )
            return
        lines = [
            f"rows ok        {summary.get('rows_ok', 0)}",
            f"rows error     {summary.get('rows_error', 0)}",
            f"cut by length  {summary.get('rows_cut_by_max_tokens', 0)} (finish_reason length: max_tokens reached)",
            f"tokens in      {summary.get('prompt_tokens', 0)}",
            f"tokens out     {summary.get('completion_tokens', 0)}",
            f"this run       {summary.get('run_completion_tokens', 0)} tokens generated in "
            f"{summary.get('wall_time_s', 0.0):.1f} s = {summary.get('output_tokens_per_s', 0.0):.1f} tok/s",
            f"prefix cache   {summary.get('prefix_cache_hit_rate', 0.0):.1%} hit rate",
            f"splits         {summary.get('splits', 0)}",
        ]
        print(f"shardinfer: job {summary.get('run_id')} done", file=out)
        for line in lines:
            print("  " + line, file=out)
        out.flush()
