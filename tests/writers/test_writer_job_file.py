"""_job.json records and fingerprint comparison."""

from __future__ import annotations

import json

import pytest

from shardinfer.readers import Split
from shardinfer.writers import diff_fingerprints, make_job_record, splits_from_job


def test_diff_fingerprints_names_nested_added_and_removed_keys() -> None:
    old = {
        "model": {"path": "m", "dtype": "bf16"},
        "sampling": {"temperature": 0.0},
        "template": "t",
        "gone": 1,
    }
    new = {
        "model": {"path": "m", "dtype": "fp32"},
        "sampling": {"temperature": 0.0, "top_p": 0.9},
        "template": "t",
    }
    assert diff_fingerprints(old, new) == ["gone", "model.dtype", "sampling.top_p"]
    assert diff_fingerprints(old, old) == []
    # A tuple saved to JSON comes back as a list: that is not drift.
    assert diff_fingerprints({"stop": ["a", "b"]}, {"stop": ("a", "b")}) == []
    assert diff_fingerprints({"x": {"a": 1}}, {"x": 1}) == ["x"]


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
