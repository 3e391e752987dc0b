"""Canary credentials: jobs whose credentials are unique strings, then every byte they left and
every line they printed searched for them.

  - local: credential-looking storage options on input and output, `--dry-run`, a `local[2]`
    run with JSON logs and a timeline, `status`, `history`, a rerun with a rotated key (the same
    job: already complete);
  - HTTP: `user:password@` and a `sig=` signature in the input URL, served on 127.0.0.1 only
    to requests carrying exactly those (so the job provably used them), a JSONL line that
    becomes an error record quoting the URL, a job killed after a commit and resumed under
    `local[2]`, a rotated password (the same job), a missing file (an error quoting the URL);
  - S3 (the local moto server): key, secret and session token on input, output and a
    `model.path` URL (the model cache included), `status`, a missing input, and credentials
    written into an `s3://` URL (refused without quoting them).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
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
    ROTATED,
    ROTATED_PASSWORD,
    ROTATED_SIGNATURE,
    assert_clean,
    jsonl_with_a_bad_line,
    scan_outputs,
    scan_tree,
    serve_credentialed,
    signed_url,
    write_job,
)
from pipeline_kit import cli, cli_env, committed_rows, write_shards


@pytest.fixture
def small_shards(tmp_path: Path) -> Path:
    return write_shards(tmp_path / "shards", files=1, rows=4)


def test_local_job_writes_and_prints_no_credential(
    tmp_path: Path, model_dir: Path, small_shards: Path, survived: Counter[str]
) -> None:
    options = {
        "key": CANARY_KEY,
        "secret": CANARY_SECRET,
        "client_kwargs": {"aws_session_token": CANARY_TOKEN},
    }
    out = tmp_path / "out"
    timeline = out / "timeline.jsonl"
    sections = {
        "input": {"storage_options": options},
        "output": {"storage_options": options},
        "job": {"timeline_path": str(timeline), "split_rows": 2},
    }
    job = write_job(tmp_path, "job", model_dir, str(small_shards), str(out), **sections)
    dry = cli("submit", "--dry-run", str(job))
    assert dry.returncode == 0, dry.stderr
    assert '"key": "***"' in dry.stdout  # the options are shown, redacted
    run = cli("submit", "--master", "local[2]", "--log-format", "json", "--verbose", str(job), timeout=300)
    assert run.returncode == 0, run.stderr
    assert len(committed_rows(str(out))) == 4 and timeline.is_file()
    status = cli("status", "--json", "--storage-options", json.dumps(options), str(out))
    history = cli("history", "--storage-options", json.dumps(options), str(out))
    assert json.loads(status.stdout)["state"] == "done", status.stderr
    stored = json.loads((out / "_job.json").read_text())["config"]
    assert stored["input"]["storage_options"]["client_kwargs"]["aws_session_token"] == "***"
    # A rotated key is not a new job: the same output is found complete.
    rotated = {**options, **ROTATED}
    sections_rotated = {"input": {"storage_options": rotated}, "output": {"storage_options": rotated}}
    again = cli(
        "submit",
        str(write_job(tmp_path, "rotated", model_dir, str(small_shards), str(out), **sections_rotated)),
    )
    assert again.returncode == 0 and "already complete" in again.stderr, again.stderr
    # Options given where they are not understood are quoted back by no error message.
    misplaced = cli("submit", "--storage-options", json.dumps(options), str(job))
    assert misplaced.returncode == 64, misplaced.stderr
    broken = cli("status", "--storage-options", json.dumps(options)[:-1], str(out))
    assert broken.returncode == 64, broken.stderr
    scan_outputs(survived, dry, run, status, history, again, misplaced, broken)
    assert scan_tree(survived, out) >= 8  # _job.json, _SUCCESS, markers, parts, run record, timeline


@pytest.fixture
def http_files(tmp_path: Path) -> Iterator[tuple[Path, int, dict[str, str]]]:
    root = tmp_path / "served"
    root.mkdir()
    with serve_credentialed(root) as (port, accepted):
        yield root, port, accepted


def test_http_credentials_are_used_but_never_written(
    tmp_path: Path, model_dir: Path, http_files: tuple[Path, int, dict[str, str]], survived: Counter[str]
) -> None:
    root, port, accepted = http_files
    jsonl_with_a_bad_line(root)

    def url(user: str, password: str, sig: str, name: str = "prompts.jsonl") -> str:
        return signed_url(port, user, password, sig, name)

    out = tmp_path / "out"
    sections = {"job": {"split_rows": 2, "max_error_fraction": 0.5}}
    job = write_job(
        tmp_path, "job", model_dir, url(CANARY_USER, CANARY_PASSWORD, CANARY_SIGNATURE), str(out), **sections
    )
    dry = cli("submit", "--dry-run", str(job))
    assert dry.returncode == 0, dry.stderr
    crashed = cli("submit", str(job), env=cli_env(SHARDINFER_TEST_CRASH_AT="after_commit"))
    assert crashed.returncode == -9, crashed.stderr  # killed after its first commit
    resumed = cli("submit", "--master", "local[2]", str(job), timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    rows = committed_rows(str(out))
    assert sorted(r["row_id"] for r in rows if r["status"] == "ok") == ["h0", "h1", "h2", "h4", "h5"]
    errors = [r["error_message"] for r in rows if r["status"] == "error"]
    assert len(errors) == 1 and "127.0.0.1" in errors[0] and "***" in errors[0], errors
    # A rotated password and signature: the server now takes only those, and the job is the same.
    accepted.update(user=CANARY_USER, password=ROTATED_PASSWORD, sig=ROTATED_SIGNATURE)
    rotated = write_job(
        tmp_path,
        "rotated",
        model_dir,
        url(CANARY_USER, ROTATED_PASSWORD, ROTATED_SIGNATURE),
        str(out),
        **sections,
    )
    again = cli("submit", str(rotated))
    assert again.returncode == 0 and "already complete" in again.stderr, again.stderr
    missing = write_job(
        tmp_path,
        "missing",
        model_dir,
        url(CANARY_USER, ROTATED_PASSWORD, ROTATED_SIGNATURE, "absent.jsonl"),
        str(tmp_path / "out2"),
        **sections,
    )
    failed = cli("submit", str(missing))
    assert failed.returncode == 66, failed.stderr
    assert "absent.jsonl" in failed.stderr  # the error still names the file
    scan_outputs(survived, dry, crashed, resumed, again, failed)
    scan_tree(survived, out)


def test_s3_job_writes_and_prints_no_credential(
    tmp_path: Path, model_dir: Path, small_shards: Path, s3_bucket: Any, survived: Counter[str]
) -> None:
    import s3fs

    admin = s3fs.S3FileSystem(**s3_bucket.storage_options)
    for path in sorted(small_shards.glob("*.parquet")):
        admin.put_file(str(path), f"{s3_bucket.name}/in/{path.name}")
    for path in sorted(model_dir.iterdir()):
        admin.put_file(str(path), f"{s3_bucket.name}/model/{path.name}")
    # moto takes any credentials: the canaries are what s3fs signs every request with.
    options = {
        "key": CANARY_KEY,
        "secret": CANARY_SECRET,
        "token": CANARY_TOKEN,
        "client_kwargs": {"endpoint_url": s3_bucket.endpoint},
    }
    sections = {
        "input": {"storage_options": options},
        "output": {"storage_options": options},
        "model": {"storage_options": options},
    }
    cache = tmp_path / "model-cache"
    env = cli_env(SHARDINFER_MODEL_CACHE=str(cache))
    out_url = s3_bucket.url("out")
    job = write_job(tmp_path, "job", s3_bucket.url("model"), s3_bucket.url("in"), out_url, **sections)
    run = cli("submit", str(job), env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert len(committed_rows(out_url, s3_bucket.storage_options)) == 4
    status = cli("status", "--storage-options", json.dumps(options), out_url)
    assert status.returncode == 0 and ": done" in status.stdout, status.stderr
    missing = write_job(
        tmp_path, "missing", model_dir, s3_bucket.url("nothing-here"), s3_bucket.url("out2"), **sections
    )
    failed = cli("submit", str(missing))
    assert failed.returncode == 66, failed.stderr
    in_url = f"s3://{CANARY_KEY}:{CANARY_SECRET}@{s3_bucket.name}/in"
    in_url_job = write_job(
        tmp_path, "in-url", model_dir, in_url, s3_bucket.url("out3"), output={"storage_options": options}
    )
    refused = cli("submit", str(in_url_job))
    assert refused.returncode == 78 and "storage_options" in refused.stderr, refused.stderr
    scan_outputs(survived, run, status, failed, refused)
    admin.invalidate_cache()
    objects = admin.find(f"{s3_bucket.name}/out")
    assert any(o.endswith("_SUCCESS") for o in objects) and any("/_runs/" in o for o in objects)
    for key in objects:
        assert_clean(key, admin.cat_file(key))
    survived["canary files scanned"] += len(objects)
    assert scan_tree(survived, cache) >= 3  # the cached model and its manifest
