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


def _writer_leftovers(root: Path) -> None:
    """A dataset as a Spark or Hive writer leaves it: data beside markers, checksums and the
    `_temporary/` copies of a failed attempt, which hold the same rows again."""
    for name in [
        "a.parquet",
        "sub/b.parquet",
        "_temporary/0/a.parquet",
        ".staging/b.parquet",
        "sub/.b.parquet",
    ]:
        _touch_parquet(root / name)
    (root / "_SUCCESS").write_text("")
    (root / ".a.parquet.crc").write_text("crc")


@pytest.mark.parametrize("pattern", ["**/*.parquet", "**", "*/*.parquet", "*"])
def test_glob_skips_hidden_files_and_folders_like_a_directory_listing(tmp_path: Path, pattern: str) -> None:
    _writer_leftovers(tmp_path)
    files = list_input_files(InputSpec(str(tmp_path / pattern), format="auto"))
    expected = {
        "**/*.parquet": ["a.parquet", "sub/b.parquet"],
        "**": ["a.parquet", "sub/b.parquet"],
        "*/*.parquet": ["sub/b.parquet"],
        "*": ["a.parquet"],
    }[pattern]
    assert files == [str(tmp_path / name) for name in expected]


def test_glob_with_declared_format_does_not_read_markers(tmp_path: Path) -> None:
    # With input.format set a glob's files are taken as named: `_SUCCESS` must still not be one.
    _writer_leftovers(tmp_path)
    assert list_input_files(InputSpec(str(tmp_path / "*"), format="parquet")) == [str(tmp_path / "a.parquet")]


def test_glob_keeps_hidden_names_it_asks_for(tmp_path: Path) -> None:
    _writer_leftovers(tmp_path)
    assert list_input_files(InputSpec(str(tmp_path / "_temporary" / "*" / "*.parquet"))) == [
        str(tmp_path / "_temporary/0/a.parquet")
    ]
    assert list_input_files(InputSpec(str(tmp_path / "sub" / ".*.parquet"))) == [
        str(tmp_path / "sub/.b.parquet")
    ]


def test_glob_matching_only_directories_says_how_to_reach_their_files(tmp_path: Path) -> None:
    _touch_parquet(tmp_path / "ds=1" / "a.parquet")
    _touch_parquet(tmp_path / "ds=2" / "a.parquet")
    with pytest.raises(InputMissingError, match=r"matches only directories .*ds=1.*'/\*\.parquet'"):
        list_input_files(InputSpec(str(tmp_path / "ds=*")))
    assert len(list_input_files(InputSpec(str(tmp_path / "ds=*" / "*.parquet")))) == 2


def test_a_path_with_wildcard_characters_that_exists_is_taken_as_written(tmp_path: Path) -> None:
    # As a pattern, `run[2]` would match a folder `run2`, not the folder named `run[2]`.
    _touch_parquet(tmp_path / "run[2]" / "a.parquet")
    _touch_parquet(tmp_path / "run2" / "b.parquet")
    assert list_input_files(InputSpec(str(tmp_path / "run[2]"))) == [str(tmp_path / "run[2]" / "a.parquet")]
    assert list_input_files(InputSpec(str(tmp_path / "run[2]" / "a.parquet"))) == [
        str(tmp_path / "run[2]" / "a.parquet")
    ]
    assert list_input_files(InputSpec(str(tmp_path / "run[0-9]" / "*.parquet"))) == [
        str(tmp_path / "run2" / "b.parquet")
    ]
