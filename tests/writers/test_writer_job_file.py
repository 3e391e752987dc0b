"""_job.json records."""

from __future__ import annotations

import json

import pytest

from shardinfer.splits import Split
from shardinfer.writers import make_job_record, splits_from_job


def test_job_record_round_trips_the_split_plan_through_json() -> None:
    splits = [Split(0, 0, "s3://b/a.parquet", 0, 10), Split(1, 1, "s3://b/b.jsonl", 10, 20, 512)]
    record = make_job_record("run-7", {"model": "m"}, splits, extra={"input": {"path": "s3://b/"}})
    loaded = json.loads(json.dumps(record))
    assert splits_from_job(loaded) == splits
    assert (
        loaded["run_id"] == "run-7"
        and loaded["total_input_rows"] == 20
        and loaded["input"] == {"path": "s3://b/"}
    )
    with pytest.raises(ValueError, match="overwrite"):
        make_job_record("r", {}, splits, extra={"splits": []})
    loaded["splits"].reverse()
    with pytest.raises(ValueError, match="damaged"):
        splits_from_job(loaded)
