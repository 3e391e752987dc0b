"""`shardinfer eval` on the bundled demo model and its bundled tasks: results and every sample,
committed like a job's parts; a rerun of the same command finds the output complete."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO_MODEL = ROOT / "examples" / "models" / "tiny-dsv3-demo"
DEMO_TASKS = ROOT / "examples" / "evals" / "tiny-dsv3-demo"


def test_eval_dumps_results_and_samples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from shardinfer import LLM, SamplingParams
    from shardinfer.jobs.cli import main
    from shardinfer.writers.output_store import OutputStore

    out = tmp_path / "eval"
    argv = ["eval", "--model", str(DEMO_MODEL), "--include-path", str(DEMO_TASKS), "--tasks",
            "demo_tasks_mc,demo_tasks_gen", "--limit", "4", "--device", "cpu", "--dtype", "float32",
            "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["results"]) == {"demo_tasks_mc", "demo_tasks_gen"}
    rows = OutputStore(str(out)).read_committed_table().to_pylist()
    assert sorted((r["task"], r["doc_id"]) for r in rows) == sorted(
        (t, i) for t in ("demo_tasks_mc", "demo_tasks_gen") for i in range(4)
    )
    docs = [json.loads(x) for x in (DEMO_TASKS / "tasks_gen.jsonl").read_text().splitlines()[:4]]
    llm = LLM(str(DEMO_MODEL), device="cpu", dtype="float32")
    greedy = llm.chat([[{"role": "user", "content": d["prompt"]}] for d in docs],
                      SamplingParams(temperature=0.0, max_tokens=48))  # fmt: skip
    gen = sorted((r for r in rows if r["task"] == "demo_tasks_gen"), key=lambda r: r["doc_id"])
    for row, doc, want in zip(gen, docs, greedy, strict=True):
        assert row["responses"] == [want.outputs[0].text.split("\n")[0]]
        assert row["target"] == doc["answer"]
        assert dict(row["metrics"])["exact_match"] == float(row["filtered_answer"] == doc["answer"])
    accuracy = sum(dict(r["metrics"])["exact_match"] for r in gen) / 4
    assert results["results"]["demo_tasks_gen"]["exact_match,first-line"] == accuracy
    for row in (r for r in rows if r["task"] == "demo_tasks_mc"):
        assert len(row["loglikelihoods"]) == len(row["choices"]) == 4
        best = row["choices"][row["loglikelihoods"].index(max(row["loglikelihoods"]))]
        assert row["filtered_answer"] == best
        assert dict(row["metrics"])["acc"] == float(best == row["choices"][int(row["target"])])
    success = json.loads((out / "_SUCCESS").read_text())
    assert success["totals"]["rows"] == 8
    from shardinfer.engine.release import NUMERICS_REVISION, VERSION

    store = OutputStore(str(out))
    for marker in store.committed().values():  # each task's part names the arithmetic that scored it
        footer = store.read_part_metadata(marker["part"])
        assert footer[b"shardinfer.numerics_revision"] == str(NUMERICS_REVISION).encode()
        assert footer[b"shardinfer.version"] == VERSION.encode()
    capsys.readouterr()
    assert main(argv) == 0
    assert "already complete" in capsys.readouterr().err
    assert json.loads((out / "_SUCCESS").read_text()) == success
    # results.json deleted or truncated since: written again from the committed tasks, as it was.
    written = (out / "results.json").read_text()
    for damage, why in [
        (lambda p: p.unlink(), "is missing"),
        (lambda p: p.write_text(written[:20]), "cannot be read ("),
    ]:
        damage(out / "results.json")
        assert main(argv) == 0
        assert f"results.json {why}" in capsys.readouterr().err
        assert (out / "results.json").read_text() == written


def test_the_fingerprint_covers_task_files_device_and_numerics(tmp_path: Path) -> None:
    import shutil

    from shardinfer.jobs.eval_command import EvalSettings, fingerprint

    tasks = tmp_path / "tasks"
    shutil.copytree(DEMO_TASKS, tasks)
    base = EvalSettings(str(DEMO_MODEL), ["demo_tasks_mc"], str(tmp_path / "out"), include_path=str(tasks))
    first = fingerprint(base)["hash"]
    assert fingerprint(base)["hash"] == first  # the same files and settings: the same eval
    data = next(tasks.glob("*.jsonl"))
    data.write_text("\n".join(data.read_text().splitlines()[:3]) + "\n")  # a shorter dataset
    shorter = fingerprint(base)["hash"]
    assert shorter != first
    others = [
        EvalSettings(**{**base.__dict__, "engine": {"max_model_len": 64}}),
        EvalSettings(**{**base.__dict__, "device": "cuda"}),
    ]
    assert len({shorter, *(fingerprint(s)["hash"] for s in others)}) == 3
    same = EvalSettings(**{**base.__dict__, "engine": {"max_num_seqs": 4}})  # scheduling, not numerics
    assert fingerprint(same)["hash"] == shorter


@pytest.mark.parametrize("limit", ["0", "-1", "2.5", "nan", "inf", "1e30"])
def test_a_limit_that_is_no_count_or_fraction_is_a_usage_error(
    tmp_path: Path, limit: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardinfer.jobs.cli import main

    argv = ["eval", "--model", str(DEMO_MODEL), "--tasks", "demo_tasks_mc", "--limit", limit,
            "--output", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 64
    assert f"--limit {float(limit):g}: give a whole number of documents per task" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_a_negative_num_fewshot_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from shardinfer.jobs.cli import main

    argv = ["eval", "--model", str(DEMO_MODEL), "--tasks", "demo_tasks_mc", "--num-fewshot", "-1",
            "--output", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 64
    assert "--num-fewshot -1: give the number of few-shot examples, 0 or more" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_sigterm_during_an_eval_exits_75_and_leaves_it_unfinished(tmp_path: Path) -> None:
    import os
    import select
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "eval"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shardinfer",
            "eval",
            "--model",
            str(DEMO_MODEL),
            "--include-path",
            str(DEMO_TASKS),
            "--tasks",
            "demo_tasks_mc,demo_tasks_gen",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.stderr is not None
    seen, deadline = b"", time.monotonic() + 120
    while b"shardinfer " not in seen:  # the engine's progress bar: the harness is evaluating
        assert proc.poll() is None and time.monotonic() < deadline, seen.decode(errors="replace")[-2000:]
        if select.select([proc.stderr], [], [], 0.05)[0]:
            seen += os.read(proc.stderr.fileno(), 65536)
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=60)[1]
    assert proc.returncode == 75, (seen + rest).decode(errors="replace")[-2000:]
    assert b"interrupted (SIGTERM)" in rest
    assert not (out / "_SUCCESS").exists()


def test_metric_lines_show_each_task_and_filter_with_its_error() -> None:
    from shardinfer.jobs.eval_command import metric_lines

    lines = metric_lines(
        {
            "mc": {
                "alias": "mc",
                "acc,none": 0.72,
                "acc_stderr,none": 0.0641,
                "acc_norm,none": 0.7,
                "sample_len": 50,
            },
            "gen": {"exact_match,first-line": 0.8, "exact_match_stderr,first-line": "N/A"},
        }
    )
    assert lines == ["gen: exact_match (first-line) 0.8000", "mc: acc 0.7200 ± 0.0641, acc_norm 0.7000"]


def test_an_unknown_task_or_task_folder_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from shardinfer.jobs.cli import main

    base = ["eval", "--model", str(DEMO_MODEL), "--output", str(tmp_path / "out")]
    assert main([*base, "--include-path", str(DEMO_TASKS), "--tasks", "demo_tasks_mcc"]) == 78
    assert "'demo_tasks_mcc': did you mean 'demo_tasks_mc'?" in capsys.readouterr().err
    assert main([*base, "--include-path", str(tmp_path / "nope"), "--tasks", "demo_tasks_mc"]) == 78
    assert "nope' is not a folder: give the folder of the tasks' YAML files" in capsys.readouterr().err


def test_a_dataset_that_cannot_be_downloaded_exits_66_with_the_offline_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import lm_eval

    from shardinfer.jobs.cli import main

    def offline(**kwargs: object) -> None:
        try:
            raise OSError("Max retries exceeded with url: /datasets/allenai/ai2_arc")
        except OSError as exc:  # as the datasets library wraps it
            raise type("HubConnectionError", (Exception,), {})("Couldn't reach 'allenai/ai2_arc'") from exc

    monkeypatch.setattr(lm_eval, "simple_evaluate", offline)
    argv = ["eval", "--model", str(DEMO_MODEL), "--include-path", str(DEMO_TASKS), "--tasks", "demo_tasks_mc",
            "--device", "cpu", "--output", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 66
    err = capsys.readouterr().err
    assert "a task's dataset could not be downloaded (HubConnectionError: Couldn't reach" in err
    assert "give the task a local dataset" in err


def test_each_requested_task_is_one_split_in_the_order_given(tmp_path: Path) -> None:
    from shardinfer.jobs.cli import build_parser
    from shardinfer.jobs.eval_command import settings_from_args, task_plan

    argv = ["eval", "--model", str(DEMO_MODEL), "--tasks", "demo_tasks_mc, demo_tasks_gen,demo_tasks_mc",
            "--output", str(tmp_path / "out")]  # fmt: skip
    settings = settings_from_args(build_parser().parse_args(argv))
    assert settings.tasks == ["demo_tasks_mc", "demo_tasks_gen"]  # named twice, run once
    assert [(s.index, s.path, s.num_rows) for s in task_plan(settings.tasks)] == [
        (0, "demo_tasks_mc", 0),
        (1, "demo_tasks_gen", 0),
    ]


def test_an_output_that_holds_no_eval_is_refused_and_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardinfer.jobs.cli import main

    def evaluate(out: Path) -> int:
        return main(["eval", "--model", str(DEMO_MODEL), "--include-path", str(DEMO_TASKS), "--tasks",
                     "demo_tasks_mc", "--limit", "2", "--device", "cpu", "--dtype", "float32",
                     "--output", str(out)])  # fmt: skip

    def files(folder: Path) -> dict[str, bytes]:
        return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}

    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for out in (a_file, a_file / "eval"):
        assert evaluate(out) == 78
        assert "is a file (or in a folder that is a file)" in capsys.readouterr().err
    assert a_file.read_text() == "mine"

    # Part files without a _job.json: another program's, or damaged. The eval's finish would delete them.
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "part-00000-0-0-0.parquet").write_bytes(b"somebody's rows")
    assert evaluate(stray) == 78
    assert "holds commit markers or part files but no _job.json" in capsys.readouterr().err
    assert files(stray) == {"part-00000-0-0-0.parquet": b"somebody's rows"}

    # A generation job's output.
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "What is 2 + 2?"}\n')
    job_out = tmp_path / "job"
    assert main(["generate", "--model", str(DEMO_MODEL), "--input", str(prompts), "--output", str(job_out),
                 "--conf", "model.device=cpu", "--conf", "sampling.max_tokens=2"]) == 0  # fmt: skip
    before = files(job_out)
    capsys.readouterr()
    assert evaluate(job_out) == 78
    assert "holds the output of a shardinfer generate job, not of an eval" in capsys.readouterr().err
    assert files(job_out) == before


def test_an_eval_that_fails_before_its_first_commit_leaves_nothing_in_the_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from shardinfer.jobs.cli import main

    tasks = tmp_path / "tasks"
    shutil.copytree(DEMO_TASKS, tasks)
    yaml = (tasks / "demo_tasks_mc.yaml").read_text()
    (tasks / "demo_later.yaml").write_text(
        yaml.replace("task: demo_tasks_mc", "task: demo_later").replace("tasks_mc.jsonl", "later.jsonl")
    )
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(DEMO_MODEL), "--include-path", str(tasks), "--tasks", "demo_later",
            "--limit", "2", "--device", "cpu", "--dtype", "float32", "--output", str(out)]  # fmt: skip

    # An engine setting the model cannot run with is a config error naming the setting.
    assert main([*argv, "--conf", "engine.max_model_len=99999"]) == 78
    assert "max_model_len=99999" in capsys.readouterr().err
    assert not out.exists()
    # A task whose local data file is missing: the input is missing, and the task is named.
    assert main(argv) == 66
    err = capsys.readouterr().err
    assert "task demo_later:" in err and "later.jsonl" in err
    assert not out.exists()
    shutil.copy(tasks / "tasks_mc.jsonl", tasks / "later.jsonl")
    # A window too short for the task's answers is a config error too, named with its fix.
    assert main([*argv, "--conf", "engine.max_model_len=2"]) == 78
    assert "raise max_model_len (shardinfer eval: --conf engine.max_model_len=N)" in capsys.readouterr().err
    assert not out.exists()
    # The corrected command runs in the same place, as it would in a new one.
    assert main(argv) == 0
    assert json.loads((out / "results.json").read_text())["results"]["demo_later"]["sample_len"] == 2


def _plan_earlier_eval(argv: list[str], **changed: Any) -> str:
    """Plan the eval of `argv` at its --output as an earlier shardinfer did: its fingerprint's
    eval part with `changed` values (None: a key it did not hold yet). Returns that fingerprint's hash."""
    import hashlib

    from shardinfer.jobs.cli import build_parser
    from shardinfer.jobs.eval_command import fingerprint, settings_from_args, task_plan
    from shardinfer.writers.job_file import make_job_record
    from shardinfer.writers.output_store import OutputStore

    settings = settings_from_args(build_parser().parse_args(argv))
    earlier = fingerprint(settings)
    del earlier["hash"]
    for key, value in changed.items():
        if value is None:
            del earlier["eval"][key]
        else:
            earlier["eval"][key] = value
    earlier["hash"] = hashlib.sha256(json.dumps(earlier, sort_keys=True, default=str).encode()).hexdigest()
    job = make_job_record("eval", earlier, task_plan(settings.tasks), {"eval_tasks": settings.tasks})
    OutputStore(settings.output).write_job(job)
    return str(earlier["hash"])


