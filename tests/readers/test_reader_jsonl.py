"""JSONL: line-range splits with byte offsets, streaming by lines, blank lines, compression, bad lines."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from shardinfer.errors import ConfigError
from shardinfer.readers import InputSchemaError, InputSpec, Split, plan_splits, read_schema, read_split


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


def _rows_and_errors(spec: InputSpec, split: Split) -> list[tuple[int, object, str | None]]:
    """(line index, prompt, reason) of every row read, error rows included."""
    out = []
    for batch in read_split(split, spec):
        for row in batch.to_pylist():
            out.append((row["__row_index"], row["prompt"], row.get("__row_error")))
    return out


def test_bad_lines_become_error_rows_naming_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardinfer.readers.jsonl_source as source

    path = tmp_path / "in.jsonl"
    deep = "[" * 100_000 + "]" * 100_000
    _write(path, [*_lines(3), "{not json", '{"prompt": ' + deep + "}", "[1, 2]", *_lines(2)])
    spec = InputSpec(str(path))
    for sample in (source.SCHEMA_SAMPLE_LINES, 2):  # bad lines inside, then past, the schema sample
        monkeypatch.setattr(source, "SCHEMA_SAMPLE_LINES", sample)
        (split,) = plan_splits(spec, split_rows=100)
        got = _rows_and_errors(spec, split)
        assert [(i, p) for i, p, _ in got] == [
            (0, "question 0"),
            (1, "question 1é"),
            (2, "question 2éé"),
            (3, None),
            (4, None),
            (5, None),
            (6, "question 0"),
            (7, "question 1é"),
        ]
        reasons = [r for _, _, r in got]
        assert reasons[:3] == [None] * 3 and reasons[6:] == [None] * 2
        assert re.match(r".*in\.jsonl line 4: not valid JSON", reasons[3] or "")
        assert re.match(r".*in\.jsonl line 5: a value is nested too deeply", reasons[4] or "")
        assert re.match(r".*in\.jsonl line 6: expected a JSON object per line, got list", reasons[5] or "")


def test_a_file_without_one_object_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    _write(path, ["{not json", "[1]"])
    with pytest.raises(InputSchemaError, match=r"in\.jsonl line 1: not valid JSON"):
        plan_splits(InputSpec(str(path)), split_rows=10)


def test_what_a_file_that_is_not_json_lines_is_gets_named(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"prompt": ["x"]}), parquet)
    with pytest.raises(
        ConfigError,
        match=r"rows\.parquet is a Parquet file, read as JSON Lines because "
        r"input\.format is 'jsonl': set input\.format = 'parquet'",
    ):
        plan_splits(InputSpec(str(parquet), format="jsonl"), split_rows=10)
    array = tmp_path / "array.jsonl"
    array.write_text(json.dumps([{"prompt": "x"}, {"prompt": "y"}], indent=1))
    with pytest.raises(InputSchemaError, match=r"array\.jsonl holds a JSON array, not JSON Lines"):
        plan_splits(InputSpec(str(array)), split_rows=10)
    packed = tmp_path / "packed.jsonl"
    packed.write_bytes(gzip.compress(b'{"prompt": "x"}\n'))
    with pytest.raises(InputSchemaError, match=r"packed\.jsonl is gzip-compressed but its name does not end"):
        plan_splits(InputSpec(str(packed)), split_rows=10)


def test_key_not_in_sample_and_type_change_are_error_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardinfer.readers.jsonl_source as source

    monkeypatch.setattr(source, "SCHEMA_SAMPLE_LINES", 2)
    path = tmp_path / "in.jsonl"
    _write(path, ['{"prompt": "a"}', '{"prompt": "b"}', '{"prompt": "c", "extra": 1}'])
    spec = InputSpec(str(path))
    (split,) = plan_splits(spec, split_rows=10)
    got = _rows_and_errors(spec, split)
    # The error row keeps the cells that fit: only the key the sample lacked is left out.
    assert [(i, p) for i, p, _ in got] == [(0, "a"), (1, "b"), (2, "c")]
    assert got[0][2] is None and got[1][2] is None
    assert re.match(r".*line 3: key\(s\) \['extra'\]", got[2][2] or "")
    _write(path, ['{"prompt": "a", "k": 1}', '{"prompt": "b", "k": 2}', '{"prompt": "c", "k": "three"}'])
    (split,) = plan_splits(spec, split_rows=10)
    got = _rows_and_errors(spec, split)
    assert [(i, p) for i, p, _ in got] == [(0, "a"), (1, "b"), (2, "c")]
    # The message names the key, its value and the type the sample gave the column.
    assert re.match(
        r".*in\.jsonl line 3: key 'k' holds 'three' \(str\), but the first lines made it a column "
        r"of int64; make each key hold one type",
        got[2][2] or "",
    )


def test_the_sample_majority_decides_a_disputed_type(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    rows = ['{"prompt": "a", "k": 1}', '{"prompt": "b", "k": [[1]]}', '{"prompt": "c", "k": 3}']
    _write(path, rows)
    spec = InputSpec(str(path))
    (split,) = plan_splits(spec, split_rows=10)
    got = [r for b in read_split(split, spec) for r in b.to_pylist()]
    assert [(r["prompt"], r["k"]) for r in got] == [("a", 1), ("b", None), ("c", 3)]
    assert got[0]["__row_error"] is None
    assert (
        "line 2: key 'k' holds [[1]] (list), but the first lines made it a column of int64"
        in got[1]["__row_error"]
    )


def _read_all(path: Path) -> list[dict]:
    spec = InputSpec(str(path))
    return [r for s in plan_splits(spec, split_rows=10) for b in read_split(s, spec) for r in b.to_pylist()]


def test_a_key_first_seen_after_the_first_line_is_a_column(tmp_path: Path) -> None:
    # An optional key (a per-row override, say) that the first line happens to lack.
    path = tmp_path / "in.jsonl"
    _write(path, ['{"prompt": "a"}', '{"prompt": "b", "max_tokens": 5}', '{"max_tokens": 7, "prompt": "c"}'])
    rows = _read_all(path)
    assert [(r["prompt"], r["max_tokens"], r.get("__row_error")) for r in rows] == [
        ("a", None, None),
        ("b", 5, None),
        ("c", 7, None),
    ]


def test_messages_with_text_and_part_list_contents_are_read_as_json_text(tmp_path: Path) -> None:
    # OpenAI-style chat data mixes both forms of content; no Arrow type holds both.
    conversations = [
        [{"role": "user", "content": "1+1="}],
        [{"role": "user", "content": [{"type": "text", "text": "2+2="}]}],
        None,
        [{"role": "system", "content": "be brief", "name": "sys"}, {"role": "user", "content": "3+3="}],
    ]
    path = tmp_path / "in.jsonl"
    _write(path, [json.dumps({"id": i, "messages": m}) for i, m in enumerate(conversations)])
    rows = _read_all(path)
    assert [r.get("__row_error") for r in rows] == [None] * 4
    assert [None if r["messages"] is None else json.loads(r["messages"]) for r in rows] == conversations


def test_an_object_key_the_sample_lacks_is_an_error_row_not_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardinfer.readers.jsonl_source as source

    monkeypatch.setattr(source, "SCHEMA_SAMPLE_LINES", 2)
    path = tmp_path / "in.jsonl"
    message = {"role": "user", "content": "hi"}
    _write(
        path,
        [json.dumps({"messages": [message]})] * 2 + [json.dumps({"messages": [{**message, "name": "x"}]})],
    )
    rows = _read_all(path)
    assert [r["messages"] for r in rows[:2]] == [[message], [message]]
    assert rows[2]["messages"] is None
    assert (
        "line 3: key 'messages[0].name' is not among the fields of column 'messages'"
        in rows[2]["__row_error"]
    )


def test_an_empty_first_file_does_not_hide_the_columns_of_the_others(tmp_path: Path) -> None:
    # A sharded export often has empty shards; the first one must not stand for the input's columns.
    (tmp_path / "part-0.jsonl").write_bytes(b"")
    _write(tmp_path / "part-1.jsonl", ['{"id": "a", "prompt": "x"}'])
    spec = InputSpec(str(tmp_path), id_column="id", prompt_column="prompt")
    (split,) = plan_splits(spec, split_rows=10)
    assert (split.file_index, split.row_start, split.row_end) == (1, 0, 1)
    assert read_schema(spec).names == ["id", "prompt", "__row_index"]
