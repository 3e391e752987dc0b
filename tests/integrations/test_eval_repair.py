"""A committed task whose part is deleted or truncated afterwards is run again by the next run of
the same `shardinfer eval` command, as a job repairs a split; and `shardinfer status` on an eval
output says which tasks are committed, with how many samples, and whether the eval is complete."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness_kit import TASKS_DIR
from test_eval_resume import TASKS, HarnessCalls, _results, _rows

# What a fresh eval of TASKS commits: the group's part holds both of its tasks' samples.
SAMPLES = {"si_group": 12, "si_ppl": 3, "si_gen": 4}


@dataclass
class Fresh:
    model: Path
    out: Path

    def argv(self, out: Path) -> list[str]:
        return ["eval", "--model", str(self.model), "--include-path", str(TASKS_DIR), "--tasks", ",".join(TASKS),
                "--device", "cpu", "--dtype", "float32", "--output", str(out)]  # fmt: skip

    def copy(self, to: Path) -> Path:
        """The fresh output copied to `to`: to damage, leaving the reference whole."""
        shutil.copytree(self.out, to)
        return to


@pytest.fixture(scope="module")
def fresh(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Fresh:
    """One uninterrupted eval of TASKS: the reference every repaired output must end equal to."""
    from shardinfer.jobs.cli import main

    found = Fresh(tiny_models["dense"], tmp_path_factory.mktemp("eval-repair") / "fresh")
    assert main(found.argv(found.out)) == 0
    return found


def _markers(out: Path) -> dict[int, dict[str, Any]]:
    from shardinfer.writers.output_store import OutputStore

    return dict(OutputStore(str(out)).committed())


def _damage(out: Path, split: int, how: str) -> str:
    """Delete or truncate the committed part of `split`; returns its name."""
    part = out / _markers(out)[split]["part"]
    if how == "deleted":
        part.unlink()
    else:
        part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    return part.name


def _rerun(fresh: Fresh, out: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[list[str]]]:
    """The same eval command again: its exit code and the tasks of each harness call it made."""
    import lm_eval

    from shardinfer.jobs.cli import main

    harness = HarnessCalls(lm_eval.simple_evaluate)
    monkeypatch.setattr(lm_eval, "simple_evaluate", harness)
    code = main(fresh.argv(out))
    return code, harness.take()[0]


def _unfinish(out: Path, split: int) -> None:
    """Make `out` what an eval stopped before running `split` leaves (its later tasks too)."""
    markers = _markers(out)
    for name in ("_SUCCESS", "results.json"):
        (out / name).unlink()
    for index, marker in markers.items():
        if index >= split:
            (out / marker["part"]).unlink()
            (out / "_commits" / marker["marker_file"]).unlink()


def _status(out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], dict[str, Any]]:
    from shardinfer.jobs.cli import main

    capsys.readouterr()
    assert main(["status", str(out)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert main(["status", "--json", str(out)]) == 0
    return text, json.loads(capsys.readouterr().out)


def _assert_equal_outputs(out: Path, reference: Path) -> None:
    assert _rows(out) == _rows(reference)  # read back verified against `_SUCCESS` and the markers
    assert _results(out) == _results(reference)
    success = [json.loads((o / "_SUCCESS").read_text()) for o in (out, reference)]
    assert success[0]["summary"] == success[1]["summary"]
    assert success[0]["totals"]["rows"] == success[1]["totals"]["rows"]


@pytest.mark.parametrize("how", ["deleted", "truncated"])
def test_a_rerun_runs_again_only_the_task_whose_part_was_damaged(
    fresh: Fresh,
    tmp_path: Path,
    how: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = fresh.copy(tmp_path / "out")
    before = _markers(out)
    part = _damage(out, 1, how)
    capsys.readouterr()
    assert _rerun(fresh, out, monkeypatch) == (0, [["si_ppl"]])
    err = capsys.readouterr().err
    why = "its part file is missing" if how == "deleted" else "its part file has"
    assert f"repairing si_ppl: its committed part was damaged ({part}: {why}" in err
    assert "resuming: 2 of 3 tasks already committed; to run: si_ppl" in err
    after = _markers(out)
    # The job path's repair: the task's next commit goes under its next marker number, and finalize
    # keeps only that marker and its part; the other tasks' commits are untouched.
    assert [after[i]["marker_number"] for i in range(3)] == [0, 1, 0]
    assert after[0] == before[0] and after[2] == before[2]
    assert after[1]["part"] != part
    assert sorted(p.name for p in (out / "_commits").iterdir()) == sorted(
        m["marker_file"] for m in after.values()
    )
    assert sorted(p.name for p in out.glob("part-*")) == sorted(m["part"] for m in after.values())
    _assert_equal_outputs(out, fresh.out)
    # Whole again: the next rerun does nothing.
    assert _rerun(fresh, out, monkeypatch) == (0, [])
    assert "already complete" in capsys.readouterr().err


def test_an_unfinished_eval_whose_committed_part_went_missing_runs_that_task_again(
    fresh: Fresh, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = fresh.copy(tmp_path / "out")
    _unfinish(out, 2)  # stopped before its last task: no results.json, no _SUCCESS
    part = _damage(out, 0, "deleted")
    capsys.readouterr()
    assert _rerun(fresh, out, monkeypatch) == (0, [["si_group"], ["si_gen"]])
    err = capsys.readouterr().err
    assert f"repairing si_group: its committed part was damaged ({part}: its part file is missing)" in err
    assert "resuming: 1 of 3 tasks already committed; to run: si_group, si_gen" in err
    _assert_equal_outputs(out, fresh.out)


def test_a_part_overwritten_with_as_many_bytes_is_named_and_repaired(
    fresh: Fresh, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The listing opens no part, so it passes a part overwritten with as many other bytes (as for a
    job); `status` reads its footer and says which part to delete, and a rerun that goes on to
    finish the eval checks every part's hash and runs that task again."""
    out = fresh.copy(tmp_path / "out")
    part = out / _markers(out)[1]["part"]
    part.write_bytes(b"\0" * part.stat().st_size)
    text, report = _status(out, capsys)
    assert report["state"] == "damaged"
    assert [t["state"] for t in report["tasks"]] == ["committed", "damaged", "committed"]
    assert text[1].startswith(f"  problem    task si_ppl (split 1): {part.name} cannot be read (ArrowInvalid")
    assert text[1].endswith("; delete that part file and run the same eval command again")
    _unfinish(out, 2)
    assert _rerun(fresh, out, monkeypatch) == (0, [["si_ppl"], ["si_gen"]])
    assert f"repairing si_ppl: its committed part was damaged ({part.name}: " in capsys.readouterr().err
    _assert_equal_outputs(out, fresh.out)


