"""CLI end to end through subprocess: exit-code classes, precedence, dry runs, re-submission."""

from __future__ import annotations

import errno
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pipeline_kit import REPO, cli, cli_env, committed_rows, fine_grained_job, job_toml, standard_job

from shardinfer.engine.seeds import derive_seed
from shardinfer.jobs.cli import main


def test_usage_errors_exit_64(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("submit", "--no-such-flag", "x.toml").returncode == 64  # the real process, once
    assert main(["submit", str(tmp_path / "missing.toml")]) == 64
    job = tmp_path / "job.toml"
    job.write_text(job_toml("m", "in", "out"))
    assert main(["submit", "--conf", "temperature0.5", str(job)]) == 64
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main(["submit", "--master", "yarn", str(job)]) == 64
    assert main([]) == 64


def test_unexpected_failure_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shardinfer.jobs.cli as cli_module

    def broken(*args: Any) -> int:
        raise RuntimeError("something nobody planned for")

    monkeypatch.setattr(cli_module, "_submit", broken)
    job = tmp_path / "job.toml"
    job.write_text(job_toml("m", "in", "out"))
    assert main(["submit", str(job)]) == 1
    assert "RuntimeError: something nobody planned for" in capsys.readouterr().err


def test_bad_config_exits_78_naming_nearest_key(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(shards), str(tmp_path / "out"), sampling={"temprature": 0.5}))
    result = cli("submit", str(job))  # the real process, once
    assert result.returncode == 78
    assert "sampling.temprature" in result.stderr and "'temperature'" in result.stderr
    job.write_text(job_toml(model_dir, str(shards), str(tmp_path / "out")))
    assert main(["submit", "--conf", "sampler.top_p=0.5", str(job)]) == 78
    assert "'sampling'" in capsys.readouterr().err
    assert main(["submit", "--conf", "sampling.top_p=1.5", str(job)]) == 78
    assert "top_p" in capsys.readouterr().err
    assert main(["submit", "--conf", f"model.path={tmp_path / 'nope'}", str(job)]) == 78
    assert "model.path" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_missing_input_exits_66(tmp_path: Path, model_dir: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(tmp_path / "no-such-dir" / "*.parquet"), str(tmp_path / "out")))
    result = cli("submit", str(job))
    assert result.returncode == 66, result.stderr
    assert main(["status", str(tmp_path / "out")]) == 66


def test_dry_run_shows_precedence_and_writes_nothing(tmp_path: Path, model_dir: Path, shards: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        job_toml(
            model_dir,
            str(shards),
            str(tmp_path / "out" / "{ds}" / "{run_id}"),
            sampling={"temperature": 0.9, "top_p": 0.9, "top_k": 5},
        )
    )
    props = tmp_path / "defaults.conf"
    props.write_text("# spark-defaults style\nsampling.temperature 0.5\nsampling.top_p=0.7\n")
    result = cli(
        "submit",
        "--dry-run",
        "--properties-file",
        str(props),
        "--conf",
        "sampling.temperature=0.25",
        "--conf",
        "job.ds=2024-05-06",
        "--run-id",
        "scheduled__1",
        str(job),
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "temperature = 0.25  # --conf" in out
    assert "top_p = 0.7  # properties file" in out
    assert "top_k = 5  # job file" in out
    assert f'"{tmp_path / "out" / "2024-05-06" / "scheduled__1"}"' in out
    assert "# plan: 6 split(s)" in out
    assert not (tmp_path / "out").exists()


def test_dry_run_credits_name_and_run_id_to_their_flags(
    tmp_path: Path, model_dir: Path, shards: Path
) -> None:
    # --name was merged as a --conf entry, so the dry run credited its value to --conf.
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(shards), str(tmp_path / "out" / "{run_id}")))
    result = cli("submit", "--dry-run", "--name", "nn", "--run-id", "r1", str(job))
    assert result.returncode == 0, result.stderr
    assert 'name = "nn"  # --name' in result.stdout
    assert 'run_id = "r1"  # --run-id' in result.stdout
    # A --conf job.name of another value is refused, as a --conf job.run_id is (exit 64, both named).
    both = cli("submit", "--dry-run", "--name", "nn", "--conf", "job.name=cc", str(job))
    assert both.returncode == 64, both.stderr
    assert "--name 'nn' and --conf job.name='cc' disagree" in both.stderr and not both.stdout


