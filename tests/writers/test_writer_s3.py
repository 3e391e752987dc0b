"""OutputStore against a real S3 API (moto on 127.0.0.1): conditional create, races, injected faults."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import s3fs
from store_helpers import full_rows, new_store, plan, race_commits, rows_for, table_for

from shardinfer.storage import RetryPolicy
from shardinfer.writers import OutputStore, StorageError

FAST_RETRY = RetryPolicy(attempts=12, base_delay=0.01, max_delay=0.05)


def _bare(options: dict[str, Any]) -> dict[str, Any]:
    """Client options with botocore's own retries off, so each injected fault reaches our layer."""
    return {**options, "config_kwargs": {"retries": {"mode": "standard", "total_max_attempts": 1}}}


def _bare_store(
    url: str, options: dict[str, Any], splits: list, retries: RetryPolicy = FAST_RETRY
) -> OutputStore:
    store = OutputStore(url, _bare(options), retries=retries)
    store.fs.retries = 1  # and s3fs's inner retry loop too
    store.write_job(store.read_job() or _job(splits))
    return store


def _job(splits: list) -> dict[str, Any]:
    from shardinfer.writers import make_job_record

    return make_job_record("run-1", {"model": "tiny", "seed": 7}, splits)


def test_s3fs_exclusive_create_is_honoured_by_moto(s3_bucket) -> None:
    fs = s3fs.S3FileSystem(**s3_bucket.storage_options)
    path = f"{s3_bucket.name}/marker.json"
    with fs.open(path, "xb") as f:
        f.write(b"first")
    with pytest.raises(FileExistsError), fs.open(path, "xb") as f:
        f.write(b"second")
    # A multipart upload (over the 5 MiB part size) is conditional too: CompleteMultipartUpload.
    with pytest.raises(FileExistsError), fs.open(path, "xb", block_size=5 * 2**20) as f:
        f.write(b"m" * (6 * 2**20))
    assert fs.cat_file(path) == b"first"


def test_full_cycle_on_s3(s3_bucket) -> None:
    splits = plan(3)
    store = new_store(s3_bucket.url("out"), splits, storage_options=s3_bucket.storage_options)
    store.write_part(splits[1], "crashed", table_for(splits[1]), {})
    for s in splits:
        assert store.commit(s, store.write_part(s, "a1", table_for(s), {}))
    success = store.finalize({})
    assert success["orphans_deleted"] == [f"part-00001-{store.generation}-crashed.parquet"]
    assert store.read_committed_table().to_pylist() == full_rows([r for s in splits for r in rows_for(s)])
    fs = s3fs.S3FileSystem(**s3_bucket.storage_options)
    fs.invalidate_cache()
    names = sorted(p.rsplit("/", 1)[1] for p in fs.find(s3_bucket.url("out")))
    assert names == [f"0000{i}.{store.generation}.0.json" for i in range(3)] + ["_SUCCESS", "_job.json"] + [
        f"part-0000{i}-{store.generation}-a1.parquet" for i in range(3)
    ]


def test_racing_writers_on_s3_commit_exactly_once(s3_bucket) -> None:
    (split,) = plan(1)
    url = s3_bucket.url("race")
    store = new_store(url, [split], storage_options=s3_bucket.storage_options)
    writers = 4
    results = race_commits(url, split, writers, "w", s3_bucket.storage_options)
    winners = [n for n, won in results.items() if won]
    assert len(results) == writers and len(winners) == 1
    fs = s3fs.S3FileSystem(**s3_bucket.storage_options)
    fs.invalidate_cache()
    parts = [p.rsplit("/", 1)[1] for p in fs.find(url) if "/part-" in p]
    assert parts == [f"part-00000-{store.generation}-{winners[0]}.parquet"]
    assert store.finalize({})["orphans_deleted"] == []


@pytest.mark.parametrize("fault", ["503", "500", "drop", "drop_after"])
def test_transient_faults_are_retried_and_lose_nothing(s3_bucket, fault_proxy, fault: str) -> None:
    proxy = fault_proxy(every=3, faults=(fault,))
    splits = plan(3)
    store = _bare_store(f"s3://{s3_bucket.name}/faults-{fault}", proxy.storage_options(), splits)
    for s in splits:
        assert store.commit(s, store.write_part(s, "a1", table_for(s), {})) is True
    success = store.finalize({})
    assert success["totals"]["rows"] == 9 and success["orphans_deleted"] == []
    assert store.read_committed_table().to_pylist() == full_rows([r for s in splits for r in rows_for(s)])
    assert proxy.faults_injected.count(fault) >= 5


def test_default_client_settings_ride_out_mixed_faults(s3_bucket, fault_proxy) -> None:
    proxy = fault_proxy(every=3, faults=("drop", "503", "drop_after", "500"))
    splits = plan(2)
    store = new_store(
        f"s3://{s3_bucket.name}/mixed", splits, storage_options=proxy.storage_options(), retries=FAST_RETRY
    )
    for s in splits:
        assert store.commit(s, store.write_part(s, "a1", table_for(s), {}))
    store.finalize({})
    assert store.read_committed_table().to_pylist() == full_rows([r for s in splits for r in rows_for(s)])
    assert len(proxy.faults_injected) >= 4


