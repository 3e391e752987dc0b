"""Parquet planning (row-group-aligned splits), streaming reads, row indexes and reader errors."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardinfer.readers import InputSchemaError, InputSpec, Split, plan_splits, read_schema, read_split
from shardinfer.readers.parquet_source import plan_file_ranges


def _table(n: int, offset: int = 0) -> pa.Table:
    return pa.table(
        {
            "id": [f"r{offset + i}" for i in range(n)],
            "prompt": [f"prompt number {offset + i}" for i in range(n)],
            "n": pa.array(range(offset, offset + n), type=pa.int64()),
        }
    )


@pytest.mark.parametrize(
    ("groups", "split_rows", "expected"),
    [
        ([4, 4, 4, 4, 4, 4, 1], 10, [(0, 8), (8, 16), (16, 25)]),  # whole groups packed greedily
        ([10, 10], 10, [(0, 10), (10, 20)]),  # exact fit
        ([3, 25, 2], 10, [(0, 3), (3, 13), (13, 23), (23, 28), (28, 30)]),  # an oversized group is cut
        ([0, 5, 0, 5], 100, [(0, 10)]),  # empty row groups are skipped
        ([], 10, []),
    ],
)
def test_plan_file_ranges(groups: list[int], split_rows: int, expected: list[tuple[int, int]]) -> None:
    assert plan_file_ranges(groups, split_rows) == expected


def test_plan_splits_over_files_and_read_back_every_row(tmp_path: Path) -> None:
    pq.write_table(_table(7), tmp_path / "a.parquet", row_group_size=10)
    pq.write_table(_table(25, offset=100), tmp_path / "b.parquet", row_group_size=4)
    pq.write_table(
        _table(1).slice(0, 0), tmp_path / "c.parquet"
    )  # empty file: no split, keeps its file index
    pq.write_table(_table(3, offset=500), tmp_path / "d.parquet")
    spec = InputSpec(str(tmp_path), prompt_column="prompt", id_column="id")
    splits = plan_splits(spec, split_rows=10)
    a, b, d = (str(tmp_path / n) for n in ("a.parquet", "b.parquet", "d.parquet"))
    assert splits == [
        Split(0, 0, a, 0, 7),
        Split(1, 1, b, 0, 8),
        Split(2, 1, b, 8, 16),
        Split(3, 1, b, 16, 25),
        Split(4, 3, d, 0, 3),
    ]
    assert [s.name for s in splits] == ["00000", "00001", "00002", "00003", "00004"]
    assert [Split.from_dict(s.to_dict()) for s in splits] == splits

    for split in splits:
        got = pa.Table.from_batches(list(read_split(split, spec, batch_rows=3)))
        # The reference is pyarrow's own whole-file read, sliced to the split's range.
        want = pq.read_table(split.path).slice(split.row_start, split.num_rows)
        assert got.drop_columns(["__row_index"]).equals(want)
        assert got["__row_index"].to_pylist() == list(range(split.row_start, split.row_end))
        assert got.schema.field("__row_index").type == pa.int64()
    assert read_schema(spec).names == ["id", "prompt", "n", "__row_index"]


def test_streaming_memory_is_bounded_by_the_batch(tmp_path: Path) -> None:
    rows = 60_000
    big = pa.table({"prompt": [f"{i:08d}" + "x" * 200 for i in range(rows)]})
    path = tmp_path / "big.parquet"
    pq.write_table(big, path, row_group_size=5_000, compression="none")
    file_bytes = big.nbytes
    del big
    spec = InputSpec(str(path))
    (split,) = plan_splits(spec, split_rows=rows)
    baseline = pa.total_allocated_bytes()
    peak = 0
    largest = 0
    seen = 0
    for batch in read_split(split, spec, batch_rows=500):
        largest = max(largest, batch.num_rows)
        peak = max(peak, pa.total_allocated_bytes() - baseline)
        assert batch["__row_index"][0].as_py() == seen
        seen += batch.num_rows
    assert seen == rows
    assert largest == 500
    # One row group (~1/12 of the file) plus a batch may be held; the whole file never is.
    assert peak < file_bytes / 4, (peak, file_bytes)


def test_missing_column_names_file_column_and_available_columns(tmp_path: Path) -> None:
    pq.write_table(_table(3), tmp_path / "a.parquet")
    with pytest.raises(InputSchemaError) as info:
        plan_splits(InputSpec(str(tmp_path), prompt_column="text"), split_rows=10)
    message = str(info.value)
    assert "a.parquet" in message and "'text'" in message and "['id', 'prompt', 'n']" in message


def test_corrupt_parquet_names_the_file(tmp_path: Path) -> None:
    pq.write_table(_table(3), tmp_path / "a.parquet")
    (tmp_path / "b.parquet").write_bytes(b"PAR1 this is not parquet at all")
    with pytest.raises(InputSchemaError, match=r"b\.parquet is not a readable Parquet file"):
        plan_splits(InputSpec(str(tmp_path)), split_rows=10)


def test_files_with_different_schemas_are_refused(tmp_path: Path) -> None:
    pq.write_table(_table(3), tmp_path / "a.parquet")
    pq.write_table(_table(3).drop_columns(["n"]), tmp_path / "b.parquet")
    with pytest.raises(
        InputSchemaError, match=r"b\.parquet does not have the same columns .*\(n: int64 vs absent\)"
    ):
        plan_splits(InputSpec(str(tmp_path)), split_rows=10)


def test_input_that_shrank_after_planning_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    pq.write_table(_table(20), path, row_group_size=5)
    spec = InputSpec(str(path))
    last = plan_splits(spec, split_rows=10)[-1]
    pq.write_table(_table(12), path, row_group_size=5)
    with pytest.raises(InputSchemaError, match="changed after the job was planned"):
        list(read_split(last, spec))


def test_reserved_row_index_column_is_refused(tmp_path: Path) -> None:
    pq.write_table(_table(2).append_column("__row_index", pa.array([0, 1])), tmp_path / "a.parquet")
    with pytest.raises(InputSchemaError, match="reserves"):
        plan_splits(InputSpec(str(tmp_path)), split_rows=10)


def _invalid_utf8_file(path: Path) -> None:
    """Five rows, two of them with bytes that are not UTF-8 (one in the id, one in the prompt)."""
    from shardinfer.testing.hostile_inputs import raw_string_array

    ids = raw_string_array([b"r0", b"r1", b"r\xff2", b"r3", b"r4"])
    prompts = raw_string_array([b"p0", b"p\xc3\x281", b"p2", b"p3", "p4 é".encode()])
    pq.write_table(pa.table({"id": ids, "prompt": prompts, "n": [0, 1, 2, 3, 4]}), path, row_group_size=2)


def test_invalid_utf8_cells_become_null_in_error_rows(tmp_path: Path) -> None:
    _invalid_utf8_file(tmp_path / "a.parquet")
    spec = InputSpec(str(tmp_path), id_column="id", prompt_column="prompt")
    rows = [
        r for s in plan_splits(spec, split_rows=10) for b in read_split(s, spec, 2) for r in b.to_pylist()
    ]
    assert [(r["id"], r["prompt"], r["n"], r["__row_index"]) for r in rows] == [
        ("r0", "p0", 0, 0),
        ("r1", None, 1, 1),
        (None, "p2", 2, 2),
        ("r3", "p3", 3, 3),
        ("r4", "p4 é", 4, 4),
    ]
    reasons = [r.get("__row_error") for r in rows]
    assert reasons[0] is None and reasons[3] is None and reasons[4] is None
    assert "column 'prompt' of row 1 in" in reasons[1] and "not valid UTF-8" in reasons[1]
    assert "column 'id' of row 2 in" in reasons[2]


def test_invalid_utf8_rows_bypass_the_query_and_keep_their_place(tmp_path: Path) -> None:
    _invalid_utf8_file(tmp_path / "a.parquet")
    spec = InputSpec(str(tmp_path), prompt_column="prompt", query="SELECT prompt FROM input WHERE n <> 3")
    (split,) = plan_splits(spec, split_rows=10)
    rows = [r for b in read_split(split, spec, 5) for r in b.to_pylist()]
    # Row 2's bad bytes are in a column the query drops: the row is still one the reader could not
    # decode, so the query never judges it.
    assert [(r["__row_index"], r["prompt"], r["__row_error"] is not None) for r in rows] == [
        (0, "p0", False),
        (1, None, True),
        (2, None, True),
        (4, "p4 é", False),
    ]


def test_reserved_row_error_column_is_refused(tmp_path: Path) -> None:
    pq.write_table(_table(2).append_column("__row_error", pa.array(["a", None])), tmp_path / "a.parquet")
    with pytest.raises(InputSchemaError, match=r"__row_error.*reserves"):
        plan_splits(InputSpec(str(tmp_path)), split_rows=10)
