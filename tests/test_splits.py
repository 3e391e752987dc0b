"""The split plan on the ground floor: stored and read back the same, damage refused."""

from __future__ import annotations

import json

import pytest

from shardinfer.splits import ROW_INDEX_COLUMN, Split, plan_from_records, plan_to_records


def test_plan_round_trips_through_json() -> None:
    plan = [Split(0, 0, "s3://b/a.parquet", 0, 10), Split(1, 1, "s3://b/b.jsonl", 10, 20, 512)]
    records = json.loads(json.dumps(plan_to_records(plan)))
    assert records[1] == {
        "index": 1,
        "file_index": 1,
        "path": "s3://b/b.jsonl",
        "row_start": 10,
        "row_end": 20,
        "byte_offset": 512,
    }
    assert plan_from_records(records) == plan
    assert [s.name for s in plan] == ["00000", "00001"] and plan[1].num_rows == 10


def test_a_plan_out_of_order_is_refused() -> None:
    records = plan_to_records([Split(1, 0, "a", 0, 5), Split(0, 0, "a", 5, 9)])
    with pytest.raises(ValueError, match="position 0 holds split 1"):
        plan_from_records(records)
    with pytest.raises(ValueError, match="not a split record"):
        plan_from_records([{"index": 0}])


def test_readers_and_pipeline_share_the_row_index_column() -> None:
    from shardinfer import readers
    from shardinfer.pipeline import rows

    assert readers.ROW_INDEX_COLUMN is ROW_INDEX_COLUMN and rows.ROW_INDEX_COLUMN is ROW_INDEX_COLUMN
    assert readers.Split is Split
