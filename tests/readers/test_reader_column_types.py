"""Column encodings and types a Parquet writer may choose: read as the values they hold, and a
column that cannot be what the spec uses it for refused when the job is planned."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardinfer.readers import (
    InputColumnError,
    InputSchemaError,
    InputSpec,
    plan_splits,
    read_schema,
    read_split,
)

_PROMPTS = ["1+1=", "2+2=", "1+1=", None, "3+3="]


def _messages(contents: list[str]) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": c}] for c in contents]


def _rows(spec: InputSpec, split_rows: int) -> list[dict]:
    return [
        r
        for s in plan_splits(spec, split_rows)
        for b in read_split(s, spec, batch_rows=2)
        for r in b.to_pylist()
    ]


def test_dictionary_encoded_columns_are_read_as_their_values(tmp_path: Path) -> None:
    # A pandas categorical is stored as a dictionary, and pyarrow reads it back as one.
    messages = pa.array(_messages(["a", "b", "a", "c", "b"]))
    role_dict = pa.ListArray.from_arrays(
        messages.offsets,
        pa.StructArray.from_arrays(
            [
                pa.array(["user"] * 5).dictionary_encode(),
                messages.values.field("content").dictionary_encode(),
            ],
            names=["role", "content"],
        ),
    )
    table = pa.table(
        {
            "id": ["r0", "r1", "r2", "r3", "r4"],
            "prompt": pa.array(_PROMPTS).dictionary_encode(),
            "messages": role_dict,
        }
    )
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=2)
    spec = InputSpec(str(tmp_path), id_column="id", prompt_column="prompt")
    schema = read_schema(spec)
    assert schema.field("prompt").type == pa.string()
    assert schema.field("messages").type == pa.list_(
        pa.struct([("role", pa.string()), ("content", pa.string())])
    )
    rows = _rows(spec, split_rows=3)
    assert [r["prompt"] for r in rows] == _PROMPTS
    assert [r["messages"] for r in rows] == _messages(["a", "b", "a", "c", "b"])
    assert [r["__row_index"] for r in rows] == [0, 1, 2, 3, 4]


def test_a_dictionary_file_and_a_plain_file_share_one_schema(tmp_path: Path) -> None:
    pq.write_table(pa.table({"prompt": pa.array(_PROMPTS).dictionary_encode()}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"prompt": pa.array(_PROMPTS)}), tmp_path / "b.parquet")
    spec = InputSpec(str(tmp_path), prompt_column="prompt")
    assert [r["prompt"] for r in _rows(spec, split_rows=10)] == _PROMPTS + _PROMPTS


@pytest.mark.parametrize(
    "ids",
    [
        pa.array([b"a", b"b"], pa.binary()),
        pa.array([[1], [2]]),
        pa.array([{"k": 1}, {"k": 2}]),
    ],
)
def test_an_id_column_that_has_no_text_form_is_refused(tmp_path: Path, ids: pa.Array) -> None:
    # str() of bytes or of a nested value is its Python repr ("b'a'"): not an id anyone can look up.
    pq.write_table(pa.table({"id": ids, "prompt": ["x", "y"]}), tmp_path / "a.parquet")
    with pytest.raises(
        InputColumnError, match=r"input.id_column='id' is a column of .*CAST\(id AS VARCHAR\)"
    ):
        plan_splits(InputSpec(str(tmp_path), id_column="id", prompt_column="prompt"), split_rows=10)


@pytest.mark.parametrize(
    "ids", [pa.array([1, 2]), pa.array([1.5, 2.0]), pa.array(["a", "b"], pa.large_string())]
)
def test_scalar_id_columns_are_accepted(tmp_path: Path, ids: pa.Array) -> None:
    pq.write_table(pa.table({"id": ids, "prompt": ["x", "y"]}), tmp_path / "a.parquet")
    assert (
        len(plan_splits(InputSpec(str(tmp_path), id_column="id", prompt_column="prompt"), split_rows=10)) == 1
    )


def test_a_file_with_two_columns_of_one_name_is_refused(tmp_path: Path) -> None:
    table = pa.Table.from_arrays([pa.array(["x"]), pa.array(["y"])], names=["prompt", "prompt"])
    pq.write_table(table, tmp_path / "a.parquet")
    with pytest.raises(InputSchemaError, match=r"more than one column named \['prompt'\]"):
        plan_splits(InputSpec(str(tmp_path), prompt_column="prompt"), split_rows=10)


def test_string_views_are_read_as_strings(tmp_path: Path) -> None:
    table = pa.table(
        {"prompt": pa.array(_PROMPTS, pa.string_view()), "raw": pa.array([b"x"] * 5, pa.binary_view())}
    )
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=2)
    spec = InputSpec(str(tmp_path), prompt_column="prompt")
    schema = read_schema(spec)
    assert (schema.field("prompt").type, schema.field("raw").type) == (pa.string(), pa.binary())
    rows = _rows(spec, split_rows=10)
    assert [r["prompt"] for r in rows] == _PROMPTS and [r["raw"] for r in rows] == [b"x"] * 5
