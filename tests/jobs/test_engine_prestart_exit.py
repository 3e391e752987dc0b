"""A job that ends without its prestarted engine does not wait for the build (jobs/engine_prestart.py):
a plan refused, a job already complete, or a stop while the job is planned or its engine built, is
reported and the command exits with its code while the build still runs.

The command runs in a process of its own whose engine build never ends (it waits on an event nobody
sets), so a command that waited for it would never exit: each test bounds its wait generously,
and no test depends on how fast this machine is."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pipeline_kit import REPO, cli_env, job_toml

import shardinfer.pipeline.job as job_module
from shardinfer.jobs import engine_prestart
from shardinfer.jobs.cli import main
from shardinfer.jobs.engine_prestart import EnginePrestart

# The `shardinfer` command, as its script runs it (main() on this process's command line), with an
# engine build that never ends, and marks (files in TEST_MARKS) of where the command got to.
# TEST_REAL_BUILD=1 keeps the real build; TEST_HOLD_PLAN=1 holds the plan until a test makes the
# mark `go`.
_COMMAND = """
import os, sys, threading, time
from pathlib import Path

import shardinfer.pipeline.job as job_module
from shardinfer.jobs.cli import main
from shardinfer.jobs.engine_prestart import EnginePrestart

marks = Path(os.environ["TEST_MARKS"])
real_open, real_wait = job_module.open_job, EnginePrestart.wait

def endless_build(config):
    (marks / "building").touch()
    threading.Event().wait()

def open_job(config, **kwargs):
    (marks / "planning").touch()
    while os.environ.get("TEST_HOLD_PLAN") and not (marks / "go").exists():
        time.sleep(0.05)
    return real_open(config, **kwargs)

def wait(self, stop):
    (marks / "waiting").touch()
    return real_wait(self, stop)

if not os.environ.get("TEST_REAL_BUILD"):
    job_module.build_engine = endless_build
job_module.open_job = open_job
EnginePrestart.wait = wait
sys.exit(main())
"""

# How long a command may take to start, plan and exit, or to reach a mark: far more than it needs.
_BOUND_S = 60


def _start(spec: Path, marks: Path, **env: str) -> subprocess.Popen[str]:
    marks.mkdir()
    return subprocess.Popen(
        [sys.executable, "-c", _COMMAND, "submit", str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(TEST_MARKS=str(marks), **env),
        cwd=REPO,
        # A child inherits an ignored SIGINT (a test runner in the background): take the default back.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """The command's exit code and stderr, once it exits by itself within the bound."""
    try:
        _, err = proc.communicate(timeout=_BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the command did not exit within {_BOUND_S} s: it waited for the engine build\n{err}")
    return proc.returncode, err


def _await_marks(proc: subprocess.Popen[str], marks: Path, *names: str) -> None:
    deadline = time.monotonic() + _BOUND_S
    while not all((marks / name).exists() for name in names):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"the command never reached {names} (exit code {proc.returncode})\n{err}")
        time.sleep(0.05)


def _start_building(spec: Path, marks: Path) -> subprocess.Popen[str]:
    """The command, its plan let go once the engine build is under way (and never to end)."""
    proc = _start(spec, marks, TEST_HOLD_PLAN="1")
    _await_marks(proc, marks, "building", "planning")
    (marks / "go").touch()
    return proc


def _spec(tmp_path: Path, model_dir: Path, shards: Path, **sections: dict[str, Any]) -> Path:
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml(model_dir, str(shards), str(tmp_path / "out"), **sections))
    return spec


def test_a_refused_plan_exits_78_while_the_engine_is_still_built(
    tmp_path: Path, model_dir: Path, shards: Path
) -> None:
    spec = _spec(tmp_path, model_dir, shards, input={"messages_column": "prompt", "prompt_column": ""})
    proc = _start_building(spec, tmp_path / "marks")
    code, err = _finish(proc)
    assert code == 78, err
    assert "input.messages_column='prompt' holds no chat messages" in err
    assert not (tmp_path / "out").exists()


def test_a_job_already_complete_exits_0_while_the_engine_is_still_built(
    tmp_path: Path, model_dir: Path, shards: Path
) -> None:
    spec = _spec(tmp_path, model_dir, shards / "prompts-00.parquet", sampling={"max_tokens": 1})
    assert main(["submit", str(spec)]) == 0  # in this process, with a real engine
    code, err = _finish(_start_building(spec, tmp_path / "marks"))
    assert code == 0, err
    assert "already complete" in err


# A signal that stops a job before its splits, and what the job then says.
_STOPS = [
    (signal.SIGTERM, "interrupted (SIGTERM) before the run started its splits"),
    (signal.SIGINT, "interrupted (Ctrl-C)"),
]


