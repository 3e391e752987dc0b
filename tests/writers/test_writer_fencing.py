"""Generations fence a job's commits; finalize verifies parts; damaged parts are recommitted
under the next marker number; `_SUCCESS` is checked against the markers."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from store_helpers import commit_all, full_rows, new_store, plan, race_commits, rows_for, table_for

from shardinfer.writers import (
    CorruptOutputError,
    DamagedPartsError,
    OutputStore,
    StaleGenerationError,
    make_job_record,
)


def _start_over(url: str, splits: list) -> OutputStore:
    """What `job.start_over` does: the new generation into _job.json first, then the clear."""
    other = OutputStore(url)
    other.replace_job(make_job_record("run-b", {"model": "other", "hash": "b" * 64}, splits))
    other.clear(keep_job=True)
    return other


def test_commit_of_a_started_over_generation_is_refused(out_url: str) -> None:
    splits = plan(2)
    old = new_store(out_url, splits)
    part = old.write_part(splits[0], "a1", table_for(splits[0]), {})
    new = _start_over(out_url, splits)
    with pytest.raises(StaleGenerationError, match="started over"):
        old.commit(splits[0], part)
    assert new.committed() == {}
    with pytest.raises(StaleGenerationError):
        old.finalize({})


def test_a_marker_landing_after_the_clear_is_never_counted(out_url: str) -> None:
    """The old job passed its fence check just before the start-over and commits after the clear."""
    splits = plan(2)
    old = new_store(out_url, splits)
    new = _start_over(out_url, splits)
    stale_part = old.write_part(splits[0], "old", table_for(splits[0]), {})  # the old job works on
    old.check_fence = lambda: None  # type: ignore[method-assign]  # the check already passed
    assert old.commit(splits[0], stale_part)
    assert new.committed() == {} and new.committed_indexes() == set()
    for s in splits:
        assert new.commit(s, new.write_part(s, "b", table_for(s), {}))
    success = new.finalize({})
    assert [f["path"] for f in success["files"]] == [
        f"part-0000{i}-{new.generation}-b.parquet" for i in range(2)
    ]
    assert stale_part.name in success["orphans_deleted"]
    assert success["generation"] == new.generation != old.generation
    names = [os.path.basename(p) for p in new.fs.find(new.root)]
    assert not any(old.generation in n for n in names)


def test_a_start_over_mid_create_leaves_the_old_writers_temporary_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clear runs between the old writer's temporary marker file and its link into place: the
    temporary file is not the clear's to delete, so the old commit lands (never counted) instead
    of failing with a missing file, and the old run's next fence check stops it."""
    import shardinfer.storage as storage

    url, splits = str(tmp_path / "out"), plan(2)
    old = new_store(url, splits)
    part = old.write_part(splits[0], "old", table_for(splits[0]), {})
    old.check_fence()
    old.check_fence = lambda: None  # type: ignore[method-assign]  # passed just before the start-over
    write_temp = storage._write_temp
    started: list[OutputStore] = []

    def temp_then_start_over(path: str, data: bytes) -> str:
        tmp = write_temp(path, data)
        if "_commits" in path and not started:
            started.append(_start_over(url, splits))
        return tmp

    monkeypatch.setattr(storage, "_write_temp", temp_then_start_over)
    assert old.commit(splits[0], part)
    assert started[0].committed() == {}
    del old.check_fence
    with pytest.raises(StaleGenerationError, match="started over"):
        old.check_fence()


