"""`--deploy-mode cluster` against a real Ray cluster with its Jobs API: a head node started by
`ray start` (dashboard on 127.0.0.1, free ports), the driver submitted as a Ray Job, its logs
followed, its exit code returned, and its rows equal to an uninterrupted `local` run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pipeline_kit import cli, cli_env, committed_rows, standard_job

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def jobs_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A one-node cluster with the Jobs API, its processes on this interpreter's environment."""
    from ray.job_submission import JobSubmissionClient

    dashboard = _free_port()
    # Ray's token authentication is Ray's own business (a token file or RAY_AUTH_TOKEN on the
    # client); this throwaway cluster on 127.0.0.1 runs without it.
    env = cli_env(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        RAY_AUTH_MODE="disabled",
    )
    env.pop("RAY_ADDRESS", None)
    log = (tmp_path_factory.mktemp("ray-head") / "head.log").open("w")
    head = subprocess.Popen(
        [
            sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
            "--node-ip-address=127.0.0.1", f"--port={_free_port()}",
            f"--ray-client-server-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}",
            "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
            "--num-cpus=2", "--disable-usage-stats",
        ],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    address = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                JobSubmissionClient(address).list_jobs()
                break
            except Exception:  # the Jobs API comes up after the head node: retry until the deadline
                if head.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the Ray head node did not come up: {Path(log.name).read_text()[-2000:]}")
                time.sleep(1)
        yield address
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # `ray start --block` stops its cluster on SIGTERM
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        log.close()


def test_deploy_mode_cluster_runs_the_driver_as_a_ray_job(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]], jobs_api: str
) -> None:
    job, out = standard_job(tmp_path, model_dir, str(shards))
    done = cli(
        "submit", "--master", "ray", "--deploy-mode", "cluster",
        "--conf", f"ray.address={jobs_api}", "--conf", "ray.num_workers=1", str(job),
        env=cli_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"),
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "submitted the driver as a Ray Job" in done.stdout + done.stderr
    # The driver's own log lines came back through the Jobs API.
    assert "starting" in done.stdout
    assert committed_rows(str(out)) == reference


def test_deploy_mode_cluster_returns_the_drivers_exit_code(tmp_path: Path, jobs_api: str) -> None:
    job, _ = standard_job(tmp_path, tmp_path / "no-such-model", str(tmp_path / "no-input"))
    done = cli(
        "submit", "--master", "ray", "--deploy-mode", "cluster", "--conf", f"ray.address={jobs_api}", str(job),
        env=cli_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"),
        timeout=300,
    )  # fmt: skip
    local = cli("submit", str(job))
    assert local.returncode not in (0, 1), local.stderr
    assert done.returncode == local.returncode, done.stdout[-3000:] + done.stderr[-3000:]
