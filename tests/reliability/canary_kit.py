"""Shared by the canary credential tests: the canaries, the scans, a job file, and an HTTP
server that serves files only to requests carrying the canary credentials."""

from __future__ import annotations

import base64
import http.server
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pipeline_kit import _toml, job_toml

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


def assert_clean(what: str, data: bytes | str) -> None:
    raw = data if isinstance(data, bytes) else data.encode()
    for canary in (*CANARIES, _BASIC):
        assert canary.encode() not in raw, f"{what} holds the credential {canary!r}"


def scan_outputs(survived: Counter[str], *results: Any) -> None:
    for result in results:
        assert_clean(f"stdout of {result.args[3:]}", result.stdout)
        assert_clean(f"stderr of {result.args[3:]}", result.stderr)
        survived["canary outputs scanned"] += 2


def scan_tree(survived: Counter[str], root: Path) -> int:
    files = [p for p in root.rglob("*") if p.is_file()]
    for path in files:
        assert_clean(str(path), path.read_bytes())
    survived["canary files scanned"] += len(files)
    return len(files)


def write_job(
    tmp_path: Path, name: str, model_path: Path | str, input_path: str, output_path: str, **sections: Any
) -> Path:
    model_section = sections.pop("model", {})  # job_toml's own `model` argument is the path
    text = job_toml(model_path, input_path, output_path, **sections)
    for key, value in model_section.items():
        text = text.replace("[model]\n", f"[model]\n{key} = {_toml(value)}\n", 1)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


class CredentialedFiles(http.server.BaseHTTPRequestHandler):
    """Serves one folder (byte ranges included) only to requests carrying the expected Basic
    credentials and `sig` parameter (and `X-Api-Key` header, once `accepted` names an `api_key`);
    `accepted` holds them and may be changed (a rotation)."""

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
        if "api_key" in self.accepted and self.headers.get("X-Api-Key") != self.accepted["api_key"]:
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


@contextmanager
def serve_credentialed(root: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """Serve `root` on 127.0.0.1 to the canary credentials: (port, the accepted credentials)."""
    accepted = {"user": CANARY_USER, "password": CANARY_PASSWORD, "sig": CANARY_SIGNATURE}
    handler = type("Handler", (CredentialedFiles,), {"root": root, "accepted": accepted})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1]), accepted
    finally:
        server.shutdown()
        server.server_close()


def jsonl_with_a_bad_line(root: Path, rows: int = 6) -> None:
    """`prompts.jsonl` with `rows` lines, the fourth not JSON: an error record naming the file."""
    lines = [f'{{"id": "h{i}", "prompt": "fox engine {i}", "topic": "t"}}' for i in range(rows)]
    lines[3] = '{"id": "h3", "prompt": '
    (root / "prompts.jsonl").write_text("\n".join(lines) + "\n")


def signed_url(port: int, user: str, password: str, sig: str, name: str = "prompts.jsonl") -> str:
    return f"http://{user}:{password}@127.0.0.1:{port}/{name}?sig={sig}"
