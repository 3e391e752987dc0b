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

import base64
import http.server
import json
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from pipeline_kit import _toml, cli, cli_env, committed_rows, job_toml, write_shards

_TAG = uuid.uuid4().hex[:10]
CANARY_KEY = f"AKIACANARY{_TAG.upper()}"
CANARY_SECRET = f"canary-secret-{_TAG}"
CANARY_TOKEN = f"canary-token-{_TAG}"
CANARY_USER = f"canaryuser{_TAG}"
CANARY_PASSWORD = f"canary-pass-{_TAG}"
CANARY_SIGNATURE = f"canarysig{_TAG}"
ROTATED = {"key": f"AKIAROTATED{_TAG.upper()}", "secret": f"rotated-secret-{_TAG}"}
ROTATED_PASSWORD = f"rotated-pass-{_TAG}"
ROTATED_SIGNATURE = f"rotatedsig{_TAG}"
CANARIES = (CANARY_KEY, CANARY_SECRET, CANARY_TOKEN, CANARY_USER, CANARY_PASSWORD, CANARY_SIGNATURE)
CANARIES += (*ROTATED.values(), ROTATED_PASSWORD, ROTATED_SIGNATURE)


# The canaries are letters, digits and dashes: percent-encoding leaves them as they are. The
# Basic credentials are also looked for as an Authorization header carries them.
_BASIC = base64.b64encode(f"{CANARY_USER}:{CANARY_PASSWORD}".encode()).decode()


def _assert_clean(what: str, data: bytes | str) -> None:
    raw = data if isinstance(data, bytes) else data.encode()
    for canary in (*CANARIES, _BASIC):
        assert canary.encode() not in raw, f"{what} holds the credential {canary!r}"


def _scan_outputs(survived: Counter[str], *results: Any) -> None:
    for result in results:
        _assert_clean(f"stdout of {result.args[3:]}", result.stdout)
        _assert_clean(f"stderr of {result.args[3:]}", result.stderr)
        survived["canary outputs scanned"] += 2


def _scan_tree(survived: Counter[str], root: Path) -> int:
    files = [p for p in root.rglob("*") if p.is_file()]
    for path in files:
        _assert_clean(str(path), path.read_bytes())
    survived["canary files scanned"] += len(files)
    return len(files)


def _job(
    tmp_path: Path, name: str, model_path: Path | str, input_path: str, output_path: str, **sections: Any
) -> Path:
    model_section = sections.pop("model", {})  # job_toml's own `model` argument is the path
    text = job_toml(model_path, input_path, output_path, **sections)
    for key, value in model_section.items():
        text = text.replace("[model]\n", f"[model]\n{key} = {_toml(value)}\n", 1)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


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
    job = _job(tmp_path, "job", model_dir, str(small_shards), str(out), **sections)
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
        "submit", str(_job(tmp_path, "rotated", model_dir, str(small_shards), str(out), **sections_rotated))
    )
    assert again.returncode == 0 and "already complete" in again.stderr, again.stderr
    _scan_outputs(survived, dry, run, status, history, again)
    assert _scan_tree(survived, out) >= 8  # _job.json, _SUCCESS, markers, parts, run record, timeline


