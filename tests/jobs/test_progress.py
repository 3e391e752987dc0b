"""What a person watching a job sees: a live line on a terminal, log lines otherwise."""

from __future__ import annotations

import io
import json

from shardinfer.jobs.progress import Reporter


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _feed(reporter: Reporter) -> None:
    reporter.start(total_records=8, total_splits=2)
    reporter.handle({"event": "progress", "worker": "0", "records": 4, "completion_tokens": 20})
    reporter.handle(
        {"event": "split_done", "worker": "0", "split": 0, "won": True, "records": 4, "rows_error": 1}
    )
    reporter.handle({"event": "progress", "worker": "1", "records": 2, "completion_tokens": 10})


def test_terminal_gets_a_live_line_with_rows_splits_rates_eta_and_errors() -> None:
    term = _Terminal()
    reporter = Reporter("r1", stream=term)
    _feed(reporter)
    reporter.close()
    last = term.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    assert "6/8 rows" in last and "splits 1/2" in last and "1 error rows" in last
    assert "tok/s now" in last and "avg" in last and "ETA" in last


def test_json_progress_lines_carry_numbers() -> None:
    out = io.StringIO()
    reporter = Reporter("r2", log_format="json", stream=out, interval_s=0.0)
    _feed(reporter)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    progress = [line for line in lines if line["msg"] == "progress"][-1]
    assert progress["rows_done"] == 6 and progress["rows_total"] == 8
    assert progress["splits_done"] == 1 and progress["splits_total"] == 2 and progress["error_rows"] == 1
    assert isinstance(progress["tok_per_s_avg"], float) and isinstance(progress["eta_s"], float)
    assert progress["run_id"] == "r2"


def test_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    reporter = Reporter("r3", stream=out, interval_s=0.0)
    _feed(reporter)
    last = out.getvalue().strip().splitlines()[-1]
    assert last.startswith("[shardinfer] INFO progress (rows=6/8 splits=1/2")
    assert "error_rows=1" in last and "\r" not in out.getvalue()
