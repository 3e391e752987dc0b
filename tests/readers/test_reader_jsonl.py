"""JSONL: line-range splits with byte offsets, streaming by lines, blank lines, compression, bad lines."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from shardinfer.readers import InputSchemaError, InputSpec, Split, plan_splits, read_split


def _lines(n: int) -> list[str]:
    return [json.dumps({"prompt": f"question {i}" + "é" * (i % 3), "k": i}) for i in range(n)]


def _write(path: Path, lines: list[str], trailing_newline: bool = True) -> bytes:
    data = "\n".join(lines).encode() + (b"\n" if trailing_newline else b"")
    path.write_bytes(data)
    return data


def _line_starts(data: bytes) -> list[int]:
    """Independent reference: byte offset of every line start."""
    return [0] + [i + 1 for i, b in enumerate(data) if b == ord("\n") and i + 1 < len(data)]


@pytest.mark.parametrize("trailing_newline", [True, False])
def test_line_splits_have_exact_ranges_and_offsets(tmp_path: Path, trailing_newline: bool) -> None:
    path = tmp_path / "in.jsonl"
    data = _write(path, _lines(23), trailing_newline)
    spec = InputSpec(str(path), prompt_column="prompt")
    splits = plan_splits(spec, split_rows=10)
    starts = _line_starts(data)
    assert splits == [
        Split(0, 0, str(path), 0, 10, starts[0]),
        Split(1, 0, str(path), 10, 20, starts[10]),
        Split(2, 0, str(path), 20, 23, starts[20]),
    ]
    rows = []
    for split in splits:
        for batch in read_split(split, spec, batch_rows=4):
            assert batch.num_rows <= 4
            rows += batch.to_pylist()
    assert rows == [{**json.loads(line), "__row_index": i} for i, line in enumerate(_lines(23))]


def test_chunk_boundaries_do_not_shift_offsets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardinfer.readers.jsonl_source as source

    monkeypatch.setattr(source, "_CHUNK", 7)  # many newlines fall exactly on or near chunk edges
    path = tmp_path / "in.jsonl"
    data = _write(path, _lines(40))
    splits = plan_splits(InputSpec(str(path)), split_rows=3)
    starts = _line_starts(data)
    assert [(s.row_start, s.row_end, s.byte_offset) for s in splits] == [
        (k, min(k + 3, 40), starts[k]) for k in range(0, 40, 3)
    ]


def test_blank_lines_are_skipped_but_keep_their_number(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "a"}\n\n   \n{"prompt": "b"}\n')
    spec = InputSpec(str(path))
    (split,) = plan_splits(spec, split_rows=10)
    assert (split.row_start, split.row_end) == (0, 4)
    rows = [r for b in read_split(split, spec) for r in b.to_pylist()]
    assert rows == [{"prompt": "a", "__row_index": 0}, {"prompt": "b", "__row_index": 3}]


def test_gzip_jsonl_is_read_by_scanning(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join(_lines(12)) + "\n").encode()))
    spec = InputSpec(str(path))
    splits = plan_splits(spec, split_rows=5)
    assert [(s.row_start, s.row_end, s.byte_offset) for s in splits] == [
        (0, 5, None),
        (5, 10, None),
        (10, 12, None),
    ]
    got = [r["k"] for b in read_split(splits[1], spec) for r in b.to_pylist()]
    assert got == [5, 6, 7, 8, 9]


def test_bad_json_line_names_file_and_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardinfer.readers.jsonl_source as source

    path = tmp_path / "in.jsonl"
    _write(path, [*_lines(3), "{not json", *_lines(2)])
    spec = InputSpec(str(path))
    # Within the schema sample: caught while planning, before any work starts.
    with pytest.raises(InputSchemaError, match=r"in\.jsonl line 4: not valid JSON"):
        plan_splits(spec, split_rows=100)
    # Past the sample: caught when the split is read.
    monkeypatch.setattr(source, "SCHEMA_SAMPLE_LINES", 2)
    (split,) = plan_splits(spec, split_rows=100)
    with pytest.raises(InputSchemaError, match=r"in\.jsonl line 4: not valid JSON"):
        list(read_split(split, spec))


def test_key_not_in_sample_and_type_change_are_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardinfer.readers.jsonl_source as source

    monkeypatch.setattr(source, "SCHEMA_SAMPLE_LINES", 2)
    path = tmp_path / "in.jsonl"
    _write(path, ['{"prompt": "a"}', '{"prompt": "b"}', '{"prompt": "c", "extra": 1}'])
    spec = InputSpec(str(path))
    (split,) = plan_splits(spec, split_rows=10)
    with pytest.raises(InputSchemaError, match=r"line 3: key\(s\) \['extra'\]"):
        list(read_split(split, spec))
    _write(path, ['{"prompt": "a", "k": 1}', '{"prompt": "b", "k": 2}', '{"prompt": "c", "k": "three"}'])
    (split,) = plan_splits(spec, split_rows=10)
    with pytest.raises(InputSchemaError, match=r"in\.jsonl lines 1\.\.3: a value does not fit"):
        list(read_split(split, spec))
