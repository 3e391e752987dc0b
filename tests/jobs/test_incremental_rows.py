"""job.incremental end to end: a rewritten input file's rows with new ids are computed and committed
beside the old splits, exactly as a fresh job over those rows alone computes them."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pipeline_kit import cli, committed_rows, prompt_rows, standard_job, write_shards


def test_new_ids_of_a_rewritten_file_are_added(tmp_path: Path, model_dir: Path) -> None:
    inp = write_shards(tmp_path / "in", files=2, rows=8)
    (tmp_path / "job").mkdir()
    job, out = standard_job(tmp_path / "job", model_dir, str(inp))
    assert cli("submit", str(job)).returncode == 0
    first = committed_rows(str(out))
    parts = {p.name: p.read_bytes() for p in out.glob("part-*.parquet")}
    old = prompt_rows(1, 8)
    new = [{"id": f"new-{k}", "prompt": f"fresh prompt {k}", "topic": "new"} for k in range(3)]
    rewritten = old[:2] + new[:1] + old[2:5] + [{**old[5], "prompt": "edited"}] + old[6:] + new[1:]
    pq.write_table(pa.Table.from_pylist(rewritten), inp / "prompts-01.parquet", row_group_size=4)
    stale = cli("submit", str(job))
    assert stale.returncode == 78 and f"changed: {inp / 'prompts-01.parquet'}" in stale.stderr
    grown = cli("submit", "--conf", "job.incremental=true", str(job))
    assert grown.returncode == 0, grown.stderr
    assert f"3 row(s) with new ids in rewritten {inp / 'prompts-01.parquet'}" in grown.stderr
    # The committed parts are untouched; the new rows equal a fresh job over those rows alone.
    assert all((out / name).read_bytes() == data for name, data in parts.items())
    (tmp_path / "alone").mkdir()
    pq.write_table(pa.Table.from_pylist(new), tmp_path / "alone" / "new.parquet")
    (tmp_path / "alone-job").mkdir()
    alone_job, alone_out = standard_job(tmp_path / "alone-job", model_dir, str(tmp_path / "alone"))
    assert cli("submit", str(alone_job)).returncode == 0
    expected = sorted(first + committed_rows(str(alone_out)), key=lambda r: (r["row_id"], r["sample_index"]))
    assert committed_rows(str(out)) == expected  # the edited old row keeps its committed output
    success = json.loads((out / "_SUCCESS").read_text())
    assert success["totals"]["splits"] == 5 and success["totals"]["rows"] == 16 + 3
    assert success["summary"]["duplicate_row_ids"] == 0
    done = cli("submit", str(job))
    assert done.returncode == 0 and "already complete" in done.stderr + done.stdout
    # A superseded split's part cannot be computed again from the rewritten file: named, not redone.
    job_file = json.loads((out / "_job.json").read_text())
    superseded = job_file["superseded_splits"]
    assert superseded == [2, 3]
    marker = next(json.loads(p.read_text()) for p in (out / "_commits").glob("00002.*.json"))
    (out / marker["part"]).unlink()
    (out / "_SUCCESS").unlink()
    lost = cli("submit", str(job))
    assert lost.returncode == 78, lost.stderr
    assert "split(s) [2] are damaged" in lost.stderr and "cannot be computed again" in lost.stderr