def test_an_eval_planned_before_spans_held_an_unfed_token_keeps_its_windows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Rolling windows were max_model_len - 2 positions before a span's last token went unfed; an
    # eval planned then resumes with them, so no eval mixes two window lengths. A new one takes
    # max_model_len, as the harness's hf model does.
    from shardinfer.jobs import eval_command
    from shardinfer.jobs.cli import main

    built: list[tuple[int, int]] = []
    real = eval_command._language_model

    def recording(*args: Any, **kwargs: Any) -> Any:
        lm = real(*args, **kwargs)
        built.append((lm.max_length, lm.engine.max_model_len))
        return lm

    monkeypatch.setattr(eval_command, "_language_model", recording)

    def argv(out: str) -> list[str]:
        return ["eval", "--model", str(DEMO_MODEL), "--include-path", str(DEMO_TASKS), "--tasks", "demo_tasks_mc",
                "--limit", "2", "--device", "cpu", "--dtype", "float32", "--output", str(tmp_path / out)]  # fmt: skip

    earlier = _plan_earlier_eval(argv("earlier"), span_rule=None)
    # Another setting is refused naming that setting alone, not the rule the older version did not record.
    assert main([*argv("earlier"), "--seed", "7"]) == 78
    refusal = capsys.readouterr().err
    assert "eval.seed: 1234 -> 7" in refusal and "span_rule" not in refusal
    assert main(argv("earlier")) == 0
    assert json.loads((tmp_path / "earlier" / "_SUCCESS").read_text())["fingerprint"]["hash"] == earlier
    assert main(argv("new")) == 0
    (old_length, model_len), (new_length, same_len) = built
    assert model_len == same_len and old_length == model_len - 2 and new_length == model_len