class _CredentialedFiles(http.server.BaseHTTPRequestHandler):
    """Serves one folder (byte ranges included) only to requests carrying the expected Basic
    credentials and `sig` parameter; `accepted` holds them and may be changed (a rotation)."""

    root: Path
    accepted: dict[str, str]

    def log_message(self, *args: Any) -> None:
        pass

    def _body(self) -> bytes | None:
        expected = base64.b64encode(f"{self.accepted['user']}:{self.accepted['password']}".encode()).decode()
        url = urlsplit(self.path)
        if self.headers.get("Authorization") != f"Basic {expected}" or parse_qs(url.query).get("sig") != [
            self.accepted["sig"]
        ]:
            self.send_error(401)
            return None
        path = self.root / url.path.lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return None
        data = path.read_bytes()
        wanted = self.headers.get("Range")
        if wanted and wanted.startswith("bytes="):
            start_text, _, end_text = wanted[6:].partition("-")
            start, end = int(start_text), min(int(end_text or len(data) - 1), len(data) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            data = data[start : end + 1]
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return data

    def do_HEAD(self) -> None:
        self._body()

    def do_GET(self) -> None:
        data = self._body()
        if data is not None:
            self.wfile.write(data)


@pytest.fixture
def http_files(tmp_path: Path) -> Iterator[tuple[Path, int, dict[str, str]]]:
    import threading

    root = tmp_path / "served"
    root.mkdir()
    accepted = {"user": CANARY_USER, "password": CANARY_PASSWORD, "sig": CANARY_SIGNATURE}
    handler = type("Handler", (_CredentialedFiles,), {"root": root, "accepted": accepted})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, int(server.server_address[1]), accepted
    finally:
        server.shutdown()
        server.server_close()


def test_http_credentials_are_used_but_never_written(
    tmp_path: Path, model_dir: Path, http_files: tuple[Path, int, dict[str, str]], survived: Counter[str]
) -> None:
    root, port, accepted = http_files
    lines = [json.dumps({"id": f"h{i}", "prompt": f"fox engine {i}", "topic": "t"}) for i in range(6)]
    lines[3] = '{"id": "h3", "prompt": '  # not JSON: an error record whose message names the file
    (root / "prompts.jsonl").write_text("\n".join(lines) + "\n")

    def url(user: str, password: str, sig: str, name: str = "prompts.jsonl") -> str:
        return f"http://{user}:{password}@127.0.0.1:{port}/{name}?sig={sig}"

    out = tmp_path / "out"
    # A signed URL ends in its query, not in .jsonl: the format is named.
    sections = {"job": {"split_rows": 2, "max_error_fraction": 0.5}, "input": {"format": "jsonl"}}
    job = _job(
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
    rotated = _job(
        tmp_path,
        "rotated",
        model_dir,
        url(CANARY_USER, ROTATED_PASSWORD, ROTATED_SIGNATURE),
        str(out),
        **sections,
    )
    again = cli("submit", str(rotated))
    assert again.returncode == 0 and "already complete" in again.stderr, again.stderr
    missing = _job(
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
    _scan_outputs(survived, dry, crashed, resumed, again, failed)
    _scan_tree(survived, out)


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
    job = _job(tmp_path, "job", s3_bucket.url("model"), s3_bucket.url("in"), out_url, **sections)
    run = cli("submit", str(job), env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert len(committed_rows(out_url, s3_bucket.storage_options)) == 4
    status = cli("status", "--storage-options", json.dumps(options), out_url)
    assert status.returncode == 0 and ": done" in status.stdout, status.stderr
    missing = _job(
        tmp_path, "missing", model_dir, s3_bucket.url("nothing-here"), s3_bucket.url("out2"), **sections
    )
    failed = cli("submit", str(missing))
    assert failed.returncode == 66, failed.stderr
    in_url = f"s3://{CANARY_KEY}:{CANARY_SECRET}@{s3_bucket.name}/in"
    in_url_job = _job(
        tmp_path, "in-url", model_dir, in_url, s3_bucket.url("out3"), output={"storage_options": options}
    )
    refused = cli("submit", str(in_url_job))
    assert refused.returncode == 78 and "storage_options" in refused.stderr, refused.stderr
    _scan_outputs(survived, run, status, failed, refused)
    admin.invalidate_cache()
    objects = admin.find(f"{s3_bucket.name}/out")
    assert any(o.endswith("_SUCCESS") for o in objects) and any("/_runs/" in o for o in objects)
    for key in objects:
        _assert_clean(key, admin.cat_file(key))
    survived["canary files scanned"] += len(objects)
    assert _scan_tree(survived, cache) >= 3  # the cached model and its manifest
