"""`--deploy-mode cluster`: the driver itself runs on the Ray cluster, submitted as a Ray Job.

This process only submits and watches, as `ray job submit` does: the job file (and properties
file) travel in the Job's working directory, the entrypoint is the same `shardinfer submit`
command with `--deploy-mode client`, the driver's logs are followed here, and this process
exits with the driver's exit code. Paths in the job (model, input, output) must be reachable
from the cluster: object-storage URLs, or a file system every node mounts.

The Jobs API is the cluster's dashboard address (`http://HEAD:8265`), taken from `ray.address`
or RAY_ADDRESS when they are http(s) URLs, else from the head named by `--master ray://HEAD:PORT`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from shardinfer.errors import EXIT_FAILURE, EXIT_OK, EXIT_RETRYABLE, Retryable, UsageError
from shardinfer.jobs.progress import Reporter
from shardinfer.jobs.spec import ResolvedSpec, holds_credentials, load_properties, parse_conf
from shardinfer.redaction import redact_strings

DASHBOARD_PORT = 8265
POLL_S = 1.0


def jobs_api_address(master: str, configured: str, env_address: str) -> str:
    for candidate in (configured, env_address):
        if candidate.startswith(("http://", "https://")):
            return candidate
    if master.startswith("ray://"):
        host = master.removeprefix("ray://").split("/", 1)[0].rpartition(":")[0]
        return f"http://{host}:{DASHBOARD_PORT}"
    raise UsageError(
        "--deploy-mode cluster needs the cluster's Jobs API address: set ray.address or RAY_ADDRESS "
        f"to http://HEAD:{DASHBOARD_PORT}, or give --master ray://HEAD:PORT"
    )


def driver_command(args: argparse.Namespace, job_name: str, props_name: str | None) -> list[str]:
    """The `shardinfer submit` command the Ray Job runs, in client mode, on the cluster."""
    cmd = ["python", "-m", "shardinfer", "submit", "--master", "ray", "--deploy-mode", "client"]
    cmd += ["--log-format", args.log_format]
    if args.run_id:
        cmd += ["--run-id", args.run_id]
    if args.name:
        cmd += ["--name", args.name]
    if args.verbose:
        cmd.append("--verbose")
    if props_name:
        cmd += ["--properties-file", props_name]
    for conf in args.conf:
        cmd += ["--conf", conf]
    return [*cmd, job_name]


def split_credential_confs(confs: list[str]) -> tuple[list[str], list[str]]:
    """(--conf entries without credentials, those with): a storage_options value, a
    credential-named key, or a URL carrying user-info or a signature."""
    public: list[str] = []
    secret: list[str] = []
    for conf in confs:
        key, value, _ = parse_conf(conf)
        (secret if holds_credentials(key) or redact_strings(value) != value else public).append(conf)
    return public, secret


def properties_text(user_file: str | None, confs: list[str]) -> str:
    """A properties file holding the user's properties file (if any) and then `confs`, which
    come later and so take precedence over it, as --conf entries do."""
    lines = (
        [f"{key}={_toml_literal(value)}" for key, value, _ in load_properties(user_file)] if user_file else []
    )
    lines += [f"{key}={_toml_literal(value)}" for key, value, _ in map(parse_conf, confs)]
    return "\n".join(lines) + "\n"


def _toml_literal(value: Any) -> str:
    """`value` (as `spec.parse_value` reads it) written so that `parse_value` reads it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    return str(value)  # a TOML date or time


def submit_to_cluster(args: argparse.Namespace, spec: ResolvedSpec, reporter: Reporter) -> int:
    import os
    import shlex

    if getattr(args, "job_file", None) is None:
        raise UsageError("--deploy-mode cluster runs a job file: use `shardinfer submit ... JOB.toml`")
    try:
        from ray.job_submission import JobStatus, JobSubmissionClient
    except ImportError:
        raise UsageError(
            "--deploy-mode cluster needs Ray's Jobs client: pip install 'shardinfer[ray]'"
        ) from None
    address = jobs_api_address(args.master, spec.config.ray.address, os.environ.get("RAY_ADDRESS", ""))
    try:
        client = JobSubmissionClient(address)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise Retryable(f"cannot reach the Ray Jobs API at {address!r} ({exc}); is the cluster up?") from None
    workdir = Path(tempfile.mkdtemp(prefix="shardinfer-job-"))
    try:
        job_name = "job.toml"
        shutil.copy(args.job_file, workdir / job_name)
        props = None
        public, secret = split_credential_confs(args.conf)
        if secret:
            # The entrypoint is kept and shown by the cluster (`ray job list`, the dashboard): the
            # --conf entries holding credentials travel in the working directory, as the job file does.
            props = "job.properties"
            (workdir / props).write_text(properties_text(args.properties_file, secret))
        elif args.properties_file:
            props = "job.properties" + Path(args.properties_file).suffix
            shutil.copy(args.properties_file, workdir / props)
        runtime_env: dict[str, Any] = {"working_dir": str(workdir), **spec.config.ray.runtime_env}
        # The driver runs on the cluster and joins it there (Ray gives a job's driver the address):
        # the Jobs API URL given here to reach the cluster means nothing to it.
        public = [conf for conf in public if parse_conf(conf)[0] != "ray.address"]
        command_args = argparse.Namespace(**{**vars(args), "conf": public})
        entrypoint = shlex.join(driver_command(command_args, job_name, props))
        submission = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    reporter.info("submitted the driver as a Ray Job", submission_id=submission, address=address)
    return follow(client, submission, JobStatus, reporter)


def follow(client: Any, submission: str, job_status: Any, reporter: Reporter) -> int:
    """Print the driver's new log lines until it ends; SIGTERM here stops the Ray Job."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        return _follow(client, submission, job_status, reporter, stop)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _follow(client: Any, submission: str, job_status: Any, reporter: Reporter, stop: threading.Event) -> int:
    printed = 0
    stop_sent = False
    while True:
        status = client.get_job_status(submission)
        logs = client.get_job_logs(submission)
        if len(logs) > printed:
            sys.stdout.write(logs[printed:])
            sys.stdout.flush()
            printed = len(logs)
        if status in (job_status.SUCCEEDED, job_status.FAILED, job_status.STOPPED):
            break
        if stop.is_set() and not stop_sent:
            client.stop_job(submission)
            stop_sent = True
        time.sleep(POLL_S)
    info = client.get_job_info(submission)
    code = getattr(info, "driver_exit_code", None)
    if code is None:
        code = {job_status.SUCCEEDED: EXIT_OK, job_status.STOPPED: EXIT_RETRYABLE}.get(status, EXIT_FAILURE)
    if code != EXIT_OK:
        reporter.error(f"the Ray Job's driver ended {status}", submission_id=submission, exit_code=code)
    return int(code)