def test_a_store_error_while_started_over_is_reported_as_the_start_over(
    out_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a cleared location does to an in-flight marker write, the old run is told that the
    job was started over (exit 78), not shown a bare missing-file error."""
    import shardinfer.writers.output_store as output_store

    splits = plan(2)
    old = new_store(out_url, splits)
    part = old.write_part(splits[0], "old", table_for(splits[0]), {})
    old.check_fence()
    fence = old.check_fence
    old.check_fence = lambda: None  # type: ignore[method-assign]
    create = output_store.create_exclusive

    def start_over_then_fail(fs: object, path: str, data: bytes) -> None:
        if "_commits" in path:
            _start_over(out_url, splits)
            old.check_fence = fence  # type: ignore[method-assign]
            raise FileNotFoundError(2, "No such file or directory", path)
        create(fs, path, data)  # type: ignore[arg-type]

    monkeypatch.setattr(output_store, "create_exclusive", start_over_then_fail)
    with pytest.raises(StaleGenerationError, match="started over"):
        old.commit(splits[0], part)


@pytest.mark.parametrize("damage", ["deleted", "truncated", "replaced"])
def test_finalize_refuses_damaged_parts_and_a_repair_wins_once(out_url: str, damage: str) -> None:
    splits = plan(3)
    store = new_store(out_url, splits)
    parts = commit_all(store, splits)
    path = f"{store.root}/{parts[1].name}"
    if damage == "deleted":
        store.fs.rm_file(path)
    elif damage == "truncated":
        store.fs.pipe_file(path, store.fs.cat_file(path)[:100])
    else:  # another split's valid part under this name: same size is not guaranteed, same hash is not
        store.fs.pipe_file(path, store.fs.cat_file(f"{store.root}/{parts[2].name}"))
    with pytest.raises(DamagedPartsError, match=r"split 1: part-00001-") as info:
        store.finalize({})
    assert list(info.value.damaged) == [1]
    assert store.read_success() is None
    # Repair: two repairers race on the next marker number; exactly one wins.
    markers = store.committed()
    damaged = store.damaged_parts(markers)
    assert list(damaged) == [1]
    store.plan_repairs(damaged, markers)
    assert store.committed_indexes() == {0, 2}
    rival = OutputStore(out_url)
    rival.plan_repairs(damaged, markers)
    won = [store.commit(splits[1], store.write_part(splits[1], "r1", table_for(splits[1]), {}))]
    won.append(rival.commit(splits[1], rival.write_part(splits[1], "r2", table_for(splits[1]), {})))
    assert won == [True, False]
    assert store.committed()[1]["marker_file"] == f"00001.{store.generation}.1.json"
    success = store.finalize({})
    assert [f["marker"] for f in success["files"]][1] == f"00001.{store.generation}.1.json"
    assert store.read_committed_table().to_pylist() == full_rows([r for s in splits for r in rows_for(s)])


def test_marker_deleted_after_success_is_reported_not_read_as_complete(out_url: str) -> None:
    splits = plan(3)
    store = new_store(out_url, splits)
    for s in splits:
        assert store.commit(s, store.write_part(s, "a1", table_for(s), {}))
    success = store.finalize({})
    assert store.success_problems(success) == []
    store.fs.rm_file(f"{store.root}/_commits/00002.{store.generation}.0.json")
    assert store.success_problems(success) == [
        "split 2 is listed in _SUCCESS but its commit marker is missing"
    ]
    with pytest.raises(CorruptOutputError, match="split 2 is listed in _SUCCESS but its commit marker"):
        OutputStore(out_url).read_committed_table()


def test_store_that_ignores_create_if_absent_loses_the_race_on_read_back(
    out_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that overwrites instead of refusing: the commit reads its marker back and sees that
    another attempt's marker replaced its own, so it reports the loss and deletes its own part."""
    import shardinfer.writers.output_store as output_store

    (split,) = plan(1)
    store = new_store(out_url, [split])
    first = store.write_part(split, "first", table_for(split), {})
    rival = OutputStore(out_url)
    second = rival.write_part(split, "second", table_for(split), {})
    plain_put = output_store.put_bytes

    def overwriting_create(fs: object, path: str, data: bytes) -> None:
        plain_put(fs, path, data)  # type: ignore[arg-type]
        if b"first" in data:  # the rival's write lands between our PUT and our read-back
            monkeypatch.setattr(output_store, "create_exclusive", plain_put)
            assert rival.commit(split, second)

    monkeypatch.setattr(output_store, "create_exclusive", overwriting_create)
    assert store.commit(split, first) is False
    assert store.committed()[0]["part"] == second.name
    assert not store.fs.exists(f"{store.root}/{first.name}")


def test_stale_temporary_files_are_removed_at_finalize_fresh_ones_kept(tmp_path: Path) -> None:
    splits = plan(1)
    store = new_store(str(tmp_path / "out"), splits)
    stale, fresh = tmp_path / "out" / ".tmp-stale", tmp_path / "out" / "_commits" / ".tmp-fresh"
    stale.write_bytes(b"x")
    fresh.parent.mkdir()  # a marker being created makes `_commits/` (the store makes no folder)
    fresh.write_bytes(b"y")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    assert store.commit(splits[0], store.write_part(splits[0], "a", table_for(splits[0]), {}))
    store.finalize({})
    assert not stale.exists() and fresh.exists()


def test_racing_commits_still_have_one_winner(out_url: str) -> None:
    (split,) = plan(1)
    new_store(out_url, [split])
    results = race_commits(out_url, split, 6, "w")
    assert sorted(results.values()) == [False] * 5 + [True]