def test_the_task_folder_counts_by_its_files_not_by_how_its_path_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from shardinfer.jobs.cli import main

    shutil.copytree(DEMO_TASKS, tmp_path / "tasks")
    monkeypatch.chdir(tmp_path)

    def argv(tasks: str, out: str) -> list[str]:
        return ["eval", "--model", str(DEMO_MODEL), "--include-path", tasks, "--tasks", "demo_tasks_mc",
                "--limit", "2", "--device", "cpu", "--dtype", "float32", "--output", out]  # fmt: skip

    assert main(argv("tasks", "out")) == 0
    capsys.readouterr()
    # The same eval, its folder named by an absolute path (with a trailing slash), from another directory.
    monkeypatch.chdir(tmp_path / "tasks")
    assert main(argv(f"{tmp_path / 'tasks'}/", str(tmp_path / "out"))) == 0
    assert "already complete" in capsys.readouterr().err

    # An output planned by an earlier shardinfer, whose fingerprint held the path as written, resumes.
    monkeypatch.chdir(tmp_path)
    earlier = _plan_earlier_eval(argv("tasks", "earlier"), include_path="tasks")
    assert main(argv("tasks", "earlier")) == 0
    assert json.loads((tmp_path / "earlier" / "_SUCCESS").read_text())["fingerprint"]["hash"] == earlier


