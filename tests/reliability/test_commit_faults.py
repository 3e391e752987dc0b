"""The commit protocol under attack, end to end through the CLI: damage at each point of the
protocol, a start-over racing a running job, a lost `_job.json`, input changed under a job, runs
killed or failed. Each outcome is compared with a fresh uninterrupted run (`reference`), row for
row, or checked by the fingerprint every part carries: nothing lost, duplicated, mixed or changed."""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_kit import cli, cli_env, committed_rows, job_toml, standard_job, start_cli, write_shards

from shardinfer.errors import CorruptOutputError


def _markers(out: Path) -> dict[int, Path]:
    """Split -> its current marker file (the highest marker number)."""
    found: dict[int, Path] = {}
    for path in sorted((out / "_commits").glob("*.json"), key=lambda p: int(p.name.split(".")[2])):
        found[int(path.name[:5])] = path
    return found


def _wait_for_markers(proc: Any, out: Path, target: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while len(_markers(out)) < target and proc.poll() is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"no progress to {target} commits within {timeout} s")
        time.sleep(0.02)


def _success_parts_fingerprints(out: Path) -> set[str]:
    success = json.loads((out / "_SUCCESS").read_text())
    job = json.loads((out / "_job.json").read_text())
    assert success["generation"] == job["generation"]
    return {
        pq.read_metadata(out / f["path"]).metadata[b"shardinfer.fingerprint"].decode()
        for f in success["files"]
    }


def _status(out: Path) -> dict[str, Any]:
    result = cli("status", "--json", str(out))
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def test_damage_before_finalize_and_after_success_is_named_and_repaired(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]], survived: Counter[str]
) -> None:
    job, out = standard_job(tmp_path, model_dir, str(shards))
    crashed = cli("submit", str(job), env=cli_env(SHARDINFER_TEST_CRASH_AT="before_success"))
    assert crashed.returncode == -signal.SIGKILL
    markers = _markers(out)
    assert len(markers) == 6 and not (out / "_SUCCESS").exists()
    part = {i: out / json.loads(p.read_text())["part"] for i, p in markers.items()}
    part[1].unlink()  # deleted
    part[2].write_bytes(part[2].read_bytes()[:300])  # truncated
    part[3].write_bytes(part[4].read_bytes())  # replaced by another valid part file
    named = json.loads(markers[5].read_text())
    named["part"] = "part-00005-never-written.parquet"  # a marker naming a part that is not there
    markers[5].write_text(json.dumps(named))
    rerun = cli("submit", str(job))
    assert rerun.returncode == 0, rerun.stderr
    why = {
        int(line.split("split ", 1)[1].split(" ", 1)[0]): line
        for line in rerun.stderr.splitlines()
        if "was damaged and has been recomputed" in line
    }
    assert sorted(why) == [1, 2, 3, 5]
    assert "its part file is missing" in why[1] and "its part file is missing" in why[5]
    assert "(truncated or replaced)" in why[2]
    assert "(truncated or replaced)" in why[3] or "sha256 differs" in why[3]
    assert committed_rows(str(out)) == reference
    success = json.loads((out / "_SUCCESS").read_text())
    assert sorted(success["summary"]["repaired"]) == ["1", "2", "3", "5"]
    assert sorted(i for i, p in _markers(out).items() if p.name.endswith(".1.json")) == [1, 2, 3, 5]
    report = _status(out)
    assert report["state"] == "done" and sorted(report["last_run"]["repaired"]) == ["1", "2", "3", "5"]
    survived["damaged parts repaired"] += 4

    # After _SUCCESS: a marker deleted. Status and the reader say so; a rerun recomputes the split.
    _markers(out)[4].unlink()
    report = _status(out)
    assert report["state"] == "damaged"
    assert "split 4 is listed in _SUCCESS but its commit marker is missing" in report["problems"]
    with pytest.raises(CorruptOutputError, match="split 4 is listed in _SUCCESS"):
        committed_rows(str(out))
    again = cli("submit", str(job))
    assert again.returncode == 0, again.stderr
    assert "_SUCCESS does not match the commit markers" in again.stderr
    assert committed_rows(str(out)) == reference
    assert _status(out)["state"] == "done"
    survived["damaged outputs repaired"] += 1


def test_start_over_while_another_job_runs_never_mixes_their_rows(
    tmp_path: Path, model_dir: Path, shards: Path, survived: Counter[str]
) -> None:
    out = tmp_path / "out"
    # Job A has far more work than B's planning takes, so it is still running when B starts over.
    long_input = write_shards(tmp_path / "long", files=1, rows=400, row_group=1)
    job_a = tmp_path / "a.toml"
    job_a.write_text(
        job_toml(
            model_dir,
            str(long_input),
            str(out),
            job={"split_rows": 1, "max_inflight_requests": 1},
            sampling={"max_tokens": 12},
        )
    )
    job_b = tmp_path / "b.toml"
    job_b.write_text(
        job_toml(model_dir, str(shards), str(out), job={"start_over": True}, sampling={"temperature": 0.3})
    )
    running = start_cli("submit", str(job_a))
    _wait_for_markers(running, out, 1)
    assert running.poll() is None, "job A finished before job B could start over"
    b = cli("submit", str(job_b))
    _, a_err = running.communicate(timeout=180)
    assert b.returncode == 0, b.stderr
    assert running.returncode == 78, a_err
    assert "started over" in a_err
    fingerprints = _success_parts_fingerprints(out)
    b_hash = json.loads((out / "_job.json").read_text())["fingerprint"]["hash"]
    assert fingerprints == {b_hash}
    rows = committed_rows(str(out))
    assert len({(r["row_id"], r["sample_index"]) for r in rows}) == len(rows) == 24
    survived["start-over races survived"] += 1


