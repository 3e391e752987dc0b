"""The commands that only read a spec or an output location answer without importing torch.

`status`, `history`, `validate` and a dry run are what users type while a job runs, or put in a
scheduler's health check; torch's import alone takes seconds. Each command runs in one child
process, which reports after each command whether torch is loaded by then.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipeline_kit import REPO, cli, cli_env, standard_job

PROBE = """
import contextlib, io, json, sys
from shardinfer.jobs.cli import main

report = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ["shardinfer", *argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main()
        except SystemExit as stop:
            code = stop.code
    report.append({"argv": argv, "code": code, "torch": "torch" in sys.modules, "stderr": err.getvalue()[-500:]})
print(json.dumps(report))
"""


def _probe(*commands: list[str]) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(commands)],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: list[dict[str, object]] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def test_read_only_commands_do_not_import_torch(tmp_path: Path, model_dir: Path, shards: Path) -> None:
    job, out = standard_job(tmp_path, model_dir, str(shards))
    before = _probe(["validate", str(job)], ["submit", "--dry-run", str(job)], ["status", str(out)])
    assert [r["code"] for r in before] == [0, 0, 66], before  # no job at `out` yet: 66, no input
    run = cli("submit", str(job))
    assert run.returncode == 0, run.stderr
    after = _probe(["status", str(out)], ["status", "--json", str(out)], ["history", str(out)])
    assert [r["code"] for r in after] == [0, 0, 0], after
    for step in before + after:
        assert step["torch"] is False, f"{step['argv']} imported torch"


def test_the_probe_sees_torch_when_a_command_loads_it(tmp_path: Path, model_dir: Path, shards: Path) -> None:
    """The check above can fail: a CPU job with dtype "auto" still resolves without torch, but a
    job asking for device "auto" must ask torch whether CUDA is there."""
    job, _ = standard_job(tmp_path, model_dir, str(shards), model={"device": "auto"})
    (report,) = _probe(["submit", "--dry-run", str(job)])
    assert report["code"] == 0, report
    assert report["torch"] is True, report
