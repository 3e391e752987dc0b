"""Per-part reads at finalize and in `status` run several at once (writers.parts.map_parts), with
results in the parts' order and a failure raised only once no read runs."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from store_helpers import commit_all, new_store, plan, rows_for

from shardinfer.pipeline.job import committed_totals
from shardinfer.pipeline.output_ids import committed_row_ids
from shardinfer.writers import parts as parts_module
from shardinfer.writers.parts import PART_READ_CONCURRENCY, map_parts


def test_reads_overlap_and_results_keep_the_items_order() -> None:
    # Every call waits for PART_READ_CONCURRENCY calls to be in flight together: run one at a
    # time, the barrier would time out and break.
    barrier = threading.Barrier(PART_READ_CONCURRENCY, timeout=30)

    def read(i: int) -> int:
        barrier.wait()
        return i * i

    items = list(range(PART_READ_CONCURRENCY * 3))
    assert map_parts(read, items) == [i * i for i in items]


def test_the_first_failure_in_order_is_raised_once_no_call_runs() -> None:
    started: list[int] = []
    ended: list[int] = []
    lock = threading.Lock()
    release = threading.Event()

    def read(i: int) -> int:
        with lock:
            started.append(i)
        if i == 9:
            raise ValueError("part 9")
        if i == 5:
            release.wait(30)  # part 9 fails while part 5 is still being read
            raise ValueError("part 5")
        if i == 9 + PART_READ_CONCURRENCY - 1:
            release.set()
        with lock:
            ended.append(i)
        return i

    with pytest.raises(ValueError, match="part 5"):
        map_parts(read, list(range(40)))
    # Every call that started has ended (the two failures aside); none started later runs on.
    assert sorted(ended) == sorted(i for i in started if i not in (5, 9))


def test_one_item_runs_on_the_callers_thread() -> None:
    assert map_parts(lambda _: threading.current_thread() is threading.main_thread(), [0]) == [True]
    assert map_parts(lambda x: x, []) == []


def test_totals_and_ids_over_many_parts_equal_a_part_by_part_reading(
    out_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over more parts than one batch, the concurrent totals and ids are those of the parts' rows
    in split order, and equal a reading one part at a time."""
    splits = plan(PART_READ_CONCURRENCY * 2 + 3)
    store = new_store(out_url, splits)
    commit_all(store, splits)
    committed = store.committed()
    revisions: Counter[str] = Counter()
    totals = committed_totals(store, committed, revisions)
    expected_rows = [row for split in splits for row in rows_for(split)]
    assert totals["records"] == len(expected_rows)
    assert revisions == Counter({"unrecorded": len(splits)})  # these parts carry no revision
    assert list(committed_row_ids(store, committed)) == [row["row_id"] for row in expected_rows]

    monkeypatch.setattr(parts_module, "PART_READ_CONCURRENCY", 1)
    assert committed_totals(store, committed) == totals
    assert list(committed_row_ids(store, committed)) == [row["row_id"] for row in expected_rows]