def test_lost_job_file_is_damage_not_a_new_job(
    tmp_path: Path, model_dir: Path, shards: Path, survived: Counter[str]
) -> None:
    job, out = standard_job(tmp_path, model_dir, str(shards))
    crashed = cli(
        "submit",
        str(job),
        env=cli_env(SHARDINFER_TEST_CRASH_AT="after_commit", SHARDINFER_TEST_CRASH_SPLIT="2"),
    )
    assert crashed.returncode == -signal.SIGKILL
    (out / "_job.json").unlink()
    hotter = cli("submit", "--conf", "sampling.temperature=0.3", str(job))
    assert hotter.returncode == 78, hotter.stderr
    assert "no _job.json" in hotter.stderr and "job.start_over=true" in hotter.stderr
    fresh = cli("submit", "--conf", "sampling.temperature=0.3", "--conf", "job.start_over=true", str(job))
    assert fresh.returncode == 0, fresh.stderr
    new_hash = json.loads((out / "_job.json").read_text())["fingerprint"]["hash"]
    assert _success_parts_fingerprints(out) == {new_hash}
    assert len(committed_rows(str(out))) == 24
    survived["kills survived"] += 1
    survived["faults survived"] += 1


def test_input_rewritten_between_crash_and_resume_is_refused(
    tmp_path: Path, model_dir: Path, shards: Path, survived: Counter[str]
) -> None:
    inp = tmp_path / "in"
    shutil.copytree(shards, inp)
    job, _ = standard_job(tmp_path, model_dir, str(inp))
    crashed = cli(
        "submit",
        str(job),
        env=cli_env(SHARDINFER_TEST_CRASH_AT="after_commit", SHARDINFER_TEST_CRASH_SPLIT="1"),
    )
    assert crashed.returncode == -signal.SIGKILL
    table = pq.read_table(inp / "prompts-02.parquet")
    prompts = [p + " again" for p in table.column("prompt").to_pylist()]
    pq.write_table(
        table.set_column(1, "prompt", pa.array(prompts)), inp / "prompts-02.parquet", row_group_size=4
    )
    resumed = cli("submit", str(job))
    assert resumed.returncode == 78, resumed.stderr
    assert f"changed: {inp / 'prompts-02.parquet'}" in resumed.stderr
    survived["kills survived"] += 1


def test_incremental_adds_new_files_beside_the_committed_splits(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]], survived: Counter[str]
) -> None:
    inp = tmp_path / "in"
    shutil.copytree(shards, inp)
    job, out = standard_job(tmp_path, model_dir, str(inp))
    assert cli("submit", str(job)).returncode == 0
    before = {p.name: p.read_bytes() for p in out.glob("part-*.parquet")}
    extra = write_shards(tmp_path / "extra", files=4, rows=8)
    shutil.copy(extra / "prompts-03.parquet", inp / "prompts-03.parquet")
    stale = cli("submit", str(job))
    assert stale.returncode == 78 and f"added: {inp / 'prompts-03.parquet'}" in stale.stderr
    grown = cli("submit", "--conf", "job.incremental=true", str(job))
    assert grown.returncode == 0, grown.stderr
    # The old parts are untouched; the new file's rows equal a fresh run over that file alone.
    assert all((out / name).read_bytes() == data for name, data in before.items())
    alone_dir = tmp_path / "alone"
    alone_dir.mkdir()
    shutil.copy(extra / "prompts-03.parquet", alone_dir / "prompts-03.parquet")
    (tmp_path / "alone-job").mkdir()
    alone_job, alone_out = standard_job(tmp_path / "alone-job", model_dir, str(alone_dir))
    assert cli("submit", str(alone_job)).returncode == 0
    expected = sorted(
        reference + committed_rows(str(alone_out)), key=lambda r: (r["row_id"], r["sample_index"])
    )
    assert committed_rows(str(out)) == expected
    assert json.loads((out / "_SUCCESS").read_text())["totals"]["splits"] == 8
    survived["input changes handled"] += 2


def test_status_and_history_tell_failed_interrupted_and_done(
    tmp_path: Path, model_dir: Path, survived: Counter[str]
) -> None:
    (tmp_path / "bad").mkdir()
    rows = [{"id": f"b{i:02d}", "prompt": None if i == 0 else f"hello {i}", "topic": "x"} for i in range(16)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad" / "p.parquet", row_group_size=1)
    job, out = standard_job(
        tmp_path, model_dir, str(tmp_path / "bad"), job={"split_rows": 1, "max_inflight_requests": 1}
    )
    # A run killed with SIGKILL cannot record its end: its process is gone, so it is interrupted.
    running = start_cli("submit", "--run-id", "first", str(job))
    _wait_for_markers(running, out, 1)
    assert running.poll() is None, "the run ended before it could be killed"
    running.send_signal(signal.SIGKILL)
    running.wait()
    assert _status(out)["state"] == "interrupted"
    failed = cli("submit", "--run-id", "second", "--conf", "job.max_error_fraction=0.0", str(job))
    assert failed.returncode == 65, failed.stderr
    report = _status(out)
    assert report["state"] == "failed" and report["last_run"]["exit_code"] == 65
    assert "max_error_fraction" in report["last_run"]["reason"]
    done = cli("submit", "--run-id", "third", str(job))
    assert done.returncode == 0, done.stderr
    assert _status(out)["state"] == "done"
    history = cli("history", "--json", str(out))
    runs = [json.loads(line) for line in history.stdout.splitlines()]
    assert [(r["run_id"], r["state"], r.get("exit_code")) for r in runs] == [
        ("first", "running", None),  # as recorded: the kill left no end
        ("second", "failed", 65),
        ("third", "done", 0),
    ]
    survived["kills survived"] += 1