def test_commit_whose_response_was_lost_is_still_won(s3_bucket, fault_proxy) -> None:
    proxy = fault_proxy(every=0)
    (split,) = plan(1)
    store = _bare_store(f"s3://{s3_bucket.name}/lost", proxy.storage_options(), [split])
    part = store.write_part(split, "a1", table_for(split), {})
    store.check_exclusive_create()  # done once per store, before its first commit
    store.check_fence()  # the commit's first request reads _job.json; aim the fault at the marker PUT
    store.read_job = lambda: {"generation": store.generation}  # type: ignore[method-assign]
    before = len(proxy.requests)
    proxy.fail_next("drop_after")  # moto creates the marker; the client never hears back
    assert store.commit(split, part) is True
    # The retry's conditional PUT got 412 (FileExistsError); the marker named our part, so we won.
    puts = [(m, f) for m, _, f in proxy.requests[before:] if m == "PUT"]
    assert puts[:2] == [("PUT", "drop_after"), ("PUT", None)]
    assert store.committed()[0]["part"] == part.name
    assert store.read_committed_table().num_rows == 3


def test_storage_error_after_bounded_retries(s3_bucket, fault_proxy) -> None:
    proxy = fault_proxy(every=0)
    (split,) = plan(1)
    store = _bare_store(
        f"s3://{s3_bucket.name}/down", proxy.storage_options(), [split], retries=RetryPolicy(3, 0.0, 0.0)
    )
    before = len(proxy.requests)
    proxy.fail_next("503", "503", "503", "503")
    with pytest.raises(StorageError, match=r"still failing after 3 attempts") as info:
        store.write_part(split, "a1", table_for(split), {})
    assert info.value.errno is not None
    assert [f for _, _, f in proxy.requests[before:]] == ["503", "503", "503"]
    # A commit that loses a race is never retried: one conditional PUT, then the marker is read.
    other = OutputStore(s3_bucket.url("down"), s3_bucket.storage_options)
    assert other.commit(split, other.write_part(split, "w", table_for(split), {}))
    theirs = store.write_part(split, "a2", table_for(split), {})
    store.check_exclusive_create()  # once per store: its own PUTs are not the commit's
    before = len(proxy.requests)
    assert store.commit(split, theirs) is False
    assert [m for m, _, _ in proxy.requests[before:]].count("PUT") == 1


def test_store_ignoring_if_none_match_is_refused_before_any_commit(s3_bucket, fault_proxy) -> None:
    """An S3-compatible endpoint that drops the create-if-absent condition would let a second
    commit overwrite the first; the store proves the condition holds before its first commit."""
    from shardinfer.writers import ExclusiveCreateUnsupportedError

    (split,) = plan(1)
    honest = fault_proxy(every=0)
    store = _bare_store(f"s3://{s3_bucket.name}/cond", honest.storage_options(), [split])
    assert store.commit(split, store.write_part(split, "a1", table_for(split), {}))
    lax = fault_proxy(every=0)
    lax.ignore_conditions()
    other = _bare_store(f"s3://{s3_bucket.name}/cond", lax.storage_options(), [split])
    theirs = other.write_part(split, "a2", table_for(split), {})
    with pytest.raises(ExclusiveCreateUnsupportedError, match="ignores If-None-Match"):
        other.commit(split, theirs)
    assert store.committed()[0]["attempt"] == "a1"  # the first commit was not overwritten


class _EncryptedBucketView:
    """The test bucket's s3fs filesystem, except that a HEAD (`info`) answers as a bucket with SSE-KMS
    default encryption does: the ETag of a single-part upload is an opaque string, not the MD5 of
    the content (moto always answers the MD5). Reads and writes go to moto unchanged."""

    def __init__(self, fs: s3fs.S3FileSystem) -> None:
        self._fs = fs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        info: dict[str, Any] = self._fs.info(path, **kwargs)
        opaque = hashlib.md5(b"kms:" + str(info.get("ETag")).encode(), usedforsecurity=False).hexdigest()
        return {**info, "ETag": f'"{opaque}"'}


def test_parts_in_an_encrypted_bucket_are_verified_by_content_not_etag(s3_bucket) -> None:
    """With SSE-KMS no ETag equals the committed MD5: finalize must check the content itself, so a
    correct part passes (before: every part 'replaced', on every run) and a part replaced at the
    same size is still named."""
    splits = plan(2)
    store = new_store(s3_bucket.url("kms"), splits, storage_options=s3_bucket.storage_options)
    store.fs = _EncryptedBucketView(store.fs)  # type: ignore[assignment]
    parts = [store.write_part(s, "a1", table_for(s), {}) for s in splits]
    for s, p in zip(splits, parts, strict=True):
        assert store.commit(s, p)
    assert store.damaged_parts() == {}
    assert store.finalize({})["totals"]["rows"] == 6
    # The same bytes with one flipped: the same size, another content.
    path = f"{s3_bucket.name}/kms/{parts[1].name}"
    data = bytearray(store.fs.cat_file(path))
    data[len(data) // 2] ^= 0xFF
    store.fs.pipe_file(path, bytes(data))
    assert store.damaged_parts() == {
        1: f"{parts[1].name}: its part file's sha256 differs from what was committed (replaced)"
    }


def test_a_start_over_clear_rides_out_a_fault_on_its_first_listing(s3_bucket, fault_proxy) -> None:
    proxy = fault_proxy(every=0)
    splits = plan(2)
    store = _bare_store(f"s3://{s3_bucket.name}/clear", proxy.storage_options(), splits)
    for s in splits:
        assert store.commit(s, store.write_part(s, "a1", table_for(s), {}))
    store.finalize({})
    before = len(proxy.requests)
    proxy.fail_next("503")  # the listing of `_commits/` that a clear starts with
    store.clear()
    assert proxy.requests[before][2] == "503"
    fs = s3fs.S3FileSystem(**s3_bucket.storage_options)
    fs.invalidate_cache()
    assert fs.find(s3_bucket.url("clear")) == []
