"""How many splits a worker holds open: the configured number, or by default enough to keep
max_inflight_requests requests admitted."""

from __future__ import annotations

from shardinfer.pipeline.config import JobConfig
from shardinfer.pipeline.job import splits_in_flight


def _config(**job: int) -> JobConfig:
    return JobConfig.from_dict({"job": job})


def test_auto_covers_the_inflight_requests_plus_one_split() -> None:
    # 512 requests in splits of 128 rows: 4 splits' worth, and one more to refill from.
    assert splits_in_flight(_config(split_rows=128, max_inflight_requests=512), 1) == 5
    # n=4 samples per row: 128 rows are 512 requests, one split's worth.
    assert splits_in_flight(_config(split_rows=128, max_inflight_requests=512), 4) == 2
    # Splits larger than the window: never fewer than two (one reassembling, one being read).
    assert splits_in_flight(_config(split_rows=10_000, max_inflight_requests=512), 1) == 2
    assert splits_in_flight(_config(split_rows=100, max_inflight_requests=1000), 1) == 11


def test_a_configured_number_is_kept() -> None:
    assert (
        splits_in_flight(_config(split_rows=128, max_inflight_requests=512, max_splits_in_flight=1), 1) == 1
    )
