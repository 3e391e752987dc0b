"""local[N] through the driver's split scheduler: no split computed twice, output equal to `local`."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pipeline_kit import cli, committed_rows, part_files, standard_job


def committed_tables(out: Path) -> dict[str, pa.Table]:
    """Each committed split's part, read through its marker, by split number (marker names also
    carry the job generation, which differs between two jobs)."""
    tables = {}
    for marker in sorted((out / "_commits").glob("*.json")):
        part = json.loads(marker.read_text())["part"]
        tables[marker.stem.split(".")[0]] = pq.read_table(out / part)
    return tables


def test_local2_computes_every_split_once_and_matches_local(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    (tmp_path / "two").mkdir()
    (tmp_path / "one").mkdir()
    job, out = standard_job(tmp_path / "two", model_dir, str(shards))
    result = cli("submit", "--master", "local[2]", "--verbose", "--log-format", "json", str(job))
    assert result.returncode == 0, result.stderr
    logs = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    # Every attempt at a split ends in one "split committed" or "split lost" line from its worker.
    attempts = Counter(e["split"] for e in logs if e.get("msg", "").startswith("split "))
    assert attempts == Counter({i: 1 for i in range(6)}), attempts
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["run_split_attempts"] == 6 and summary["run_splits_redone"] == 0
    assert summary["run_rows_redone"] == 0
    # The engines generated exactly the tokens that were kept: no work thrown away.
    kept = committed_rows(str(out))
    assert summary["run_completion_tokens"] == sum(r["completion_tokens"] for r in kept)
    assert len(part_files(out)) == 6  # one attempt, hence one part file, per split
    assert kept == reference
    # Same bytes as a `local` run, split by split (the footers differ only in run ids).
    local_job, local_out = standard_job(tmp_path / "one", model_dir, str(shards))
    assert cli("submit", str(local_job)).returncode == 0
    ours, theirs = committed_tables(out), committed_tables(local_out)
    assert ours.keys() == theirs.keys()
    for name, table in ours.items():
        assert table.equals(theirs[name]), name
