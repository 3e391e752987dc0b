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


def _run_once(query: str, batch: pa.RecordBatch) -> list[dict]:
    runner = QueryRunner(query, "f.parquet")
    try:
        return runner(batch).to_pylist()
    finally:
        runner.close()


@pytest.mark.parametrize(
    "query",
    [
        "SELECT id, n + 1 AS m FROM input",  # `+` also has a time-zone-dependent form
        "SELECT id, n - 1 AS m FROM input",
        "SELECT id, year(DATE '2024-05-06') AS y FROM input",
        "SELECT id, age(TIMESTAMP '2024-05-06', TIMESTAMP '2023-05-06') AS a FROM input",
    ],
)
def test_deterministic_functions_are_not_refused_for_a_volatile_namesake(query: str) -> None:
    prepare_query(query)


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("SELECT id, current_date AS d FROM input", "current_date"),
        ("SELECT id, CURRENT_TIMESTAMP AS d FROM input", "CURRENT_TIMESTAMP"),
        ("SELECT * FROM input WHERE localtime > TIME '12:00'", "localtime"),
        ("SELECT id, age(TIMESTAMP '2024-05-06') AS a FROM input", "age"),  # from then to now
        ("SELECT id, today() AS d FROM input", "today"),
    ],
)
def test_clock_readings_are_refused(query: str, reason: str) -> None:
    with pytest.raises(InputQueryError, match="changes from run to run") as info:
        prepare_query(query)
    assert reason in str(info.value)


def test_time_zone_functions_give_the_same_rows_on_every_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker whose machine runs in another time zone must still compute the planned rows.
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    batch = pa.RecordBatch.from_pylist([{"id": "a", "__row_index": 0}])
    query = (
        "SELECT id, CAST(TIMESTAMPTZ '2020-01-01 00:30:00+01' AS VARCHAR) AS t, "
        "hour(TIMESTAMPTZ '2020-01-01 00:30:00+01') AS h FROM input"
    )
    assert _run_once(query, batch) == [{"__row_index": 0, "id": "a", "t": "2019-12-31 23:30:00+00", "h": 23}]


@pytest.mark.parametrize(
    "query",
    [
        "SELECT id, __row_index + 1 AS __row_index FROM input",
        "SELECT * REPLACE (__row_index * 0 AS __row_index) FROM input",
        "SELECT id, CASE WHEN id = 'b' THEN NULL ELSE __row_index END AS __row_index FROM input",
        "SELECT id, 7 - __row_index AS __row_index FROM input",
    ],
)
def test_a_computed_row_index_is_refused(query: str) -> None:
    # Row ids and the split's row accounting come from __row_index: a computed one would give a row
    # another row's id (here, the next row's).
    batch = pa.RecordBatch.from_pylist(
        [{"id": k, "__row_index": i} for i, k in zip((3, 4, 5), "abc", strict=True)]
    )
    with pytest.raises(InputQueryError, match="must keep __row_index"):
        _run_once(query, batch)


def test_filtering_rows_keeps_their_own_row_index() -> None:
    batch = pa.RecordBatch.from_pylist(
        [{"id": k, "__row_index": i} for i, k in zip((3, 4, 5), "abc", strict=True)]
    )
    got = _run_once("SELECT id FROM input WHERE id <> 'b'", batch)
    assert got == [{"__row_index": 3, "id": "a"}, {"__row_index": 5, "id": "c"}]


def test_query_giving_two_columns_one_name_is_refused_at_planning(parquet_dir: Path) -> None:
    spec = InputSpec(
        str(parquet_dir), query="SELECT id, prompt, lang AS prompt FROM input", prompt_column="prompt"
    )
    with pytest.raises(InputQueryError, match=r"\['prompt'\] to more than one column"):
        plan_splits(spec, split_rows=10)


def test_a_row_the_query_fails_on_is_an_error_row_and_the_others_go_on(tmp_path: Path) -> None:
    counts = ["1", "2", "x", "4", "5", "6"]
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(6)], "n": counts}), tmp_path / "a.parquet")
    spec = InputSpec(str(tmp_path), query="SELECT id, CAST(n AS INTEGER) * 10 AS tens FROM input")
    (split,) = plan_splits(spec, split_rows=10)
    rows = [r for b in read_split(split, spec, batch_rows=4) for r in b.to_pylist()]
    # Reference: the same arithmetic in Python; the row DuckDB cannot convert keeps its place.
    assert [(r["__row_index"], r["id"], r["tens"]) for r in rows] == [
        (i, None, None) if n == "x" else (i, f"r{i}", int(n) * 10) for i, n in enumerate(counts)
    ]
    reasons = [r.get("__row_error") for r in rows]
    assert reasons[:2] == [None, None] and reasons[3:] == [None, None, None]
    assert "input.query failed on this row: Conversion Error" in reasons[2] and "TRY_CAST" in reasons[2]


def test_a_query_no_row_of_a_batch_passes_stops_the_job(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": ["a", "b", "c"], "n": ["x", "y", "z"]}), tmp_path / "a.parquet")
    spec = InputSpec(str(tmp_path), query="SELECT id, CAST(n AS INTEGER) AS k FROM input")
    (split,) = plan_splits(spec, split_rows=10)
    with pytest.raises(InputQueryError, match=r"failed on .*a\.parquet: Conversion Error"):
        list(read_split(split, spec))