def test_generate_without_a_job_file(tmp_path: Path, model_dir: Path, shards: Path) -> None:
    out = tmp_path / "out"
    result = cli(
        "generate",
        "--model",
        str(model_dir),
        "--input",
        str(shards / "prompts-00.parquet"),
        "--output",
        str(out),
        "--conf",
        "sampling.max_tokens=3",
        "--conf",
        "sampling.temperature=0",
        "--conf",
        "input.id_column=id",
        "--log-format",
        "json",
    )
    assert result.returncode == 0, result.stderr
    rows = committed_rows(str(out))
    assert [r["row_id"] for r in rows] == [f"f0-{i:03d}" for i in range(8)]
    assert all(r["status"] == "ok" and r["completion_tokens"] == 3 for r in rows)
    # Seeds are the documented derivation, per row: hash(job.seed=0 default, row_id, sample 0).
    assert [r["seed"] for r in rows] == [derive_seed(0, r["row_id"], 0) for r in rows]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["event"] == "summary" and summary["rows_ok"] == 8 and summary["completion_tokens"] == 24
    # Every line, the summary included, is one object with the keys a log pipeline routes by.
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    for line in lines:
        assert {"ts", "level", "run_id", "msg"} <= set(json.loads(line)), line


def test_completed_run_resubmitted_exits_0_without_work(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(shards), str(tmp_path / "out" / "ds={ds}")))
    airflow_id = "scheduled__2024-01-02T00:00:00+00:00"
    first = cli("submit", "--conf", "job.ds=2024-01-02", "--run-id", airflow_id, str(job))
    assert first.returncode == 0, first.stderr
    out = tmp_path / "out" / "ds=2024-01-02"
    assert committed_rows(str(out)) == reference
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    again = cli("submit", "--conf", "job.ds=2024-01-02", "--run-id", airflow_id, str(job))
    assert again.returncode == 0, again.stderr
    assert "already complete" in again.stderr
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    status = cli("status", "--json", str(out))
    report = json.loads(status.stdout)
    assert report["state"] == "done" and report["splits_committed"] == report["splits_total"] == 6
    assert report["rows_ok"] == 24 and report["rows_error"] == 0


def test_fingerprint_drift_refused_with_78(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        job_toml(
            model_dir, str(shards / "prompts-00.parquet"), str(tmp_path / "out"), sampling={"max_tokens": 2}
        )
    )
    assert cli("submit", str(job)).returncode == 0
    drift = cli("submit", "--conf", "sampling.temperature=0.3", str(job))
    assert drift.returncode == 78
    assert "sampling.defaults.temperature: 0.8 -> 0.3" in drift.stderr
    assert main(["submit", "--conf", "model.dtype=bfloat16", str(job)]) == 78
    assert "engine.numerics.dtype" in capsys.readouterr().err
    # Told to start over, the same location is rebuilt under the new fingerprint.
    over = cli("submit", "--conf", "sampling.temperature=0.3", "--conf", "job.start_over=true", str(job))
    assert over.returncode == 0, over.stderr
    success = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert success["fingerprint"]["sampling.defaults"]["temperature"] == 0.3
    # The same command again (a scheduler's retry) finds its own finished job: nothing is discarded.
    assert (
        main(["submit", "--conf", "sampling.temperature=0.3", "--conf", "job.start_over=true", str(job)]) == 0
    )
    assert "already complete" in capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "_SUCCESS").read_text()) == success


def test_too_many_bad_rows_exits_65_with_error_records(tmp_path: Path, model_dir: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"id": "a", "prompt": "hello fox"},
        {"id": "b", "prompt": None},
        {"id": "c", "prompt": ""},
        {"id": "d", "prompt": "split commit"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    job = tmp_path / "job.toml"
    job.write_text(
        job_toml(
            model_dir,
            str(tmp_path / "in.parquet"),
            str(tmp_path / "out"),
            input={"passthrough_columns": []},
            job={"max_error_fraction": 0.25},
        )
    )
    result = cli("submit", str(job))
    assert result.returncode == 65, result.stderr
    assert "2 of 4 output records are errors" in result.stderr
    assert "(empty_prompt 2; first: row 'b' (empty_prompt): " in result.stderr  # what the errors are
    got = {r["row_id"]: (r["status"], r["error_code"]) for r in committed_rows(str(tmp_path / "out"))}
    assert got == {
        "a": ("ok", None),
        "b": ("error", "empty_prompt"),
        "c": ("error", "empty_prompt"),
        "d": ("ok", None),
    }
    assert not (tmp_path / "out" / "_SUCCESS").exists()


def test_validate_reads_only(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(shards), str(tmp_path / "out")))
    assert main(["validate", str(job)]) == 0
    assert "ok: 6 split(s)" in capsys.readouterr().out
    assert main(["validate", "--conf", 'input.passthrough_columns=["topics"]', str(job)]) == 78
    assert "did you mean 'topic'?" in capsys.readouterr().err
    assert main(["validate", "--conf", "input.prompt_column=text", str(job)]) == 78  # a column the spec names
    assert not (tmp_path / "out").exists()


