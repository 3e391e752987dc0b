"""`--dry-run` over an output that holds another job: it says what a submit would do, writes nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pipeline_kit import cli, standard_job, write_shards

from shardinfer.jobs.cli import main
from shardinfer.jobs.spec import load_toml, resolve
from shardinfer.pipeline.job import open_job, write_plan


def _files(out: Path) -> list[tuple[str, bytes]]:
    return sorted((str(p.relative_to(out)), p.read_bytes()) for p in out.rglob("*") if p.is_file())


def test_dry_run_over_another_fingerprint(tmp_path: Path, model_dir: Path) -> None:
    shards = write_shards(tmp_path / "in", files=1, rows=8)
    job, out = standard_job(tmp_path, model_dir, str(shards))
    planned = open_job(resolve(load_toml(str(job))).config)
    write_plan(planned, "first")  # the output now holds this job (temperature 0.8)
    before = _files(out)
    drift = cli("submit", "--dry-run", "--conf", "sampling.temperature=0.3", str(job))
    assert drift.returncode == 78, drift.stderr
    assert "# dry run: submitting would exit 78 and write nothing" in drift.stdout
    assert "sampling.defaults.temperature: 0.8 -> 0.3" in drift.stdout
    over = cli(
        "submit", "--dry-run", "--conf", "sampling.temperature=0.3", "--conf", "job.start_over=true", str(job)
    )
    assert over.returncode == 0, over.stderr
    assert f"# submitting would discard the output at {out}, which holds another fingerprint" in over.stdout
    assert "sampling.defaults.temperature: 0.8 -> 0.3" in over.stdout
    # Another input listing is named the same way, and a dry run of the same job has nothing to discard.
    more = write_shards(tmp_path / "more", files=2, rows=8)
    shutil.copy(more / "prompts-01.parquet", shards / "prompts-01.parquet")
    grown = cli("submit", "--dry-run", str(job))
    assert grown.returncode == 78, grown.stderr
    assert f"would exit 78 and write nothing: the input of the job at {out} changed" in grown.stdout
    assert f"added: {shards / 'prompts-01.parquet'}" in grown.stdout
    added = cli("submit", "--dry-run", "--conf", "job.incremental=true", str(job))
    assert added.returncode == 0, added.stderr
    assert (
        "# submitting would plan the input that is new since the job was planned (job.incremental = true): 1 added file(s)"
        in added.stdout
    )
    assert "discard" not in added.stdout
    assert _files(out) == before  # a dry run writes and deletes nothing


def test_a_resumed_job_says_its_split_rows_do_not_apply(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A resumed job keeps its stored plan; another job.split_rows was taken in silence, and a dry run
    # listed the plan of 4-row splits under a resolved spec saying 2.
    shards = write_shards(tmp_path / "in", files=1, rows=8)
    job, out = standard_job(tmp_path, model_dir, str(shards))  # job.split_rows = 4: 2 splits
    write_plan(open_job(resolve(load_toml(str(job))).config), "first")
    assert main(["submit", "--dry-run", "--conf", "job.split_rows=2", str(job)]) == 0
    printed = capsys.readouterr().out
    assert "# plan: 2 split(s)" in printed
    assert (
        f"# submitting would keep the job's plan: job.split_rows=2 does not apply: the job at {out} was "
        "planned with 4 rows per split" in printed
    )
    assert main(["submit", "--dry-run", str(job)]) == 0
    assert "keep the job's plan" not in capsys.readouterr().out
