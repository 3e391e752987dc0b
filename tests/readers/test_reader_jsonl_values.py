"""JSONL values that do not fit their inferred column exactly: error rows that name them and keep the
row's other cells (its id among them), never a value Arrow changed on its way in; and cells of
columns the job does not read, which cannot fail their row."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardinfer.pipeline.config import InputSection, JobConfig
from shardinfer.pipeline.job import input_spec_of
from shardinfer.pipeline.rows import row_id_of
from shardinfer.readers import InputSpec, plan_splits, read_split

_ONE_TYPE = "e.g. quote numbers meant as text"
_FRACTIONS = "e.g. 3.0 rather than 3 in the first lines, so that the column holds fractions"
_MESSAGES = [{"role": "user", "content": "hi"}]


def _write(path: Path, objects: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objects))
    return path


def _read(spec: InputSpec, split_rows: int = 100) -> list[dict[str, Any]]:
    return [r for s in plan_splits(spec, split_rows) for b in read_split(s, spec) for r in b.to_pylist()]


def _misfit(path: Path, line: int, key: str, shown: str, python_type: str, kind: str, example: str) -> str:
    return (
        f"{path} line {line}: key {key!r} holds {shown} ({python_type}), but the first lines made it a "
        f"column of {kind}; make each key hold one type ({example})"
    )


def test_the_audit_file_gives_error_rows_not_a_truncated_score_or_a_repeated_id(tmp_path: Path) -> None:
    # Past the schema sample: line 1051 holds a fraction in the integer column score, line 1052 one
    # in the integer id column. Arrow would store 2 and 1049, a repeat of row 1049's id.
    objects = [{"id": i, "messages": _MESSAGES, "score": 3} for i in range(1100)]
    objects[1050]["score"] = 2.5
    objects[1051]["id"] = 1049.9
    path = _write(tmp_path / "in.jsonl", objects)
    spec = InputSpec(str(path), id_column="id", messages_column="messages")
    rows = _read(spec, split_rows=500)
    expected = [(i, str(i), 3, None) for i in range(1100)]
    expected[1050] = (1050, "1050", None, _misfit(path, 1051, "score", "2.5", "float", "int64", _FRACTIONS))
    expected[1051] = (1051, "0:1051", 3, _misfit(path, 1052, "id", "1049.9", "float", "int64", _FRACTIONS))
    got = [
        (r["__row_index"], row_id_of(r["id"], 0, r["__row_index"]), r["score"], r.get("__row_error"))
        for r in rows
    ]
    assert got == expected
    assert [r["messages"] for r in rows] == [_MESSAGES] * 1100


_MESSAGES_TYPE = "list<item: struct<role: string, content: string>>"


@pytest.mark.parametrize(
    ("typical", "bad", "kind", "shown", "python_type", "example"),
    [
        ([1, 2], 2.5, "int64", "2.5", "float", _FRACTIONS),
        ([1, 2], -0.5, "int64", "-0.5", "float", _FRACTIONS),
        ([1, 2], 2**64, "int64", "18446744073709551616", "int", _ONE_TYPE),
        ([1, 2], True, "int64", "True", "bool", _ONE_TYPE),
        ([1, 2], "3", "int64", "'3'", "str", _ONE_TYPE),
        ([1.5, 2.5], True, "double", "True", "bool", _ONE_TYPE),
        ([1.5, 2.5], 2**53 + 1, "double", "9007199254740993", "int", _ONE_TYPE),
        ([["a"], ["b", "c"]], "ab", "list<item: string>", "'ab'", "str", _ONE_TYPE),
        ([["a"], ["b", "c"]], "", "list<item: string>", "''", "str", _ONE_TYPE),
        ([[1], [2]], [1, 2.5], "list<item: int64>", "[1, 2.5]", "list", _ONE_TYPE),
        ([[1.5], [2.5]], [True], "list<item: double>", "[True]", "list", _ONE_TYPE),
        ([[["a"]], [["b"]]], ["ab"], "list<item: list<item: string>>", "['ab']", "list", _ONE_TYPE),
        ([{"x": 1}, {"x": 2}], {"x": 2.5}, "struct<x: int64>", "{'x': 2.5}", "dict", _ONE_TYPE),
        ([{"x": 1}, {"x": 2}], [], "struct<x: int64>", "[]", "list", _ONE_TYPE),
        ([{"x": "a"}, {"x": "b"}], "", "struct<x: string>", "''", "str", _ONE_TYPE),
        ([_MESSAGES, _MESSAGES], [[]], _MESSAGES_TYPE, "[[]]", "list", _ONE_TYPE),
    ],
)
def test_a_value_arrow_would_change_or_refuse_is_an_error_row_that_keeps_its_id(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    typical: list[Any],
    bad: Any,
    kind: str,
    shown: str,
    python_type: str,
    example: str,
) -> None:
    import shardinfer.readers.jsonl_source as source

    monkeypatch.setattr(source, "SCHEMA_SAMPLE_LINES", 2)  # the bad value comes after the sample
    values = [typical[0], typical[1], bad, typical[0]]
    path = _write(tmp_path / "in.jsonl", [{"id": f"r{i}", "v": v} for i, v in enumerate(values)])
    rows = _read(InputSpec(str(path), id_column="id"))
    assert [(r["id"], r["v"], r.get("__row_error")) for r in rows] == [
        ("r0", typical[0], None),
        ("r1", typical[1], None),
        ("r2", None, _misfit(path, 3, "v", shown, python_type, kind, example)),
        ("r3", typical[0], None),
    ]


def test_values_of_a_column_that_mixes_types_within_the_sample(tmp_path: Path) -> None:
    # Most sampled values are ints, so the column is int64; the fraction and the text do not fit it,
    # and the bool does not fit the double column next to it.
    pairs = [(1, 1.5), (2, True), (2.5, 2.5), ("x", 3.5), (4, "y")]
    path = _write(tmp_path / "in.jsonl", [{"id": i, "k": k, "f": f} for i, (k, f) in enumerate(pairs)])
    rows = _read(InputSpec(str(path), id_column="id"))
    assert [(r["id"], r["k"], r["f"], r.get("__row_error")) for r in rows] == [
        (0, 1, 1.5, None),
        (1, 2, None, _misfit(path, 2, "f", "True", "bool", "double", _ONE_TYPE)),
        (2, None, 2.5, _misfit(path, 3, "k", "2.5", "float", "int64", _FRACTIONS)),
        (3, None, 3.5, _misfit(path, 4, "k", "'x'", "str", "int64", _ONE_TYPE)),
        (4, 4, None, _misfit(path, 5, "f", "'y'", "str", "double", _ONE_TYPE)),
    ]


def test_every_key_that_does_not_fit_is_named_and_the_others_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardinfer.readers.jsonl_source as source

    monkeypatch.setattr(source, "SCHEMA_SAMPLE_LINES", 1)
    objects = [{"id": 0, "k": 1, "t": "a"}, {"id": 1.5, "k": "two", "t": "b", "new": 1}]
    path = _write(tmp_path / "in.jsonl", objects)
    rows = _read(InputSpec(str(path), id_column="id"))
    reasons = [
        "key(s) ['new'] are not among the columns inferred from the first 1 lines (['id', 'k', 't']); "
        "put every key in the first lines (null is fine) or convert the input to Parquet",
        _misfit(path, 2, "id", "1.5", "float", "int64", _FRACTIONS).removeprefix(f"{path} line 2: "),
        _misfit(path, 2, "k", "'two'", "str", "int64", _ONE_TYPE).removeprefix(f"{path} line 2: "),
    ]
    reason = f"{path} line 2: " + "; ".join(reasons)
    assert rows == [
        {"id": 0, "k": 1, "t": "a", "__row_index": 0, "__row_error": None},
        {"id": None, "k": None, "t": "b", "__row_index": 1, "__row_error": reason},
    ]


def test_whole_floats_in_an_integer_column_and_ints_in_a_float_column_are_their_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # JSON has one number type: a whole float is the integer of the same value, which an int column
    # holds exactly (as a safe Arrow cast takes it); its row id is the integer's text, as an int
    # column's ids are in Parquet too.
    import shardinfer.readers.jsonl_source as source

    monkeypatch.setattr(source, "SCHEMA_SAMPLE_LINES", 2)
    objects = [{"id": 5, "f": 0.5}, {"id": 6, "f": 1.5}, {"id": 7.0, "f": 3}, {"id": -0.0, "f": -2}]
    path = _write(tmp_path / "in.jsonl", objects)
    rows = _read(InputSpec(str(path), id_column="id"))
    assert [(r["id"], r["f"], r.get("__row_error")) for r in rows] == [
        (5, 0.5, None),
        (6, 1.5, None),
        (7, 3.0, None),
        (0, -2.0, None),
    ]
    assert [type(r["id"]) for r in rows] == [int] * 4
    assert [row_id_of(r["id"], 0, r["__row_index"]) for r in rows] == ["5", "6", "7", "0"]


def test_an_int_too_large_for_arrow_in_the_sample_is_an_error_row(tmp_path: Path) -> None:
    # It used to stop the job while the schema was inferred (Python's OverflowError).
    path = _write(tmp_path / "in.jsonl", [{"id": 1, "p": "a"}, {"id": 2**64, "p": "b"}, {"id": 3, "p": "c"}])
    rows = _read(InputSpec(str(path), id_column="id"))
    assert [(r["id"], r["p"], r.get("__row_error")) for r in rows] == [
        (1, "a", None),
        (None, "b", _misfit(path, 2, "id", str(2**64), "int", "int64", _ONE_TYPE)),
        (3, "c", None),
    ]


def test_an_error_row_keeps_its_id_unless_the_id_is_what_does_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardinfer.readers.jsonl_source as source

    monkeypatch.setattr(source, "SCHEMA_SAMPLE_LINES", 2)
    objects = [
        {"id": 10, "unused": 1},
        {"id": 11, "unused": 2},
        {"id": 12, "unused": "n/a"},
        {"id": 13, "unused": 3, "later": True},
        {"id": "fourteen", "unused": 4},
        {"id": 15, "unused": 5},
    ]
    path = _write(tmp_path / "in.jsonl", objects)
    # A spec that does not say which columns the job reads: every column counts.
    rows = _read(InputSpec(str(path), id_column="id"))
    later = (
        f"{path} line 4: key(s) ['later'] are not among the columns inferred from the first 2 lines "
        "(['id', 'unused']); put every key in the first lines (null is fine) or convert the input to Parquet"
    )
    assert [(row_id_of(r["id"], 0, r["__row_index"]), r["unused"], r.get("__row_error")) for r in rows] == [
        ("10", 1, None),
        ("11", 2, None),
        ("12", None, _misfit(path, 3, "unused", "'n/a'", "str", "int64", _ONE_TYPE)),
        ("13", 3, later),
        ("0:4", 4, _misfit(path, 5, "id", "'fourteen'", "str", "int64", _ONE_TYPE)),
        ("15", 5, None),
    ]


def _unused_columns_file(path: Path) -> Path:
    return _write(
        path,
        [
            {"id": 0, "messages": _MESSAGES, "score": 1, "unused": 1},
            {"id": 1, "messages": _MESSAGES, "score": 2, "unused": 2},
            {"id": 2, "messages": _MESSAGES, "score": 3, "unused": "n/a"},
            {"id": 3, "messages": _MESSAGES, "score": 4, "unused": 4, "note": "new key"},
            {"id": 4, "messages": _MESSAGES, "score": 2.5, "unused": 5},
            {"id": 5, "messages": _MESSAGES, "score": 6, "unused": 6, "max_tokens": 9},
        ],
    )


def test_cells_of_columns_the_job_does_not_read_cannot_fail_their_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardinfer.readers.jsonl_source as source

    monkeypatch.setattr(source, "SCHEMA_SAMPLE_LINES", 2)
    path = _unused_columns_file(tmp_path / "in.jsonl")
    spec = InputSpec(
        str(path), id_column="id", messages_column="messages", used_columns=("score", "max_tokens")
    )
    rows = _read(spec)
    max_tokens = (
        f"{path} line 6: key(s) ['max_tokens'] are not among the columns inferred from the first 2 lines "
        "(['id', 'messages', 'score', 'unused']); put every key in the first lines (null is fine) or "
        "convert the input to Parquet"
    )
    assert [(r["id"], r["score"], r["unused"], r.get("__row_error")) for r in rows] == [
        (0, 1, 1, None),
        (1, 2, 2, None),
        (2, 3, None, None),  # nothing reads `unused`: its text is dropped, the row goes on
        (3, 4, 4, None),  # nor `note`, a key the sample lacked
        (4, None, 5, _misfit(path, 5, "score", "2.5", "float", "int64", _FRACTIONS)),
        (5, 6, 6, max_tokens),  # an override column the sample lacked is read: its value must not be lost
    ]
    assert [r["messages"] for r in rows] == [_MESSAGES] * 6


def test_with_a_query_every_column_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardinfer.readers.jsonl_source as source

    monkeypatch.setattr(source, "SCHEMA_SAMPLE_LINES", 2)
    path = _unused_columns_file(tmp_path / "in.jsonl")
    spec = InputSpec(
        str(path),
        id_column="id",
        messages_column="messages",
        used_columns=("score",),
        query="SELECT id, messages, unused + 1 AS u FROM input",
    )
    rows = _read(spec)
    assert [(r["__row_index"], r["u"], r["__row_error"] is not None) for r in rows] == [
        (0, 2, False),
        (1, 3, False),
        (2, None, True),
        (3, None, True),
        (4, None, True),
        (5, None, True),
    ]


def test_a_job_tells_the_reader_every_column_it_reads() -> None:
    # Every [input] key that names columns: a column left out would have its unreadable cells
    # read as null without an error record.
    naming = [f.name for f in dataclasses.fields(InputSection) if f.name.endswith(("_column", "_columns"))]
    section = InputSection(
        path="in.jsonl",
        **{name: [f"{name}-a", f"{name}-b"] if name.endswith("s") else name for name in naming},
    )
    expected = {n for name in naming for n in ([f"{name}-a", f"{name}-b"] if name.endswith("s") else [name])}
    spec = input_spec_of(JobConfig(input=section))
    assert spec.judged_columns() == expected
    with_query = input_spec_of(JobConfig(input=dataclasses.replace(section, query="SELECT * FROM input")))
    assert with_query.judged_columns() is None


def test_invalid_utf8_in_a_parquet_column_the_job_does_not_read_cannot_fail_its_row(tmp_path: Path) -> None:
    from shardinfer.testing.hostile_inputs import raw_string_array

    notes = raw_string_array([b"n0", b"n\xff1", b"n2"])
    table = pa.table({"id": ["r0", "r1", "r2"], "prompt": ["p0", "p1", "p2"], "note": notes})
    pq.write_table(table, tmp_path / "a.parquet")
    read = InputSpec(str(tmp_path), id_column="id", prompt_column="prompt", used_columns=("note",))
    unread = dataclasses.replace(read, used_columns=())
    assert [(r["note"], r["__row_error"] is not None) for r in _read(read)] == [
        ("n0", False),
        (None, True),
        ("n2", False),
    ]
    rows = _read(unread)
    assert [(r["id"], r["note"], r.get("__row_error")) for r in rows] == [
        ("r0", "n0", None),
        ("r1", None, None),
        ("r2", "n2", None),
    ]


def test_a_fraction_deep_inside_nested_lists_is_found_without_exhausting_the_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Deeper than a recursive walk of the value could go, but not than the JSON parser reads.
    import shardinfer.readers.jsonl_source as source

    monkeypatch.setattr(source, "SCHEMA_SAMPLE_LINES", 1)
    depth = 600
    path = tmp_path / "in.jsonl"
    numbers = ["1", "2.5", "3"]
    lines = [f'{{"id": {i}, "v": {"[" * depth}{n}{"]" * depth}}}\n' for i, n in enumerate(numbers)]
    path.write_text("".join(lines))
    rows = _read(InputSpec(str(path), id_column="id"))
    assert [(r["id"], r["v"] is None, r.get("__row_error") is None) for r in rows] == [
        (0, False, True),
        (1, True, False),
        (2, False, True),
    ]
    # The value shown is cut short; the column's type is checked only as far as it starts.
    shown = "[" * 77 + "..."
    assert rows[1]["__row_error"].startswith(
        f"{path} line 2: key 'v' holds {shown} (list), but the first lines made it a column of list<"
    )