def test_validate_checks_the_output_location_of_a_scheduled_run(
    tmp_path: Path, model_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # {run_id} in output.path: without --run-id, validate checked a new location of its own making.
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(shards), str(tmp_path / "out" / "{name}" / "{run_id}")))
    from shardinfer.splits import Split
    from shardinfer.writers import OutputStore, make_job_record

    taken = tmp_path / "out" / "nightly" / "scheduled__1"  # holds another job: a submit exits 78
    OutputStore(str(taken)).write_job(make_job_record("other", {"hash": "f" * 64}, [Split(0, 0, "x", 0, 4)]))
    assert main(["validate", "--name", "nightly", "--run-id", "scheduled__1", str(job)]) == 78
    assert f"{taken} holds a job with another fingerprint" in capsys.readouterr().err
    assert main(["validate", "--name", "nightly", "--run-id", "scheduled__2", str(job)]) == 0
    assert "output state: new" in capsys.readouterr().out
    # submit's flags that say how to run are named as such, not as stray arguments only.
    assert main(["validate", "--master", "local[2]", str(job)]) == 64
    err = capsys.readouterr().err
    assert "validate runs nothing, so --master is a flag of submit: drop it" in err


def test_a_made_up_run_id_in_the_output_path_and_unused_ray_keys_are_warned_of(
    tmp_path: Path, model_dir: Path, shards: Path
) -> None:
    # "rerun the same command to resume" is untrue there: a rerun makes up another run id. And a
    # [ray] key with a local master was taken in silence.
    from shardinfer.jobs.cli import _generated_run_id_in_paths
    from shardinfer.jobs.spec import load_toml, resolve

    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(shards), str(tmp_path / "out" / "{run_id}")))
    result = cli("submit", "--conf", "ray.num_workers=4", str(job))
    assert result.returncode == 0, result.stderr
    assert "ray.num_workers has no effect with --master local: the [ray] section applies to --master ray" in (
        result.stderr
    )
    (made_up,) = (tmp_path / "out").iterdir()
    assert (
        f"output.path holds {{run_id}}, and no --run-id was given: this run writes to {made_up}"
        in result.stderr
    )
    assert f"to resume it, rerun with --run-id {made_up.name}" in result.stderr
    assert _generated_run_id_in_paths(resolve(load_toml(job), run_id="scheduled__1")) == ""


