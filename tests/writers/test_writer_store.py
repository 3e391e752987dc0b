"""OutputStore on local disk and memory://: parts, commit markers, races, finalize, _SUCCESS."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from store_helpers import SCHEMA, full_rows, new_store, plan, race_commits, rows_for, table_for

from shardinfer.splits import Split
from shardinfer.writers import (
    CorruptOutputError,
    IncompleteOutputError,
    JobFileConflictError,
    OutputStore,
    make_job_record,
)


def _files(store: OutputStore) -> list[str]:
    store.fs.invalidate_cache()
    return sorted(os.path.basename(p) for p in store.fs.find(store.root))


def test_write_commit_read_back_exact_rows(out_url: str) -> None:
    splits = plan(3)
    store = new_store(out_url, splits)
    for split in reversed(splits):  # commit order must not matter, split order does
        part = store.write_part(split, "a1", table_for(split), {"run_id": "run-1"})
        assert (part.name, part.rows) == (f"part-{split.name}-{store.generation}-a1.parquet", 3)
        assert store.commit(split, part) is True
    want = [row for s in splits for row in rows_for(s)]
    table = store.read_committed_table()
    assert table.to_pylist() == full_rows(want)
    assert table.schema.equals(SCHEMA, check_metadata=False)
    meta = pq.read_metadata(
        store.fs.open(f"{store.root}/part-00001-{store.generation}-a1.parquet", "rb")
    ).metadata
    assert meta[b"run_id"] == b"run-1" and meta[b"shardinfer.split"] == b"00001"
    assert set(store.committed()) == {0, 1, 2}


def test_racing_threads_commit_exactly_once(out_url: str) -> None:
    (split,) = plan(1)
    store = new_store(out_url, [split])
    writers = 6
    results = race_commits(out_url, split, writers, "t")
    winners = [name for name, won in results.items() if won]
    assert len(results) == writers and len(winners) == 1
    assert store.committed()[0]["part"] == f"part-00000-{store.generation}-{winners[0]}.parquet"
    # Losers deleted their own parts: only the winner's part is left, before any finalize.
    assert [f for f in _files(store) if f.startswith("part-")] == [
        f"part-00000-{store.generation}-{winners[0]}.parquet"
    ]
    assert store.finalize({})["orphans_deleted"] == []


def _process_attempt(url: str, split: dict, name: str, start: object, results: object) -> None:
    s = Split.from_dict(split)
    store = OutputStore(url)
    part = store.write_part(s, name, table_for(s), {})
    start.wait()  # type: ignore[attr-defined]
    results.put((name, store.commit(s, part)))  # type: ignore[attr-defined]


def test_racing_processes_commit_exactly_once(tmp_path: Path) -> None:
    (split,) = plan(1)
    url = str(tmp_path / "out")
    store = new_store(url, [split])
    # fork: a spawned child would re-import the package (and torch) for seconds; the child only
    # writes Parquet and creates files, which is safe after fork.
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_process_attempt, args=(url, split.to_dict(), f"p{i}", start, results))
        for i in range(3)
    ]
    for p in procs:
        p.start()
    start.set()
    outcome = dict(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    winners = [n for n, won in outcome.items() if won]
    assert len(winners) == 1
    assert [f for f in _files(store) if f.startswith("part-")] == [
        f"part-00000-{store.generation}-{winners[0]}.parquet"
    ]
    assert store.read_committed_table().to_pylist() == full_rows(rows_for(split))


def test_finalize_deletes_orphans_and_writes_success(out_url: str) -> None:
    splits = plan(2)
    store = new_store(out_url, splits)
    with pytest.raises(IncompleteOutputError, match=r"2 of 2 splits are not committed"):
        store.finalize({})
    # A crashed attempt (part written, never committed) and a committed retry of the same split.
    store.write_part(splits[0], "crashed", table_for(splits[0]), {})
    parts = [store.write_part(s, "ok", table_for(s), {}) for s in splits]
    for s, p in zip(splits, parts, strict=True):
        assert store.commit(s, p)
    success = store.finalize({"rows_ok": 3, "rows_error": 3})
    assert _files(store) == [
        f"00000.{store.generation}.0.json",
        f"00001.{store.generation}.0.json",
        "_SUCCESS",
        "_job.json",
        f"part-00000-{store.generation}-ok.parquet",
        f"part-00001-{store.generation}-ok.parquet",
    ]
    assert success["orphans_deleted"] == [f"part-00000-{store.generation}-crashed.parquet"]
    assert success["run_id"] == "run-1" and success["fingerprint"] == {"model": "tiny", "seed": 7}
    assert success["files"] == [
        {
            "split": i,
            "path": p.name,
            "marker": f"{i:05d}.{store.generation}.0.json",
            "rows": 3,
            "bytes": p.bytes,
            "sha256": p.sha256,
        }
        for i, p in enumerate(parts)
    ]
    assert success["totals"] == {"splits": 2, "rows": 6, "bytes": parts[0].bytes + parts[1].bytes}
    assert success["summary"] == {"rows_ok": 3, "rows_error": 3}
    assert (
        success["timings"]["first_commit"]
        <= success["timings"]["last_commit"]
        <= success["timings"]["finalized"]
    )
    assert store.read_success() == success
    # Finalizing again (an "already done" re-run) changes nothing but the timestamp.
    again = store.finalize({"rows_ok": 3, "rows_error": 3})
    assert again["files"] == success["files"] and again["orphans_deleted"] == []


def test_a_commit_whose_first_try_landed_is_recognised(out_url: str) -> None:
    (split,) = plan(1)
    store = new_store(out_url, [split])
    part = store.write_part(split, "a1", table_for(split), {})
    assert store.commit(split, part)
    marker = store.committed()[0]
    # A retry after a lost response finds the marker naming its own part: still a win, part kept.
    assert store.commit(split, part)
    assert store.committed()[0] == marker
    assert f"part-00000-{store.generation}-a1.parquet" in _files(store)


def test_job_file_is_written_once(out_url: str) -> None:
    splits = plan(2)
    store = new_store(out_url, splits)
    job = store.read_job()
    assert job is not None and job["run_id"] == "run-1"
    store.write_job(job)  # the same content again: a no-op
    with pytest.raises(JobFileConflictError, match="run 'run-1'"):
        store.write_job(make_job_record("run-2", {"model": "other"}, splits))


def test_tampered_part_is_detected_and_clear_removes_everything(out_url: str) -> None:
    (split,) = plan(1)
    store = new_store(out_url, [split])
    part = store.write_part(split, "a1", table_for(split), {})
    store.commit(split, part)
    store.fs.pipe_file(f"{store.root}/{part.name}", b"x" + store.fs.cat_file(f"{store.root}/{part.name}"))
    with pytest.raises(CorruptOutputError, match="sha256"):
        store.read_committed_table()
    store.clear()
    assert store.read_job() is None and store.committed() == {} and store.read_success() is None
    assert [f for f in _files(store) if f.startswith("part-")] == []


def test_bad_attempt_names_and_tables_are_refused(out_url: str) -> None:
    (split,) = plan(1)
    store = new_store(out_url, [split])
    with pytest.raises(ValueError, match="attempt='a/b'"):
        store.write_part(split, "a/b", table_for(split), {})
    with pytest.raises(ValueError, match="lacks column 'seed'"):
        store.write_part(split, "a1", table_for(split).drop_columns(["seed"]), {})


def test_reused_attempt_name_with_other_content_is_an_error(out_url: str) -> None:
    (split,) = plan(1)
    store = new_store(out_url, [split])
    assert store.commit(split, store.write_part(split, "same", table_for(split), {}))
    clash = store.write_part(split, "same", table_for(split).slice(0, 1), {})
    with pytest.raises(CorruptOutputError, match="attempt names must be unique"):
        store.commit(split, clash)
