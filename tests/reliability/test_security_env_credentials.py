"""Canary credentials given where the other canary tests do not put them: in the AWS_* environment
variables s3fs reads, in the URL of a server that refuses the connection, and written into an
`s3://` URL with a '/' in the secret (as AWS secret keys often have). Each job fails its own way (a
bucket that does not exist, a refused connection, a model that does not load, rows that cannot
become requests) with --verbose tracebacks and JSON logs; every line printed and every byte written
is searched for them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from canary_kit import (
    CANARY_KEY,
    CANARY_PASSWORD,
    CANARY_SECRET,
    CANARY_SIGNATURE,
    CANARY_TOKEN,
    CANARY_USER,
    assert_clean,
    scan_outputs,
    scan_tree,
    signed_url,
    write_job,
)
from pipeline_kit import cli, cli_env, write_shards
from s3_server import free_port

# What s3fs (through botocore) takes credentials from when storage_options name none.
_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": CANARY_KEY,
    "AWS_SECRET_ACCESS_KEY": CANARY_SECRET,
    "AWS_SESSION_TOKEN": CANARY_TOKEN,
}


def _loud(job: Path, env: dict[str, str]) -> Any:
    return cli("submit", "--verbose", "--log-format", "json", str(job), env=env, timeout=300)


@pytest.mark.slow
def test_environment_credentials_and_failing_jobs_leave_no_trace(
    tmp_path: Path, model_dir: Path, s3_bucket: Any, survived: Counter[str]
) -> None:
    import s3fs

    env = cli_env(**_AWS_ENV)
    endpoint = {"client_kwargs": {"endpoint_url": s3_bucket.endpoint}}
    bad_row = {"id": "bad", "prompt": None, "topic": "t"}
    shards = write_shards(tmp_path / "shards", files=1, rows=4, extra=[bad_row])
    no_bucket = write_job(
        tmp_path,
        "no-bucket",
        model_dir,
        str(shards),
        "s3://no-such-bucket/out",
        output={"storage_options": endpoint},
    )
    refused_url = signed_url(free_port(), CANARY_USER, CANARY_PASSWORD, CANARY_SIGNATURE)
    refused = write_job(tmp_path, "refused", model_dir, refused_url, str(tmp_path / "out-refused"))
    broken_model = tmp_path / "broken-model"
    broken_model.mkdir()
    for path in model_dir.iterdir():  # the weights cut short: the model cannot load
        data = path.read_bytes()
        (broken_model / path.name).write_bytes(data[:200] if path.suffix == ".safetensors" else data)
    broken = write_job(
        tmp_path,
        "broken",
        broken_model,
        str(shards),
        str(tmp_path / "out-broken"),
        input={"storage_options": {"key": CANARY_KEY, "secret": CANARY_SECRET}},
    )
    slash_url = f"s3://{CANARY_KEY}:a/{CANARY_SECRET}@{s3_bucket.name}/in"
    slash = write_job(tmp_path, "slash", model_dir, slash_url, str(tmp_path / "out-slash"))
    out_url = s3_bucket.url("out")
    rows = write_job(
        tmp_path,
        "rows",
        model_dir,
        str(shards),
        out_url,
        output={"storage_options": endpoint},
        job={"max_error_fraction": 0.5},
    )
    results = [_loud(job, env) for job in (no_bucket, refused, broken, slash, rows)]
    # Each failed as it should: a missing bucket and an unloadable model are the job's configuration,
    # a refused connection is a storage outage, and credentials in an s3:// URL are refused.
    assert [r.returncode for r in results] == [78, 75, 78, 78, 0], [r.stderr[-400:] for r in results]
    assert "storage_options" in results[3].stderr and "s3://***@" in results[3].stderr, results[3].stderr
    status = cli("status", "--json", "--storage-options", json.dumps(endpoint), out_url, env=env)
    history = cli("history", "--storage-options", json.dumps(endpoint), out_url, env=env)
    assert json.loads(status.stdout)["rows_error"] == 1, status.stderr
    scan_outputs(survived, *results, status, history)
    for out in ("out-refused", "out-broken", "out-slash"):
        if (tmp_path / out).exists():
            scan_tree(survived, tmp_path / out)
    admin = s3fs.S3FileSystem(**s3_bucket.storage_options)
    admin.invalidate_cache()  # s3fs shares one instance, and its listings, between tests
    objects = admin.find(f"{s3_bucket.name}/out")
    assert any(o.endswith("_SUCCESS") for o in objects) and any("/_runs/" in o for o in objects)
    for key in objects:  # _job.json, _SUCCESS, commit markers, the run record, the parts
        assert_clean(key, admin.cat_file(key))
    survived["canary files scanned"] += len(objects)
