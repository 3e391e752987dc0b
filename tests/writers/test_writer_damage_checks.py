"""Reading an output location creates nothing; the cheap listing check of committed parts finds
deleted and truncated parts; a repair deletes `_SUCCESS` before recomputing."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_helpers import commit_all, new_store, plan, table_for

from shardinfer.writers import OutputStore


def test_opening_and_reading_a_store_creates_nothing(tmp_path: Path) -> None:
    where = tmp_path / "x" / "nonexist"
    store = OutputStore(str(where))
    assert store.read_job() is None and store.read_success() is None
    assert not store.has_protocol_files() and store.listed_damage({}) == {}
    assert store.location_problem() is not None and "(it does not exist)" in str(store.location_problem())
    assert not (tmp_path / "x").exists()


def test_an_existing_folder_gets_commits_only_with_its_first_marker(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    store = OutputStore(str(out))
    assert store.read_job() is None and store.location_problem() is None
    assert list(out.iterdir()) == []
    splits = plan(1)
    store = new_store(str(out), splits)
    part = store.write_part(splits[0], "a1", table_for(splits[0]), {})
    assert not (out / "_commits").exists()
    assert store.commit(splits[0], part)
    assert [p.name for p in (out / "_commits").iterdir()] == [f"00000.{store.generation}.0.json"]
    store.finalize({})  # stale-temporary cleanup copes with whatever folders exist
    assert (out / "_SUCCESS").exists()


def test_a_file_is_not_an_output_location(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text("[job]\n")
    assert "it is a file" in str(OutputStore(str(path)).location_problem())
    assert path.read_text() == "[job]\n"


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_listing_finds_deleted_and_truncated_parts_without_opening_them(out_url: str, damage: str) -> None:
    splits = plan(3)
    store = new_store(out_url, splits)
    parts = commit_all(store, splits)
    store.finalize({})
    assert store.listed_damage(store.committed()) == {}
    path = f"{store.root}/{parts[1].name}"
    if damage == "deleted":
        store.fs.rm_file(path)
        why = "its part file is missing"
    else:
        store.fs.pipe_file(path, store.fs.cat_file(path)[:100])
        why = f"its part file has 100 bytes, the marker records {parts[1].bytes} (truncated or replaced)"
    assert store.listed_damage(store.committed()) == {1: f"{parts[1].name}: {why}"}


def test_planning_a_repair_deletes_success_first(out_url: str) -> None:
    splits = plan(2)
    store = new_store(out_url, splits)
    parts = commit_all(store, splits)
    store.finalize({})
    store.fs.rm_file(f"{store.root}/{parts[0].name}")
    markers = store.committed()
    store.plan_repairs({}, markers)  # nothing damaged: nothing touched
    assert store.read_success() is not None
    store.plan_repairs(store.damaged_parts(markers), markers)
    assert store.read_success() is None and store.committed_indexes() == {1}
    assert store.commit(splits[0], store.write_part(splits[0], "r1", table_for(splits[0]), {}))
    success = store.finalize({})
    assert [f["marker"] for f in success["files"]] == [
        f"00000.{store.generation}.1.json",
        f"00001.{store.generation}.0.json",
    ]


def test_on_s3_reading_creates_nothing_and_the_listing_sees_sizes(s3_bucket) -> None:
    options = s3_bucket.storage_options
    absent = OutputStore(s3_bucket.url("nothing/here"), options)
    assert absent.read_job() is None and "(it does not exist)" in str(absent.location_problem())
    absent.fs.invalidate_cache()
    assert absent.fs.find(s3_bucket.url("nothing")) == []
    splits = plan(2)
    store = new_store(s3_bucket.url("out"), splits, storage_options=options)
    assert store.location_problem() is None
    parts = commit_all(store, splits)
    store.finalize({})
    assert store.listed_damage(store.committed()) == {}
    path = f"{store.root}/{parts[0].name}"
    store.fs.pipe_file(path, store.fs.cat_file(path)[:64])
    store.fs.rm_file(f"{store.root}/{parts[1].name}")
    assert store.listed_damage(store.committed()) == {
        0: f"{parts[0].name}: its part file has 64 bytes, the marker records {parts[0].bytes} (truncated or replaced)",
        1: f"{parts[1].name}: its part file is missing",
    }