_TERM_WHILE_PLANNING = """
import os, signal, sys
import shardinfer.pipeline.job as job_module
planned = job_module.open_job
def open_job(*args, **kwargs):  # the SIGTERM arrives while the input is listed
    os.kill(os.getpid(), signal.SIGTERM)
    return planned(*args, **kwargs)
job_module.open_job = open_job
from shardinfer.jobs.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_while_planning_exits_75_with_a_message(
    tmp_path: Path, model_dir: Path, shards: Path
) -> None:
    # It died by the signal (143, no message) until the run's own SIGTERM handling took over.
    job, out = standard_job(tmp_path, model_dir, str(shards))
    script = tmp_path / "term_while_planning.py"
    script.write_text(_TERM_WHILE_PLANNING)
    result = subprocess.run(
        [sys.executable, str(script), "submit", str(job)],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 75, result.stderr
    assert "interrupted (SIGTERM) before the run started its splits: it committed nothing" in result.stderr
    assert not out.exists()


def test_corrupt_and_empty_input(tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "prompts.parquet").write_bytes(b"PAR1 this is not parquet")
    (tmp_path / "empty").mkdir()
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model_dir, str(tmp_path / "bad"), str(tmp_path / "out")))
    assert main(["submit", str(job)]) == 65
    assert "prompts.parquet" in capsys.readouterr().err
    assert main(["submit", "--conf", f"input.path={tmp_path / 'empty'}", str(job)]) == 66
    assert not (tmp_path / "out").exists()


def test_ctrl_c_is_an_interruption_like_sigterm(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    """Ctrl-C (SIGINT) once a split is committed: exit 75, the run recorded as interrupted with a
    reason, and the same command resumes to the uninterrupted output."""
    job, out = fine_grained_job(tmp_path, model_dir, str(shards))
    # A child inherits an ignored SIGINT (a test runner in the background): take the default back.
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardinfer", "submit", str(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=REPO,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 90
    while not list(out.glob("_commits/*.json")) and proc.poll() is None:
        assert time.monotonic() < deadline, "no commit within 90 s"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 75, err
    message = "interrupted (Ctrl-C): the committed splits are kept; rerun the same command to resume"
    assert f"ERROR {message} (exit_code=75)" in err
    [record] = [json.loads(p.read_text()) for p in (out / "_runs").glob("*.json")]
    assert (record["state"], record["exit_code"], record["reason"]) == ("interrupted", 75, message)
    assert record["splits_committed"] == len(list(out.glob("_commits/*.json"))) >= 1  # what it did commit
    assert not (out / "_SUCCESS").exists()
    rerun = cli("submit", str(job))
    assert rerun.returncode == 0, rerun.stderr
    assert committed_rows(str(out)) == reference


def test_a_job_started_with_sigint_ignored_keeps_its_workers_on_ctrl_c(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    """A local[2] job started with SIGINT ignored (in the background of a script) gets a SIGINT for its
    whole process group: it keeps running, and so do its workers (they stopped, and the driver took
    them for dead: an error per worker and a replacement each)."""
    job, out = fine_grained_job(tmp_path, model_dir, str(shards))
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardinfer", "submit", "--master", "local[2]", str(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=REPO,
        start_new_session=True,  # its own process group, as a terminal's job has
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    deadline = time.monotonic() + 90
    while not list(out.glob("_commits/*.json")) and proc.poll() is None:
        assert time.monotonic() < deadline, "no commit within 90 s"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)  # the driver and both workers, as Ctrl-C in a terminal
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "died" not in err and "replacement" not in err
    assert committed_rows(str(out)) == reference


def test_a_closed_stdout_ends_status_and_history_quietly(
    tmp_path: Path, model_dir: Path, shards: Path
) -> None:
    """`shardinfer status OUT | head -1`: the reader is gone; no BrokenPipeError, no error line."""
    job, out = standard_job(
        tmp_path, model_dir, str(shards / "prompts-00.parquet"), sampling={"max_tokens": 1}
    )
    assert cli("submit", str(job)).returncode == 0
    for args in (["status", str(out)], ["status", "--json", str(out)], ["history", str(out)], ["--version"]):
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader left before the first line
        try:
            result = subprocess.run(
                [sys.executable, "-m", "shardinfer", *args],
                stdout=write_end,
                stderr=subprocess.PIPE,
                text=True,
                env=cli_env(),
                cwd=REPO,
                timeout=120,
            )
        finally:
            os.close(write_end)
        assert (result.returncode, result.stderr) == (0, ""), args


def test_verbose_shows_tracebacks_of_errors_while_resolving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shardinfer.jobs.cli as cli_module

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in spec resolution")

    monkeypatch.setattr(cli_module, "resolve", broken)
    job = tmp_path / "job.toml"
    job.write_text(job_toml("m", "in", "out"))
    assert main(["submit", "--verbose", str(job)]) == 1
    err = capsys.readouterr().err
    assert "RuntimeError: a bug in spec resolution" in err and "Traceback (most recent call last)" in err
    assert main(["submit", str(job)]) == 1
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["no tokenizer.json", "truncated weights", "unknown architecture"])
def test_model_folder_errors_point_at_the_folder(
    tmp_path: Path, model_dir: Path, shards: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    if damage == "no tokenizer.json":
        (model / "tokenizer.json").unlink()
    elif damage == "truncated weights":
        weights = next(model.glob("*.safetensors"))
        weights.write_bytes(weights.read_bytes()[:1000])
    else:
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    job, _ = standard_job(tmp_path, model, str(shards))
    assert main(["submit", str(job)]) == 78
    err = capsys.readouterr().err
    assert f"cannot load the model at model.path={str(model)!r}: " in err
    assert "(fix the model folder at model.path, or point model.path at another) (exit_code=78)" in err
    assert "fix [engine]" not in err


def test_command_line_slips_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.toml"
    job.write_text(job_toml("m", "in", "out"))
    assert main(["submit", str(tmp_path)]) == 64
    assert f"job file {str(tmp_path)!r} is a directory: give the file itself" in capsys.readouterr().err
    assert main(["submit", "--set", "sampling.temperature=0", str(job)]) == 64
    assert "unrecognized arguments: --set" in (err := capsys.readouterr().err) and "--conf KEY=VALUE" in err
    files = [str(tmp_path / f"in-{i}.parquet") for i in range(3)]  # what the shell made of in-*.parquet
    assert main(["generate", "--model", "m", "--input", *files, "--output", "o"]) == 64
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {files[1]} {files[2]}" in err
    assert f"quote it, e.g. --input '{tmp_path}/*.parquet'" in err
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"shardinfer {importlib.metadata.version('shardinfer')}\n"


def test_a_conf_value_after_a_space_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `--conf KEY VALUE` made VALUE the job file and left the job file over: the error named only that.
    job = tmp_path / "job.toml"
    job.write_text(job_toml("m", "in", "out"))
    generate = ["generate", "--model", "m", "--input", "i", "--output", "o"]
    for argv in (
        ["validate", "--conf", "sampling.temperature", "0.7", str(job)],
        [*generate, "--conf", "job.seed", "3"],
    ):
        assert main(argv) == 64
        err = capsys.readouterr().err
        assert "--conf takes KEY=VALUE as one argument: --conf " in err and "=VALUE, not a space" in err
        assert "no job file" not in err


def test_generate_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["generate", "--model", "m", "--input", "in.parquet"]
    assert main([*base, "--output="]) == 64
    assert "--output is empty: give the output location" in capsys.readouterr().err
    assert main([*base, "--output", "o", "--conf", "model.path=other"]) == 64
    assert "--conf model.path=... and --model both set it" in capsys.readouterr().err
    assert main([*base, "--output", "o", "extra.toml"]) == 64
    err = capsys.readouterr().err
    assert "no job file" in err and "glob" not in err  # not mistaken for an expanded glob


def test_a_store_refusing_the_credentials_is_named(
    tmp_path: Path,
    model_dir: Path,
    shards: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import shardinfer.pipeline.job as job_module

    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(
            "The request signature we calculated does not match the signature you provided."
        )

    monkeypatch.setattr(job_module, "open_job", refused)
    job, _ = standard_job(tmp_path, model_dir, str(shards))
    assert main(["submit", "--conf", "output.path=s3://bucket/out", str(job)]) == 78
    err = capsys.readouterr().err
    assert "the object store refused access (The request signature we calculated" in err
    assert "check the credentials" in err and "input.storage_options / output.storage_options" in err


def test_a_local_file_this_user_cannot_read_is_named_not_blamed_on_credentials(
    tmp_path: Path,
    model_dir: Path,
    shards: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import shardinfer.pipeline.job as job_module

    unreadable = next(shards.glob("*.parquet")) if shards.is_dir() else shards

    def refused(*args: object, **kwargs: object) -> None:
        # What open() raises for a file without read permission (a root user cannot be refused one).
        raise PermissionError(errno.EACCES, "Permission denied", str(unreadable))

    monkeypatch.setattr(job_module, "open_job", refused)
    job, _ = standard_job(tmp_path, model_dir, str(shards))
    for output in (str(tmp_path / "out"), "s3://bucket/out"):  # a local input beside remote output too
        assert main(["submit", "--conf", f"output.path={output}", str(job)]) == 78
        err = capsys.readouterr().err
        assert f"this user cannot read or write {str(unreadable)!r} (Permission denied)" in err
        assert "object store" not in err and "credentials" not in err

    # A local job whose refusal names no file: still no talk of object storage.
    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError("denied")

    monkeypatch.setattr(job_module, "open_job", denied)
    assert main(["submit", str(job)]) == 78
    err = capsys.readouterr().err
    assert "permission denied (denied): this user cannot read or write that local path" in err
    assert "object store" not in err


def test_a_storage_error_prints_its_message_without_the_errno_prefix(
    tmp_path: Path,
    model_dir: Path,
    shards: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import shardinfer.pipeline.job as job_module
    from shardinfer.errors import StorageError

    def full(*args: object, **kwargs: object) -> None:
        raise StorageError(errno.ENOSPC, "write out/part-00001.parquet: no space left on the device")

    monkeypatch.setattr(job_module, "open_job", full)
    job, _ = standard_job(tmp_path, model_dir, str(shards))
    assert main(["submit", str(job)]) == 75
    err = capsys.readouterr().err
    assert "write out/part-00001.parquet: no space left on the device" in err
    assert "Errno" not in err


def test_ctrl_c_in_an_eval_speaks_of_its_tasks(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shardinfer.jobs.eval_command as eval_command

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(eval_command, "run_eval", interrupted)
    code = main(["eval", "--model", str(model_dir), "--tasks", "t", "--output", str(tmp_path / "ev")])
    err = capsys.readouterr().err
    assert code == 75, err
    assert "interrupted (Ctrl-C): the tasks this eval committed are kept, the one running is not" in err
    assert "splits" not in err