@pytest.mark.parametrize(("signum", "message"), _STOPS)
def test_a_stop_while_planning_exits_75_at_once(
    tmp_path: Path, model_dir: Path, shards: Path, signum: int, message: str
) -> None:
    proc = _start(_spec(tmp_path, model_dir, shards), tmp_path / "marks", TEST_HOLD_PLAN="1")
    _await_marks(proc, tmp_path / "marks", "building", "planning")
    proc.send_signal(signum)
    code, err = _finish(proc)
    assert code == 75, err
    assert f"ERROR {message}" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("signum", "message"), _STOPS)
def test_a_stop_while_the_engine_is_built_exits_75_with_nothing_written(
    tmp_path: Path, model_dir: Path, shards: Path, signum: int, message: str
) -> None:
    """Planned, the job waits for its engine before it writes its plan: a stop then ends it there."""
    proc = _start(_spec(tmp_path, model_dir, shards), tmp_path / "marks")
    _await_marks(proc, tmp_path / "marks", "building", "waiting")
    proc.send_signal(signum)
    code, err = _finish(proc)
    assert code == 75, err
    assert f"ERROR {message}" in err
    assert not (tmp_path / "out" / "_job.json").exists()


@pytest.fixture(scope="module")
def moe_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("dsv3"), "deepseek_v3")


def _rank_processes(marks: Path) -> list[int]:
    """The expert-parallel rank processes of the command run with these marks (their environment
    names them), wherever their parent is now."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue  # not a process, or one that ended, or another user's
        if b"shardinfer.engine.parallel.rank_main" in argv and f"TEST_MARKS={marks}".encode() in environ:
            found.append(int(entry.name))
    return found


def test_a_refused_plan_ends_the_ranks_its_engine_build_started(
    tmp_path: Path, moe_model_dir: Path, shards: Path
) -> None:
    """An expert-parallel engine's ranks, started by the build, end with the command: they do not go
    on loading the model, then print a broken pipe to the terminal of a command long gone."""
    marks = tmp_path / "marks"
    spec = _spec(
        tmp_path,
        moe_model_dir,
        shards,
        engine={"expert_parallel_size": 2},
        input={"messages_column": "prompt", "prompt_column": ""},
    )
    scratch = tmp_path / "tmp"  # the command's temporary folder: the ranks' spec leaves nothing in it
    scratch.mkdir()
    proc = _start(spec, marks, TEST_REAL_BUILD="1", TEST_HOLD_PLAN="1", TMPDIR=str(scratch))
    deadline = time.monotonic() + _BOUND_S
    while len(_rank_processes(marks)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    (marks / "go").touch()  # the ranks are loading: the plan may go on, and is refused
    code, err = _finish(proc)  # stderr ends once every process that holds it has ended, ranks included
    assert code == 78, err
    assert "input.messages_column='prompt' holds no chat messages" in err
    assert "Traceback" not in err
    assert _rank_processes(marks) == []
    assert not list(scratch.glob("shardinfer-ranks-*"))


class _Engine:
    """Stands for a built engine: a weak reference tells whether anything still holds it."""


class _HeldBuild:
    """An engine build that waits for `release`, then makes an _Engine (a weak reference kept)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.made: list[weakref.ref[_Engine]] = []

    def __call__(self, config: Any, timeline: Any) -> _Engine:
        self.release.wait()
        engine = _Engine()
        self.made.append(weakref.ref(engine))
        return engine


@pytest.fixture
def held_build(monkeypatch: pytest.MonkeyPatch) -> Iterator[_HeldBuild]:
    build = _HeldBuild()
    monkeypatch.setattr(job_module, "build_engine_marked", build)
    yield build
    build.release.set()  # a test that failed part way leaves no build behind
    engine_prestart.wait_for_dropped_builds()


def _config(tmp_path: Path) -> Any:
    return SimpleNamespace(model=SimpleNamespace(path=str(tmp_path), storage_options={}), engine={})


def test_close_drops_a_running_build_and_what_it_makes(tmp_path: Path, held_build: _HeldBuild) -> None:
    prestart = EnginePrestart(_config(tmp_path), None)
    prestart.close()  # returns while the build waits
    assert engine_prestart.dropped_build_running()
    held_build.release.set()
    engine_prestart.wait_for_dropped_builds()
    assert not engine_prestart.dropped_build_running()
    assert len(held_build.made) == 1 and held_build.made[0]() is None  # let go once made
    assert prestart._engine is None


def test_wait_gives_up_when_the_job_is_stopped(tmp_path: Path, held_build: _HeldBuild) -> None:
    prestart = EnginePrestart(_config(tmp_path), None)
    stop = threading.Event()
    stop.set()
    assert prestart.wait(stop) is False  # the build still waits
    held_build.release.set()
    assert prestart.wait(threading.Event()) is True
    assert isinstance(prestart.take(), _Engine)
