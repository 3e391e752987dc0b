"""Input listing: sorted, deterministic, globs and directories, format filters, missing input."""

from __future__ import annotations

import os
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardinfer.errors import ConfigError
from shardinfer.readers import InputMissingError, InputSpec, list_input_files


def _touch_parquet(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"prompt": ["x"]}), path)


def test_directory_listing_is_sorted_recursive_and_skips_hidden(tmp_path: Path) -> None:
    # Created in an order unlike the sort order, so a listing that follows creation order fails.
    for name in ["b.parquet", "a/z.parquet", "a.parquet", "c/_temporary/x.parquet", ".hidden.parquet"]:
        _touch_parquet(tmp_path / name)
    (tmp_path / "_SUCCESS").write_text("{}")
    (tmp_path / "notes.txt").write_text("not input")
    files = list_input_files(InputSpec(str(tmp_path)))
    assert files == [str(tmp_path / "a.parquet"), str(tmp_path / "a/z.parquet"), str(tmp_path / "b.parquet")]


def test_glob_and_single_file(tmp_path: Path) -> None:
    for name in ["s-2.parquet", "s-10.parquet", "s-1.parquet", "other.parquet"]:
        _touch_parquet(tmp_path / name)
    files = list_input_files(InputSpec(str(tmp_path / "s-*.parquet")))
    # Plain string order, the same on every store and machine.
    assert [os.path.basename(f) for f in files] == ["s-1.parquet", "s-10.parquet", "s-2.parquet"]
    assert list_input_files(InputSpec(str(tmp_path / "other.parquet"))) == [str(tmp_path / "other.parquet")]


def test_declared_format_filters_a_directory(tmp_path: Path) -> None:
    _touch_parquet(tmp_path / "a.parquet")
    (tmp_path / "b.jsonl").write_text('{"prompt": "x"}\n')
    with pytest.raises(ConfigError, match="both Parquet and JSONL"):  # the spec's to fix: exit 78
        list_input_files(InputSpec(str(tmp_path)))
    assert list_input_files(InputSpec(str(tmp_path), format="jsonl")) == [str(tmp_path / "b.jsonl")]


def test_missing_path_and_empty_match_raise_input_missing(tmp_path: Path) -> None:
    with pytest.raises(InputMissingError, match="does not exist"):
        list_input_files(InputSpec(str(tmp_path / "nope")))
    with pytest.raises(InputMissingError, match="matches no"):
        list_input_files(InputSpec(str(tmp_path / "*.parquet")))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "_SUCCESS").write_text("")
    with pytest.raises(InputMissingError, match="matches no"):
        list_input_files(InputSpec(str(tmp_path / "empty")))


def test_memory_filesystem_urls_round_trip() -> None:
    fs = fsspec.filesystem("memory")
    for name in ["2.parquet", "1.parquet"]:
        with fs.open(f"memory://listing-test/{name}", "wb") as f:
            pq.write_table(pa.table({"prompt": ["x"]}), f)
    try:
        files = list_input_files(InputSpec("memory://listing-test"))
        assert files == ["memory:///listing-test/1.parquet", "memory:///listing-test/2.parquet"]
        assert fsspec.open(files[0], "rb").open().read(4) == b"PAR1"
    finally:
        fs.rm("memory://listing-test", recursive=True)


def test_a_signed_urls_query_is_neither_a_glob_nor_its_extension() -> None:
    from shardinfer.readers.listing import format_of, is_compressed, resolve_format

    signed = "https://h.example/data/prompts.jsonl.gz?X-Amz-Date=1&X-Amz-Signature=ab12"
    assert format_of(signed) == resolve_format(signed, "auto") == "jsonl"
    assert is_compressed(signed)
    assert format_of("https://h.example/data/part.parquet?sig=ab12") == "parquet"
    # Elsewhere `?` stays a glob character.
    assert format_of("s3://bucket/part?.parquet") == "parquet"
