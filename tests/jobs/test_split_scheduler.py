"""The driver's split scheduler and the progress counts, without workers."""

from __future__ import annotations

from shardinfer.jobs.progress_counts import JobProgress
from shardinfer.jobs.split_scheduler import SplitScheduler
from shardinfer.splits import Split


def _splits(rows: list[int]) -> list[Split]:
    return [Split(i, 0, "f.parquet", 0, n) for i, n in enumerate(rows)]


def test_largest_estimate_first_ties_in_plan_order() -> None:
    sched = SplitScheduler(_splits([4, 9, 4, 1, 9]))
    order = [s.index for s in iter(lambda: sched.next_split("w"), None)]
    assert order == [1, 4, 0, 2, 3]


def test_custom_estimate_decides_the_order() -> None:
    weights = {0: 1.0, 1: 5.0, 2: 3.0}
    sched = SplitScheduler(_splits([10, 10, 10]), estimate=lambda s: weights[s.index])
    assert [s.index for s in sched.pulled_by("w")] == [1, 2, 0]


def test_each_split_is_handed_out_once_across_workers() -> None:
    sched = SplitScheduler(_splits([3] * 7))
    handed = []
    for turn in range(20):
        split = sched.next_split(f"w{turn % 3}")
        if split is not None:
            handed.append(split.index)
            sched.finish(f"w{turn % 3}", split.index, "committed")
    assert sorted(handed) == list(range(7))
    assert sched.finished
    assert sched.counts.attempts == 7 and sched.counts.kept == 7 and not sched.counts.redone


def test_dead_worker_splits_are_requeued_and_counted_as_redone() -> None:
    sched = SplitScheduler(_splits([5, 4, 3, 2]))
    a = sched.next_split("a")  # split 0
    b = sched.next_split("b")  # split 1
    c = sched.next_split("a")  # split 2
    assert (a.index, b.index, c.index) == (0, 1, 2)
    sched.finish("a", 0, "committed")
    assert sched.worker_lost("a", "killed by signal 9") == [2]
    assert not sched.finished
    # The requeued split goes before smaller pending ones (split 3 has fewer rows).
    assert sched.next_split("b").index == 2
    sched.finish("a", 2, "committed")  # a late report from the dead worker changes nothing
    assert sched.counts.kept == 1
    sched.finish("b", 2, "committed")
    sched.finish("b", 1, "committed")
    assert sched.next_split("b").index == 3
    sched.finish("b", 3, "skipped")
    assert sched.finished
    counts = sched.counts.to_summary()
    assert counts["run_split_attempts"] == 5
    assert counts["run_splits_committed"] == 3 and counts["run_splits_skipped"] == 1
    assert counts["run_splits_redone"] == 1
    assert counts["run_redo_reasons"] == {"killed by signal 9": 1}


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_progress_never_runs_past_the_total_and_uncounts_a_dead_workers_rows() -> None:
    clock = _Clock()
    p = JobProgress(total_records=40, total_splits=4, clock=clock)
    clock.t += 10
    p.generated("0", 10, 100)
    p.generated("1", 8, 80)
    assert p.rows_done == 18
    p.split_done("0", {"records": 10, "won": True, "rows_error": 2})
    assert (p.rows_done, p.splits_done, p.error_rows) == (18, 1, 2)
    p.worker_lost("1")  # its 8 rows of an uncommitted split will be generated again
    assert p.rows_done == 10 and p.rows_redone == 8
    p.generated("2", 10, 100)
    p.split_done("2", {"records": 10, "won": True})
    p.generated("0", 20, 200)
    p.split_done("0", {"records": 10, "won": True})
    p.split_done("0", {"records": 10, "won": True})
    assert p.rows_done == 40 and p.splits_done == 4
    # ETA: 10 s for the first 18 rows would leave (40-18) * 10/18 s; at the end it is 0.
    assert p.eta_s() == 0.0
    assert p.tokens == 480
    assert abs(p.tokens_per_s_avg() - 48.0) < 1e-9


def test_progress_eta_and_rates_from_a_fixed_clock() -> None:
    clock = _Clock()
    p = JobProgress(total_records=100, total_splits=2, clock=clock)
    assert p.eta_s() is None
    clock.t += 20
    p.generated("0", 25, 500)
    assert p.eta_s() == 60.0  # 75 rows left at 25 rows / 20 s
    clock.t += 40  # the first sample falls out of the trailing window
    p.generated("0", 25, 100)
    clock.t += 10
    assert p.tokens_per_s_avg() == 600 / 70
    assert p.tokens_per_s_now() == 100 / 50  # from the sample at t=20 (oldest inside the window)
    fields = p.fields()
    assert fields["rows_done"] == 50 and fields["rows_total"] == 100 and fields["error_rows"] == 0
