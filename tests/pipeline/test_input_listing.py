"""The input listing compares files by their identity: credentials are no part of what a file is."""

from __future__ import annotations

import hashlib
from pathlib import Path

from shardinfer.pipeline.input_listing import ListingDiff, content_digest, diff_listings, with_content_digests


def _entry(path: str, size: int = 10, version: str = "mtime:1") -> dict[str, object]:
    return {"path": path, "size": size, "version": version}


def test_a_rotated_password_or_signature_is_the_same_file() -> None:
    stored = [_entry("https://u:old-pass@h/data/a.jsonl?sig=old1"), _entry("https://h/data/b.jsonl")]
    fresh = [_entry("https://h/data/a.jsonl"), _entry("https://u:new-pass@h/data/b.jsonl?sig=new2")]
    assert diff_listings(stored, fresh) == ListingDiff([], [], [])


def test_other_files_and_rewrites_are_still_named() -> None:
    stored = [_entry("https://u:pw12@h/data/a.jsonl"), _entry("https://h/data/b.jsonl")]
    fresh = [_entry("https://h/data/a.jsonl", size=11), _entry("https://h/data/c.jsonl")]
    assert diff_listings(stored, fresh) == ListingDiff(
        added=["https://h/data/c.jsonl"],
        removed=["https://h/data/b.jsonl"],
        changed=["https://h/data/a.jsonl"],
    )


def test_a_local_files_digest_is_its_sha256(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"prompt": "x"}\n' * 1000)
    assert content_digest(str(path)) == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_moved_time_with_the_stored_digest_is_the_same_file() -> None:
    stored = [
        {**_entry("/data/a.parquet"), "digest": "sha256:aa"},
        {**_entry("/data/b.parquet"), "digest": "sha256:bb"},
    ]
    fresh = [_entry("/data/a.parquet", version="mtime:2"), _entry("/data/b.parquet", version="mtime:2")]
    read: list[str] = []

    def digest(path: str) -> str:
        read.append(path)
        return {"/data/a.parquet": "sha256:aa", "/data/b.parquet": "sha256:b2"}[path]

    assert diff_listings(stored, fresh, digest) == ListingDiff([], [], ["/data/b.parquet"])
    assert sorted(read) == ["/data/a.parquet", "/data/b.parquet"]


def test_files_are_read_only_when_their_time_moved_at_the_same_size() -> None:
    stored = [{**_entry("/d/same"), "digest": "sha256:1"}, {**_entry("/d/grown"), "digest": "sha256:2"}]
    fresh = [_entry("/d/same"), _entry("/d/grown", size=11, version="mtime:2")]

    def digest(path: str) -> str:
        raise AssertionError(f"{path} read")

    assert diff_listings(stored, fresh, digest) == ListingDiff([], [], ["/d/grown"])
    # A listing stored without digests (an older version's) still compares by time.
    assert diff_listings([_entry("/d/x")], [_entry("/d/x", version="mtime:2")], digest).changed == ["/d/x"]


def test_stored_digests_are_kept_for_unchanged_files_and_read_for_others() -> None:
    previous = [{**_entry("/d/a"), "digest": "sha256:old-a"}, {**_entry("/d/b"), "digest": "sha256:old-b"}]
    listing = [
        _entry("/d/a"),
        _entry("/d/b", version="mtime:2"),
        _entry("/d/c"),
        _entry("s3://bkt/d", version="ETag:e"),
    ]
    digests = {"/d/b": "sha256:new-b", "/d/c": "sha256:c", "s3://bkt/d": None}
    out = with_content_digests(listing, previous, digests.__getitem__)
    assert [e.get("digest") for e in out] == ["sha256:old-a", "sha256:new-b", "sha256:c", None]
    assert "digest" not in out[3]
