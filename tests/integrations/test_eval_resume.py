"""`shardinfer eval` commits each requested task as soon as it has run: an eval stopped part-way
keeps the tasks it finished, the rerun runs only the others, and the results.json it merges from
the tasks' runs is what one harness run over all the tasks returns."""

from __future__ import annotations

import collections
import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness_kit import TASKS_DIR

# A group first, so that the interrupted run has committed a part holding two tasks' samples.
TASKS = ["si_group", "si_ppl", "si_gen"]
# The keys of results.json that do not depend on when and where the eval ran.
DETERMINISTIC_KEYS = ("results", "groups", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better",
                      "n-samples")  # fmt: skip


class HarnessCalls:
    """lm_eval.simple_evaluate, recording the tasks and model of each call; a call asked to run
    `stop_at` stops the eval as SIGTERM does (Interrupted, exit 75) instead of running it."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.stop_at: str | None = None
        self.tasks: list[list[str]] = []
        self.models: list[Any] = []
        self.kwargs: dict[str, Any] = {}

    def __call__(self, **kwargs: Any) -> Any:
        from shardinfer.errors import Interrupted

        self.tasks.append(list(kwargs["tasks"]))
        self.models.append(kwargs["model"])
        self.kwargs = kwargs
        if self.stop_at in kwargs["tasks"]:
            raise Interrupted(f"stopped before {self.stop_at} for the test")
        return self.real(**kwargs)

    def take(self) -> tuple[list[list[str]], list[Any]]:
        """The calls since the last take."""
        taken = self.tasks, self.models
        self.tasks, self.models = [], []
        return taken


@dataclass
class Run:
    code: int
    err: str
    calls: list[list[str]]
    models: list[Any]
    committed: dict[int, dict[str, Any]]
    samples: dict[str, int]  # task -> committed rows, when the run ended
    written: set[str]  # which of results.json and _SUCCESS exist then


@dataclass
class Evals:
    interrupted: Run
    refused: Run
    resumed: Run
    complete: Run
    fresh: Run
    resumed_out: Path
    fresh_out: Path
    reference: dict[str, Any]


def _run(argv: list[str], harness: HarnessCalls, out: Path) -> Run:
    from shardinfer.jobs.cli import main
    from shardinfer.writers.output_store import OutputStore

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    calls, models = harness.take()
    store = OutputStore(str(out))
    committed = store.committed() if store.read_job() else {}
    samples = collections.Counter(row["task"] for row in _rows(out)) if committed else {}
    written = {name for name in ("results.json", "_SUCCESS") if (out / name).exists()}
    return Run(code, err.getvalue(), calls, models, committed, dict(samples), written)


@pytest.fixture(scope="module")
def evals(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Evals:
    """An eval stopped before its second task, a rerun with other settings, the rerun of the same
    command, one more rerun, a fresh uninterrupted eval, and one harness run over all the tasks."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from shardinfer.integrations.lm_eval import ShardinferLM

    model = tiny_models["dense"]
    base = tmp_path_factory.mktemp("eval-resume")
    resumed_out, fresh_out = base / "resumed", base / "fresh"

    def argv(out: Path) -> list[str]:
        return ["eval", "--model", str(model), "--include-path", str(TASKS_DIR), "--tasks", ",".join(TASKS),
                "--device", "cpu", "--dtype", "float32", "--output", str(out)]  # fmt: skip

    with pytest.MonkeyPatch.context() as patch:
        harness = HarnessCalls(lm_eval.simple_evaluate)
        patch.setattr(lm_eval, "simple_evaluate", harness)
        harness.stop_at = "si_ppl"
        interrupted = _run(argv(resumed_out), harness, resumed_out)
        harness.stop_at = None
        refused = _run([*argv(resumed_out), "--limit", "2"], harness, resumed_out)
        resumed = _run(argv(resumed_out), harness, resumed_out)
        complete = _run(argv(resumed_out), harness, resumed_out)
        fresh = _run(argv(fresh_out), harness, fresh_out)
        # The reference: the harness once over every task, given what the eval gives it for one.
        lm = ShardinferLM(str(model), device="cpu", dtype="float32")
        manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
        kwargs = {**harness.kwargs, "model": lm, "tasks": TASKS, "task_manager": manager}
        reference = dict(harness.real(**kwargs))
    return Evals(interrupted, refused, resumed, complete, fresh, resumed_out, fresh_out, reference)


