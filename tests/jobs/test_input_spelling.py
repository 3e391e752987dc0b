"""A local input path spelt relative or absolute names one job; a job planned when the fingerprint
held the path as written still resumes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pipeline_kit import REPO, cli, committed_rows, standard_job

from shardinfer.jobs.spec import load_toml, parse_conf, resolve
from shardinfer.pipeline.fingerprint import compute_fingerprint
from shardinfer.pipeline.job import open_job, write_plan
from shardinfer.writers.schema import OUTPUT_SCHEMA_VERSION


def _relative(path: Path) -> str:
    return os.path.relpath(path, REPO)  # the CLI runs in the repository root


def test_relative_and_absolute_spellings_are_one_job(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    job, out = standard_job(tmp_path, model_dir, str(shards))
    assert cli("submit", str(job)).returncode == 0
    again = cli("submit", "--conf", f"input.path={_relative(shards)}", str(job))
    assert again.returncode == 0, again.stderr
    assert "already complete" in again.stderr
    assert committed_rows(str(out)) == reference


def test_a_job_planned_with_the_path_as_written_still_resumes(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    job, out = standard_job(tmp_path, model_dir, _relative(shards))
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        config = resolve(load_toml(str(job)), confs=[parse_conf(f"output.path={out}")]).config
        planned = open_job(config)
        planned.fingerprint = compute_fingerprint(
            config, planned.sampling.to_json_dict(), OUTPUT_SCHEMA_VERSION, absolute_input=False
        )  # as an older version stored it
        assert planned.fingerprint["input.source"]["path"] == _relative(shards)
        write_plan(planned, "older")
    finally:
        os.chdir(cwd)
    resumed = cli("submit", str(job))
    assert resumed.returncode == 0, resumed.stderr
    assert committed_rows(str(out)) == reference
