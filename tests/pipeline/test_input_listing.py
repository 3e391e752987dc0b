"""The input listing compares files by their identity: credentials are no part of what a file is."""

from __future__ import annotations

from shardinfer.pipeline.input_listing import ListingDiff, diff_listings


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
