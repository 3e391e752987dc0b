"""A job resumed by a shardinfer whose kernels compute differently (another numerics revision): the
run is warned before it computes anything, and the parts, run records and summary name the revision
each part was written under, so a user can tell a dataset of one arithmetic from a mixed one."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pipeline_kit import cli, cli_env, committed_rows, fine_grained_job, marker_parts

import shardinfer
from shardinfer.engine import release
from shardinfer.jobs.cli import main


def _run_records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((out / "_runs").glob("*.json"))]


def _part_revision(part: Path) -> bytes:
    return dict(pq.read_metadata(part).metadata or {})[b"shardinfer.numerics_revision"]


def _killed_at_its_first_commit(tmp_path: Path, model_dir: Path, shards: Path) -> tuple[Path, Path]:
    """(job file, output) of a job of one-row splits whose run was killed after its first commit."""
    job, out = fine_grained_job(tmp_path, model_dir, str(shards))
    crashed = cli("submit", str(job), env=cli_env(SHARDINFER_TEST_CRASH_AT="after_commit"))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    return job, out


def test_a_job_resumed_under_another_revision_is_warned_of_and_its_parts_say_which_wrote_them(
    tmp_path: Path,
    model_dir: Path,
    shards: Path,
    reference: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    job, out = _killed_at_its_first_commit(tmp_path, model_dir, shards)
    first = set(marker_parts(out))
    assert 0 < len(first) < 24
    (record,) = _run_records(out)
    was = release.NUMERICS_REVISION
    assert (record["numerics_revision"], record["version"]) == (was, shardinfer.__version__)

    # The same version resumes in silence.
    assert main(["submit", "--dry-run", str(job)]) == 0
    assert "numerics revision" not in capsys.readouterr().err

    later = was + 1
    monkeypatch.setattr(release, "NUMERICS_REVISION", later)
    assert main(["submit", str(job)]) == 0
    captured = capsys.readouterr()
    assert (
        f"{len(first)} split(s) are already committed, and earlier runs of this job computed with numerics "
        f"revision {was} (shardinfer {shardinfer.__version__}); this shardinfer {shardinfer.__version__} "
        f"computes with revision {later}, so the splits it writes may differ in bits" in captured.err
    )
    assert "finish the job with the version that started it" in captured.err

    parts = marker_parts(out)
    assert len(parts) == 24 and first <= set(parts)
    for part in parts:
        assert _part_revision(out / part) == str(was if part in first else later).encode(), part
    success = json.loads((out / "_SUCCESS").read_text())
    assert success["summary"]["numerics_revisions"] == {str(was): len(first), str(later): 24 - len(first)}
    assert (
        f"revisions      parts written by kernels that compute differently: {len(first)} under {was}, "
        f"{24 - len(first)} under {later} (may differ in bits)" in captured.out
    )
    assert [r["numerics_revision"] for r in _run_records(out)] == [was, later]
    assert main(["status", str(out)]) == 0
    assert (
        f"revisions  parts by numerics revision: {len(first)} under {was}, {24 - len(first)} under {later}"
        in capsys.readouterr().out
    )
    assert main(["history", str(out)]) == 0
    versions = [line.split("version=")[1].split()[0] for line in capsys.readouterr().out.splitlines()]
    assert versions == [f"{shardinfer.__version__}/{was}", f"{shardinfer.__version__}/{later}"]
    # Resuming lost and repeated nothing (the kernels themselves did not change here).
    assert committed_rows(str(out)) == reference


def test_runs_of_versions_before_revisions_were_recorded_are_not_warned_of(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # What such a run computed with is not known, so nothing is claimed about it. (Its record is
    # made to look like an older version's; its parts still carry this version's revision.)
    job, out = _killed_at_its_first_commit(tmp_path, model_dir, shards)
    (path,) = sorted((out / "_runs").glob("*.json"))
    record = json.loads(path.read_text())
    del record["numerics_revision"], record["version"]
    path.write_text(json.dumps(record))
    assert main(["submit", str(job)]) == 0
    captured = capsys.readouterr()
    assert "numerics revision" not in captured.err
    assert "revisions      " not in captured.out  # every part has one revision: no line
    summary = json.loads((out / "_SUCCESS").read_text())["summary"]
    assert summary["numerics_revisions"] == {str(release.NUMERICS_REVISION): 24}
    assert main(["status", "--json", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["numerics_revisions"] == {str(release.NUMERICS_REVISION): 24}
