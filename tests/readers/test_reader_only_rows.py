"""A split with `only_rows` yields just those rows of its range, in order, in both formats and
through a query; its record round-trips through JSON (how `_job.json` and workers carry it)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardinfer.readers import InputSpec, Split, plan_splits, read_split


def _rows(n: int) -> list[dict[str, object]]:
    return [{"prompt": f"question {i}", "k": i} for i in range(n)]


def _write(tmp_path: Path, fmt: str) -> Path:
    if fmt == "parquet":
        path = tmp_path / "in.parquet"
        pq.write_table(pa.Table.from_pylist(_rows(23)), path, row_group_size=5)
    else:
        path = tmp_path / "in.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in _rows(23)))
    return path


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_only_rows_of_a_range(tmp_path: Path, fmt: str) -> None:
    path = _write(tmp_path, fmt)
    spec = InputSpec(str(path), prompt_column="prompt")
    second = plan_splits(spec, split_rows=10)[1]  # rows [10, 20), aligned as the planner aligns them
    chosen = Split(0, 0, str(path), second.row_start, 23, second.byte_offset, (11, 12, 19, 22))
    got = [r for b in read_split(chosen, spec, batch_rows=2) for r in b.to_pylist()]
    assert [(r["k"], r["__row_index"]) for r in got] == [(11, 11), (12, 12), (19, 19), (22, 22)]
    assert chosen.num_rows == 4
    queried = InputSpec(str(path), prompt_column="prompt", query="SELECT * FROM input WHERE k % 2 = 0")
    assert [r["k"] for b in read_split(chosen, queried) for r in b.to_pylist()] == [12, 22]
    assert Split.from_dict(json.loads(json.dumps(chosen.to_dict()))) == chosen
