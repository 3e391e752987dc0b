"""Canary credentials under `--master ray`: two worker actors on a local Ray cluster read an input
that only the canary credentials open (user-info and a `sig=` parameter in the URL, and an API key
header given by `--conf` on the command line), so the actors provably received them; then the
output, everything the CLI printed and every file of the Ray session (the actors' and the
cluster's logs) are searched for them."""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path

import ray
from canary_kit import (
    CANARY_PASSWORD,
    CANARY_SIGNATURE,
    CANARY_TOKEN,
    CANARY_USER,
    jsonl_with_a_bad_line,
    scan_outputs,
    scan_tree,
    serve_credentialed,
    signed_url,
    write_job,
)
from pipeline_kit import cli, cli_env, committed_rows


def test_ray_actors_use_the_credentials_and_no_log_holds_them(
    tmp_path: Path, model_dir: Path, survived: Counter[str]
) -> None:
    root = tmp_path / "served"
    root.mkdir()
    jsonl_with_a_bad_line(root)
    # Ray's session folder holds unix sockets: its path must stay short.
    session = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    try:
        with serve_credentialed(root) as (port, accepted):
            context = ray.init(
                address="local",  # a cluster of its own, whatever other clusters this machine runs
                num_cpus=2,
                include_dashboard=False,
                object_store_memory=200 * 1024 * 1024,
                _node_ip_address="127.0.0.1",
                _temp_dir=str(session),
                log_to_driver=False,
                configure_logging=False,
            )
            try:
                out = tmp_path / "out"
                url = signed_url(port, CANARY_USER, CANARY_PASSWORD, CANARY_SIGNATURE)
                sections = {"job": {"split_rows": 2, "max_error_fraction": 0.5}}
                job = write_job(tmp_path, "job", model_dir, url, str(out), **sections)
                accepted["api_key"] = CANARY_TOKEN  # from here on every request must carry it
                run = cli(
                    "submit",
                    "--master",
                    "ray",
                    "--conf",
                    "ray.num_workers=2",
                    "--conf",
                    "ray.num_cpus_per_worker=1",
                    "--conf",
                    f'input.storage_options={{headers = {{"X-Api-Key" = "{CANARY_TOKEN}"}}}}',
                    str(job),
                    env=cli_env(RAY_ADDRESS=str(context.address_info["gcs_address"])),
                    timeout=300,
                )
                assert run.returncode == 0, run.stderr
            finally:
                ray.shutdown()  # the session's log files are complete once the cluster is down
        rows = committed_rows(str(out))
        assert sorted(r["row_id"] for r in rows if r["status"] == "ok") == ["h0", "h1", "h2", "h4", "h5"]
        errors = [r["error_message"] for r in rows if r["status"] == "error"]
        assert len(errors) == 1 and "***" in errors[0], errors
        scan_outputs(survived, run)
        scan_tree(survived, out)
        assert scan_tree(survived, session) > 0  # the actors' and the cluster's logs
    finally:
        shutil.rmtree(session, ignore_errors=True)
