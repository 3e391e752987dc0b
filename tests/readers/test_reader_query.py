"""input.query: row-wise DuckDB SQL applied per batch; non-splittable queries refused up front."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardinfer.readers import (
    InputQueryError,
    InputSchemaError,
    InputSpec,
    plan_splits,
    read_schema,
    read_split,
)
from shardinfer.readers.query import QueryRunner, prepare_query


@pytest.fixture
def parquet_dir(tmp_path: Path) -> Path:
    rows = [
        {"id": f"r{i}", "prompt": f"p{i}", "lang": "fr" if i % 3 == 0 else "en", "n": i} for i in range(40)
    ]
    pq.write_table(pa.Table.from_pylist(rows[:25]), tmp_path / "a.parquet", row_group_size=5)
    pq.write_table(pa.Table.from_pylist(rows[25:]), tmp_path / "b.parquet", row_group_size=5)
    return tmp_path


def test_row_wise_query_per_split_equals_the_filter_over_all_rows(parquet_dir: Path) -> None:
    spec = InputSpec(
        str(parquet_dir),
        query="SELECT id, upper(prompt) AS prompt, n * 2 AS twice FROM input WHERE lang = 'en'",
        prompt_column="prompt",
    )
    splits = plan_splits(spec, split_rows=10)
    got = [row for s in splits for b in read_split(s, spec, batch_rows=4) for row in b.to_pylist()]
    # Reference in plain Python over the same rows: file order, row index within each file.
    want = [
        {"__row_index": i if i < 25 else i - 25, "id": f"r{i}", "prompt": f"P{i}", "twice": 2 * i}
        for i in range(40)
        if i % 3 != 0
    ]
    assert got == want
    assert read_schema(spec).names == ["__row_index", "id", "prompt", "twice"]


def test_star_query_keeps_row_index_in_place(parquet_dir: Path) -> None:
    spec = InputSpec(str(parquet_dir / "a.parquet"), query="SELECT * EXCLUDE (lang) FROM input WHERE n >= 23")
    (split,) = [s for s in plan_splits(spec, split_rows=10) if s.row_end == 25]
    rows = [r for b in read_split(split, spec) for r in b.to_pylist()]
    assert rows == [
        {"id": "r23", "prompt": "p23", "n": 23, "__row_index": 23},
        {"id": "r24", "prompt": "p24", "n": 24, "__row_index": 24},
    ]


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("SELECT count(*) FROM input", "aggregate"),
        ("SELECT lang, max(n) FROM input GROUP BY lang", "GROUP BY"),
        ("SELECT max(n) AS m FROM input", "aggregate"),
        ("SELECT lang FROM input GROUP BY lang", "GROUP BY"),
        ("SELECT * FROM input ORDER BY n", "ORDER BY"),
        ("SELECT * FROM input LIMIT 3", "LIMIT"),
        ("SELECT DISTINCT lang FROM input", "DISTINCT"),
        ("SELECT id, row_number() OVER () FROM input", "window"),
        ("SELECT a.id FROM input a JOIN input b USING (n)", "view `input` alone"),
        ("SELECT * FROM input WHERE n IN (SELECT n FROM input WHERE lang = 'fr')", "subquery"),
        ("SELECT id FROM input UNION ALL SELECT id FROM input", "set operation"),
        ("WITH x AS (SELECT * FROM input) SELECT * FROM x", "WITH"),
        ("SELECT id, random() AS r FROM input", "random"),
        ("SELECT id, now() AS t FROM input", "now"),
        ("SELECT unnest([1, 2]) AS x, id FROM input", "unnest"),
        ("SELECT * FROM other_table", "view `input` alone"),
        ("SELECT 1; SELECT 2", "2 statements"),
        ("DELETE FROM input", "cannot be used"),
    ],
)
def test_non_row_wise_queries_are_refused_with_the_reason(query: str, reason: str) -> None:
    with pytest.raises(InputQueryError, match=r"input\.query") as info:
        prepare_query(query)
    assert reason in str(info.value)


def test_query_errors_surface_at_planning(parquet_dir: Path) -> None:
    with pytest.raises(InputQueryError, match="ORDER BY"):
        plan_splits(InputSpec(str(parquet_dir), query="SELECT * FROM input ORDER BY n"), split_rows=10)
    with pytest.raises(InputQueryError, match=r"(?s)failed on .*a.parquet.*'id', 'prompt', 'lang', 'n'"):
        plan_splits(InputSpec(str(parquet_dir), query="SELECT nope FROM input"), split_rows=10)
    with pytest.raises(InputSchemaError, match=r"\['prompt'\] not found after input.query"):
        plan_splits(
            InputSpec(str(parquet_dir), query="SELECT id FROM input", prompt_column="prompt"), split_rows=10
        )


def test_row_index_is_added_when_the_select_list_omits_it() -> None:
    assert prepare_query("SELECT id FROM input WHERE n > 1").startswith("SELECT __row_index, id")
    star = "SELECT * FROM input"
    assert prepare_query(star) == star
    runner = QueryRunner("SELECT x, 'a' AS __row_index FROM input", "f.parquet")
    with pytest.raises(InputQueryError, match="must keep __row_index"):
        runner(pa.RecordBatch.from_pylist([{"x": 1, "__row_index": 0}]))
    runner.close()