def _outside_data_task(tmp_path: Path) -> tuple[Path, Path]:
    """A task folder whose task reads a JSON lines file kept in another folder: (tasks, data file)."""
    tasks, data = tmp_path / "tasks", tmp_path / "data" / "mc.jsonl"
    tasks.mkdir()
    data.parent.mkdir()
    docs = [{"q": "import ", "choices": ["os", "sys"], "label": 1},
            {"q": "def f():\n    return", "choices": [" None", " 1"], "label": 0}]  # fmt: skip
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tasks / "ext_mc.yaml").write_text(
        "task: ext_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\noutput_type: multiple_choice\ntest_split: test\n"
        'doc_to_text: "{{q}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\n'
        "metric_list:\n  - metric: acc\nmetadata:\n  version: 1.0\n"
    )
    return tasks, data


def test_a_task_data_file_outside_the_task_folder_counts_in_the_fingerprint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardinfer.jobs.cli import main
    from shardinfer.jobs.eval_command import EvalSettings, fingerprint

    tasks, data = _outside_data_task(tmp_path)
    argv = ["eval", "--model", str(DEMO_MODEL), "--include-path", str(tasks), "--tasks", "ext_mc",
            "--device", "cpu", "--output", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 0
    assert "already complete" in capsys.readouterr().err
    # Another document in the data: the committed results are of other data, and are kept, not passed off.
    data.write_text(data.read_text() + json.dumps({"q": "x = ", "choices": ["1", "2"], "label": 0}) + "\n")
    assert main(argv) == 78
    err = capsys.readouterr().err
    assert f"changed: eval.data_files.{data.resolve()}" in err
    assert (
        json.loads((tmp_path / "out" / "results.json").read_text())["n-samples"]["ext_mc"]["effective"] == 2
    )
    # Data files under the task folder count with its files: those evals keep their fingerprint.
    inside = EvalSettings(
        str(DEMO_MODEL), ["demo_tasks_mc"], str(tmp_path / "o"), include_path=str(DEMO_TASKS)
    )
    assert "data_files" not in fingerprint(inside)["eval"]


def test_the_dtype_counts_as_resolved_and_evals_planned_with_auto_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    from shardinfer.jobs.cli import main

    def argv(dtype: str, out: str) -> list[str]:
        return ["eval", "--model", str(DEMO_MODEL), "--include-path", str(DEMO_TASKS), "--tasks", "demo_tasks_mc",
                "--limit", "2", "--device", "cpu", "--dtype", dtype, "--output", str(tmp_path / out)]  # fmt: skip

    assert main(argv("auto", "out")) == 0
    capsys.readouterr()
    for same in ("float32", "fp32"):  # what auto resolves to on a CPU: the same eval
        assert main(argv(same, "out")) == 0
        assert "already complete" in capsys.readouterr().err
    assert main(argv("bfloat16", "out")) == 78
    assert 'eval.dtype: "float32" -> "bfloat16"' in capsys.readouterr().err

    # An eval planned by an earlier shardinfer, whose fingerprint held --dtype as given, resumes
    # under that fingerprint, given as it was or as what it resolves to.
    earlier = _plan_earlier_eval(argv("auto", "earlier"), dtype="auto")
    assert main(argv("auto", "earlier")) == 0
    assert json.loads((tmp_path / "earlier" / "_SUCCESS").read_text())["fingerprint"]["hash"] == earlier
    capsys.readouterr()
    assert main(argv("float32", "earlier")) == 0
    assert "already complete" in capsys.readouterr().err


def test_results_record_the_model_as_model_args_without_credentials(tmp_path: Path) -> None:
    from shardinfer.jobs.cli import main
    from shardinfer.jobs.eval_command import EvalSettings, model_args

    out = tmp_path / "out"
    assert main(["eval", "--model", str(DEMO_MODEL), "--include-path", str(DEMO_TASKS), "--tasks", "demo_tasks_mc",
                 "--limit", "2", "--device", "cpu", "--output", str(out)]) == 0  # fmt: skip
    config = json.loads((out / "results.json").read_text())["config"]
    assert config["model_args"] == f"pretrained={DEMO_MODEL},dtype=float32,device=cpu"
    remote = EvalSettings("s3://key:secret@bucket/model", ["t"], str(out), device="cpu", dtype="bf16")
    assert model_args(remote) == "pretrained=s3://***@bucket/model,dtype=bfloat16,device=cpu"
