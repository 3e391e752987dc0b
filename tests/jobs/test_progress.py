"""What a person watching a job sees: a live line on a terminal, log lines otherwise."""

from __future__ import annotations

import io
import json
import re

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


def test_live_line_reads_as_documented_without_an_empty_field() -> None:
    # tqdm puts its own ", " before the postfix: a second separator in the format made an empty field.
    term = _Terminal()
    reporter = Reporter("r4", stream=term)
    _feed(reporter)
    reporter.close()
    lines = term.getvalue().replace("\r", "\n").strip().splitlines()
    assert lines[0].endswith("| 0/8 rows [00:00, splits 0/2, 0 tok/s now, 0 avg, ETA ?, 0 error rows]")
    tail = r"6/8 rows \[\d\d:\d\d, splits 1/2, \d+ tok/s now, \d+ avg, ETA \d+:\d\d, 1 error rows\]"
    assert re.search(tail + "$", lines[-1]), lines[-1]
    for line in lines:
        assert ", ," not in line and ", ]" not in line and "[00:00, ]" not in line, line


def test_splits_recomputed_at_the_end_join_the_totals() -> None:
    # A repair after the workers are done commits splits the start was not told of: the totals grow
    # with them, so the line never says more splits done than there are (it said splits 2/1).
    out = io.StringIO()
    reporter = Reporter("r5", log_format="json", stream=out, interval_s=0.0)
    reporter.start(total_records=4, total_splits=1)
    reporter.handle({"event": "split_done", "worker": "0", "split": 0, "won": True, "records": 4})
    reporter.add_work(records=4, splits=1)
    reporter.handle({"event": "split_done", "worker": "repair", "split": 3, "won": True, "records": 4})
    progress = [json.loads(line) for line in out.getvalue().splitlines()][-1]
    assert (progress["splits_done"], progress["splits_total"]) == (2, 2)
    assert (progress["rows_done"], progress["rows_total"]) == (8, 8)


def test_the_summary_does_not_count_skipped_splits_as_computed() -> None:
    # 6 splits handed out: 1 was already committed by another run (skipped), 1 lost the commit race.
    out = io.StringIO()
    Reporter("r6").summary(
        {
            "run_split_attempts": 6,
            "run_splits_committed": 4,
            "run_splits_lost": 1,
            "run_splits_skipped": 1,
            "run_splits_redone": 0,
            "run_redo_reasons": {},
        },
        out=out,
    )
    line = next(x for x in out.getvalue().splitlines() if "split(s) computed" in x)
    assert line.strip() == (
        "this run       5 split(s) computed, 4 committed, 1 lost the commit race (another attempt committed them "
        "first), 1 skipped (already committed by another run), 0 redone"
    )


def test_the_summary_says_when_most_records_ended_before_any_text() -> None:
    def printed(**fields: object) -> str:
        out = io.StringIO()
        Reporter("r4", stream=io.StringIO()).summary({"rows_ok": 24, **fields}, out=out)
        return out.getvalue()

    most = printed(rows_empty_text=21, prompts_as_written=True)
    assert "empty texts    21 of 24 ok record(s) ended before any text" in most
    assert "input.messages_column renders its chat template" in most
    # A few empty texts, or chat messages already rendered by the template: the count, no advice.
    few = printed(rows_empty_text=3, prompts_as_written=True)
    assert "3 of 24 ok record(s)" in few and "messages_column" not in few
    assert "messages_column" not in printed(rows_empty_text=21, prompts_as_written=False)
    assert "empty texts" not in printed(rows_empty_text=0)