def _rows(out: Path) -> list[dict[str, Any]]:
    from shardinfer.writers.output_store import OutputStore

    return sorted(OutputStore(str(out)).read_committed_table().to_pylist(), key=lambda r: r["row_id"])


def _results(out: Path) -> dict[str, Any]:
    results = json.loads((out / "results.json").read_text())
    return {key: results[key] for key in DETERMINISTIC_KEYS if key in results}


def test_an_interrupted_eval_keeps_the_tasks_it_finished(evals: Evals) -> None:
    first = evals.interrupted
    assert first.code == 75
    assert first.calls == [["si_group"], ["si_ppl"]]
    assert list(first.committed) == [0]
    assert first.samples == {"si_mc": 6, "si_mc_qa": 6}  # the group: its two tasks' samples in one part
    assert "committed si_group: 12 samples" in first.err
    assert first.written == set()  # results.json waits for every task
    # Other settings over the kept task are refused before anything runs.
    assert (evals.refused.code, evals.refused.calls) == (78, [])
    assert "holds an eval of other settings (changed: eval.limit" in evals.refused.err


def test_the_rerun_runs_only_the_missing_tasks_and_ends_as_a_fresh_eval(evals: Evals) -> None:
    rerun = evals.resumed
    assert rerun.code == 0
    assert "resuming: 1 of 3 tasks already committed; to run: si_ppl, si_gen" in rerun.err
    assert rerun.calls == [["si_ppl"], ["si_gen"]]
    assert rerun.models[0] is rerun.models[1]  # one engine for all the tasks
    assert rerun.committed[0]["part"] == evals.interrupted.committed[0]["part"]
    assert rerun.written == {"results.json", "_SUCCESS"}
    assert (evals.complete.code, evals.complete.calls) == (0, [])
    assert "already complete" in evals.complete.err
    assert evals.fresh.calls == [[task] for task in TASKS]
    assert [m["rows"] for _, m in sorted(rerun.committed.items())] == [
        m["rows"] for _, m in sorted(evals.fresh.committed.items())
    ]
    assert _rows(evals.resumed_out) == _rows(evals.fresh_out)
    assert _results(evals.resumed_out) == _results(evals.fresh_out)
    success = [json.loads((out / "_SUCCESS").read_text()) for out in (evals.resumed_out, evals.fresh_out)]
    assert success[0]["summary"] == success[1]["summary"]
    assert success[0]["totals"]["rows"] == success[1]["totals"]["rows"]


def test_merged_results_equal_one_harness_run_over_all_the_tasks(evals: Evals) -> None:
    from shardinfer.jobs.eval_dump import sample_rows, to_json

    # The eval ran the harness one task at a time, and merged what each run returned.
    assert all(len(tasks) == 1 for tasks in evals.interrupted.calls + evals.resumed.calls)
    reference = dict(evals.reference)
    samples = reference.pop("samples")
    want = json.loads(to_json({key: reference[key] for key in DETERMINISTIC_KEYS if key in reference}))
    assert "acc,none" in want["groups"]["si_group"]  # the group's aggregate is in the comparison
    assert _results(evals.resumed_out) == want
    types = {task: config["output_type"] for task, config in reference["configs"].items()}
    dumped = [row for task in samples for row in sample_rows(task, types[task], samples[task])]
    assert _rows(evals.resumed_out) == sorted(dumped, key=lambda r: r["row_id"])


def test_an_unfinished_eval_of_another_split_plan_is_refused(
    tiny_models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An earlier shardinfer planned a split per subtask, by name, and kept no results in the parts."""
    from shardinfer.jobs.cli import build_parser, main
    from shardinfer.jobs.eval_command import fingerprint, settings_from_args
    from shardinfer.splits import Split
    from shardinfer.writers.job_file import make_job_record
    from shardinfer.writers.output_store import OutputStore

    argv = ["eval", "--model", str(tiny_models["dense"]), "--include-path", str(TASKS_DIR), "--tasks", "si_ppl,si_mc",
            "--device", "cpu", "--dtype", "float32", "--output", str(tmp_path / "out")]  # fmt: skip
    settings = settings_from_args(build_parser().parse_args(argv))
    earlier = [Split(0, 0, "si_mc", 0, 6), Split(1, 1, "si_ppl", 0, 3)]
    OutputStore(settings.output).write_job(make_job_record(settings.run_id, fingerprint(settings), earlier))
    assert main(argv) == 78
    assert ("holds this eval planned as other splits (si_mc, si_ppl; this shardinfer plans one per requested "
            "task: si_ppl, si_mc)") in capsys.readouterr().err  # fmt: skip
