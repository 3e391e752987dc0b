"""A finished output damaged afterwards: `status` says damaged (never done beside a problem) and a
rerun of the job repairs it to the rows of an undamaged run. Read-only commands (`status`,
`validate`, a refused submit) create nothing at the location they look at."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pipeline_kit import REPO, cli, committed_rows, marker_parts, part_files, standard_job

from shardinfer.jobs.cli import main
from shardinfer.splits import Split
from shardinfer.writers import OutputStore, make_job_record


def _status(out: Path) -> dict[str, Any]:
    result = cli("status", "--json", str(out))
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_rerun_repairs_a_part_damaged_after_success(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]], damage: str
) -> None:
    job, out = standard_job(tmp_path, model_dir, str(shards))
    first = cli("submit", str(job))
    assert first.returncode == 0, first.stderr
    part = out / part_files(out)[1]
    if damage == "deleted":
        part.unlink()
    else:
        part.write_bytes(part.read_bytes()[:500])
    found = _status(out)
    assert found["state"] == "damaged"
    assert [p.split(":")[0] for p in found["problems"]] == ["split 1"]

    rerun = cli("submit", str(job))
    assert rerun.returncode == 0, rerun.stderr
    assert "already complete" not in rerun.stderr
    assert (
        f"_SUCCESS cannot be trusted: committed part(s) were damaged after it was written: split 1: {part.name}"
        in rerun.stderr
    )
    assert f"split 1 was damaged and has been recomputed: {part.name}" in rerun.stderr
    assert committed_rows(str(out)) == reference  # every row once, equal to an undamaged run's
    assert part_files(out) == marker_parts(out) and part.name not in part_files(out)
    success = json.loads((out / "_SUCCESS").read_text())
    assert sorted(f["path"] for f in success["files"]) == marker_parts(out)
    assert list(success["summary"]["repaired"]) == ["1"]
    repaired = _status(out)
    assert repaired["state"] == "done" and repaired["problems"] == []
    again = cli("submit", str(job))
    assert again.returncode == 0 and "already complete" in again.stderr


def test_status_is_damaged_not_done_when_a_footer_cannot_be_read(
    tmp_path: Path, model_dir: Path, shards: Path
) -> None:
    job, out = standard_job(tmp_path, model_dir, str(shards))
    assert cli("submit", str(job)).returncode == 0
    part = out / part_files(out)[2]
    data = part.read_bytes()
    part.write_bytes(data[:-8] + b"\0" * 8)  # the same size: only reading the footer shows it
    result = cli("status", str(out))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{out}: damaged"
    assert lines[1].startswith(f"  problem    split 2: {part.name} cannot be read")
    assert lines[1].endswith("; delete that part file and rerun the job to recompute it")


def test_status_of_what_is_not_an_output_location_says_so_and_creates_nothing(
    tmp_path: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.toml").write_text("[job]\n")
    repo_before = sorted(p.name for p in REPO.iterdir())
    shards_before = sorted(p.name for p in shards.iterdir())
    cases = [
        (
            str(tmp_path / "x" / "nonexist"),
            66,
            "holds no job: nothing is there, no job output at that location (it does not exist)",
        ),
        (f"{tmp_path}/o*", 66, "wildcards are not expanded"),
        (str(tmp_path / "job.toml"), 66, "holds no job: it is a file, not an output location"),
        (str(shards), 66, "holds no job (_job.json is missing)"),
        ("", 64, "OUTPUT_URL is empty"),
    ]
    for url, code, message in cases:
        for command in ("status", "history"):
            assert main([command, url]) == code, (command, url)
            assert message in capsys.readouterr().err, (command, url)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.toml"]
    assert sorted(p.name for p in shards.iterdir()) == shards_before
    assert sorted(p.name for p in REPO.iterdir()) == repo_before


def test_validate_and_a_refused_submit_leave_an_existing_folder_as_it_was(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job, out = standard_job(tmp_path, model_dir, str(shards))
    out.mkdir()
    assert main(["validate", str(job)]) == 0
    assert list(out.iterdir()) == []
    # Another job's _job.json: the submit is refused (fingerprint drift, 78) and writes nothing.
    OutputStore(str(out)).write_job(make_job_record("other", {"hash": "f" * 64}, [Split(0, 0, "x", 0, 4)]))
    assert main(["submit", str(job)]) == 78
    assert "another fingerprint" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["_job.json"]


def test_a_repair_counts_in_this_runs_tokens_and_splits(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    """The finish step's recomputation of a damaged split is this run's work: the summary's tokens
    generated, its split counts and the run record say so (they said 0 computed, 0 tokens)."""
    import pyarrow.parquet as pq

    job, out = standard_job(tmp_path, model_dir, str(shards))
    assert cli("submit", str(job)).returncode == 0
    part = out / part_files(out)[1]
    ids = set(pq.read_table(part, columns=["row_id"]).column("row_id").to_pylist())
    part.unlink()
    # What an undamaged run generated for those rows: the tokens the repair must generate again.
    expected_tokens = sum(r["completion_tokens"] for r in reference if r["row_id"] in ids)
    assert expected_tokens > 0

    rerun = cli("submit", "--log-format", "json", "--run-id", "repair-run", str(job))
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads(rerun.stdout.strip().splitlines()[-1])
    assert summary["repaired"].keys() == {"1"}
    assert summary["run_completion_tokens"] == expected_tokens
    assert summary["output_tokens_per_s"] > 0
    assert (summary["run_split_attempts"], summary["run_splits_committed"]) == (1, 1)
    record = json.loads((out / "_runs" / "repair-run.json").read_text())
    assert record["splits_committed"] == 1
    assert committed_rows(str(out)) == reference


def _dataset_rows(out: Path) -> list[dict[str, Any]]:
    """The rows a dataset reader of the folder sees: every part file it lists, no marker read."""
    import pyarrow.dataset as ds

    table = ds.dataset(str(out), format="parquet", exclude_invalid_files=False).to_table()
    return sorted(table.to_pylist(), key=lambda r: (r["row_id"], r["sample_index"]))


def test_a_finished_jobs_stray_part_is_deleted_by_the_next_submit(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    """A joined run killed between its part and its marker after the other run finalized leaves a
    part no marker names: a resubmit of the finished job deletes it, a dry run only reads."""
    from shardinfer.jobs.spec import load_toml, resolve
    from shardinfer.pipeline.job import open_job, remove_strays

    job, out = standard_job(tmp_path, model_dir, str(shards))
    assert main(["submit", str(job)]) == 0
    committed = part_files(out)[0]
    split, generation, _attempt = committed.removeprefix("part-").removesuffix(".parquet").rsplit("-", 2)
    stray = out / f"part-{split}-{generation}-{'7' * 12}.parquet"  # another attempt at a committed split
    stray.write_bytes((out / committed).read_bytes())
    assert main(["submit", "--dry-run", str(job)]) == 0
    assert stray.exists()  # a dry run writes and deletes nothing
    assert len(_dataset_rows(out)) > len(reference)  # what the stray costs a reader of the folder

    opened = open_job(resolve(load_toml(str(job))).config)
    assert opened.state == "done" and opened.strays == [stray.name]
    assert main(["submit", str(job)]) == 0
    assert not stray.exists() and part_files(out) == marker_parts(out)
    assert _dataset_rows(out) == reference
    assert remove_strays(open_job(resolve(load_toml(str(job))).config)) == []  # nothing left to find


def test_status_of_an_unreadable_success_is_damaged(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `_SUCCESS` cut short (a kill while it was written) is damage to name, not a run that was
    interrupted while its last run line says done."""
    job, out = standard_job(tmp_path, model_dir, str(shards))
    assert main(["submit", str(job)]) == 0
    success = out / "_SUCCESS"
    success.write_bytes(success.read_bytes()[:40])
    capsys.readouterr()
    assert main(["status", "--json", str(out)]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["state"] == "damaged"
    assert "_SUCCESS unreadable: delete it and run the job again" in found["problems"]