def test_status_of_a_complete_eval_lists_its_tasks_samples_and_metrics(
    fresh: Fresh, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardinfer.jobs.eval_command import metric_lines

    text, report = _status(fresh.out, capsys)
    per_task = json.loads((fresh.out / "results.json").read_text())["results"]
    assert text == [
        f"{fresh.out}: done (eval)",
        "  tasks      3/3 committed, 19 samples",
        "  task       si_group: 12 samples",
        "  task       si_ppl: 3 samples",
        "  task       si_gen: 4 samples",
        *(f"  metrics    {line}" for line in metric_lines(per_task)),
        "  results    results.json",
    ]
    assert (report["kind"], report["state"], report["problems"]) == ("eval", "done", [])
    assert (report["tasks_committed"], report["tasks_total"], report["samples_committed"]) == (3, 3, 19)
    assert report["tasks"] == [
        {"task": task, "split": i, "state": "committed", "samples": SAMPLES[task]}
        for i, task in enumerate(TASKS)
    ]
    numeric = {t: {k: v for k, v in r.items() if isinstance(v, int | float)} for t, r in per_task.items()}
    assert report["metrics"] == numeric
    assert report["results_file"] == "results.json"


def test_status_of_a_damaged_unfinished_or_unstarted_eval(
    fresh: Fresh, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = fresh.copy(tmp_path / "damaged")
    part = _damage(damaged, 1, "deleted")
    text, report = _status(damaged, capsys)
    assert text[:6] == [
        f"{damaged}: damaged (eval)",
        f"  problem    task si_ppl (split 1): {part}: its part file is missing",
        "  tasks      3/3 committed (1 damaged), 19 samples",
        "  task       si_group: 12 samples",
        "  task       si_ppl: 3 samples (damaged)",
        "  task       si_gen: 4 samples",
    ]
    assert (
        text[-1]
        == "  results    not final: the same eval command, run again, runs the tasks missing or damaged"
    )
    assert not any(line.startswith("  metrics    si_ppl:") for line in text)  # its part is gone
    assert [t["state"] for t in report["tasks"]] == ["committed", "damaged", "committed"]
    assert (report["state"], report["results_file"]) == ("damaged", None)

    unfinished = fresh.copy(tmp_path / "unfinished")
    _unfinish(unfinished, 2)
    text, report = _status(unfinished, capsys)
    assert text[:5] == [
        f"{unfinished}: incomplete (eval)",
        "  tasks      2/3 committed, 15 samples",
        "  task       si_group: 12 samples",
        "  task       si_ppl: 3 samples",
        "  task       si_gen: not committed",
    ]
    assert report["tasks"][2] == {"task": "si_gen", "split": 2, "state": "not committed", "samples": None}
    assert (report["state"], report["tasks_committed"], report["problems"]) == ("incomplete", 2, [])

    unstarted = fresh.copy(tmp_path / "unstarted")
    _unfinish(unstarted, 0)
    text, report = _status(unstarted, capsys)
    assert text == [
        f"{unstarted}: not started (eval)",
        "  tasks      0/3 committed, 0 samples",
        *(f"  task       {task}: not committed" for task in TASKS),
    ]
    assert (report["state"], report["samples_committed"], report["metrics"]) == ("not started", 0, {})


def test_a_truncated_success_file_is_written_again_without_running_a_task(
    fresh: Fresh, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill while `_SUCCESS` was written leaves part of it: every task is committed, so the rerun
    only finishes the eval again."""
    out = fresh.copy(tmp_path / "out")
    success = out / "_SUCCESS"
    success.write_bytes(success.read_bytes()[: success.stat().st_size // 2])
    assert _rerun(fresh, out, monkeypatch) == (0, [])
    _assert_equal_outputs(out, fresh.out)
