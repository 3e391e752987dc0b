"""An output holding only the plan of a job that committed nothing (its workers refused the spec
after it was planned) takes the corrected job, instead of refusing it as another job's output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline_kit import cli, committed_rows, standard_job


def test_a_spec_refused_by_the_workers_can_be_corrected_in_place(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    job, out = standard_job(tmp_path, model_dir, str(shards))
    # The tiny model has 512 positions: the workers' engines refuse this after the plan is written.
    refused = cli(
        "submit", "--master", "local[2]", "--conf", "engine.max_model_len=4096", str(job), timeout=300
    )
    assert refused.returncode == 78, refused.stderr
    assert "max_model_len=4096 exceeds the model's max_position_embeddings=512" in refused.stderr
    assert (out / "_job.json").exists() and not list(out.glob("part-*"))
    fixed = cli("submit", "--master", "local[2]", str(job), timeout=300)
    assert fixed.returncode == 0, fixed.stderr
    assert "the output holds only the plan of a job that committed nothing and is not running" in fixed.stderr
    assert committed_rows(str(out)) == reference


def test_an_output_with_commits_of_another_job_is_still_refused(
    tmp_path: Path, model_dir: Path, shards: Path
) -> None:
    job, _ = standard_job(tmp_path, model_dir, str(shards))
    assert cli("submit", str(job)).returncode == 0
    drifted = cli("submit", "--conf", "sampling.temperature=0.5", str(job))
    assert drifted.returncode == 78
    assert "holds a job with another fingerprint" in drifted.stderr
