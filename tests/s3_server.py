"""A real S3 HTTP API for tests: moto's ThreadedMotoServer on 127.0.0.1, plus a fault-injecting proxy.

Fixtures (registered for every test through tests/conftest.py):
  moto_endpoint      session-wide moto server, "http://127.0.0.1:<free port>"
  s3_bucket          a fresh, empty bucket on it (the server is reset before each test); returns
                     an `S3Bucket` with `.name`, `.url(key)` and `.storage_options`
  fault_proxy        factory: `fault_proxy(every=3, faults=("503", "drop"))` starts a proxy in
                     front of moto and returns it; its `.storage_options` points s3fs at it

The proxy speaks just enough HTTP/1.1 to relay one request at a time per connection. About one
request in `every` (drawn from a seeded generator, so a run is repeatable) gets the next fault
of `faults`, in turn:
  "503"        a SlowDown error response (throttling); moto never sees the request
  "500"        an InternalError response; moto never sees the request
  "drop"       the connection is closed before the request is forwarded
  "drop_after" the request is forwarded and applied by moto, then the connection is closed
               without the response (the client cannot tell whether its write happened)
`every=0` turns periodic faults off; `proxy.fail_next("drop_after")` aims one at the next request.
`proxy.ignore_conditions()` makes the endpoint behave like an S3-compatible store that ignores
conditional writes: `If-None-Match` is dropped from every request before moto sees it.
"""

from __future__ import annotations

import http.client
import itertools
import logging
import random
import socket
import socketserver
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

BUCKET = "shardinfer-test"
_CREDENTIALS = {"key": "testing", "secret": "testing"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def s3_options(endpoint: str, **client: Any) -> dict[str, Any]:
    """s3fs storage options for an endpoint (fsspec caches one client per distinct option set)."""
    return {
        **_CREDENTIALS,
        "client_kwargs": {"endpoint_url": endpoint, **client},
    }


@dataclass
class S3Bucket:
    name: str
    endpoint: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    def url(self, key: str = "") -> str:
        return f"s3://{self.name}/{key}".rstrip("/")

    def put_folder(self, local: Path, key: str) -> str:
        """Upload the files directly in `local` (a model folder) under `key`; its URL."""
        import s3fs

        fs = s3fs.S3FileSystem(**self.storage_options)
        for path in sorted(local.iterdir()):
            if path.is_file():
                fs.put_file(str(path), f"{self.name}/{key}/{path.name}")
        return self.url(key)


class _ProxyHandler(socketserver.StreamRequestHandler):
    server: _ProxyServer

    def handle(self) -> None:
        while True:
            head = self._read_head()
            if head is None:
                return
            request_line, headers = head
            method, target, _ = request_line.split(" ", 2)
            body = self._read_body(headers)
            fault = self.server.next_fault(method, target)
            if fault == "drop":
                return
            if fault in ("503", "500", "403"):
                self._send_error(int(fault), method)
                continue
            status, reason, out_headers, payload = self._forward(method, target, headers, body)
            if fault == "drop_after":
                return  # moto applied the request; the client never hears back
            self._send(status, reason, out_headers, payload, method)

    def _read_head(self) -> tuple[str, list[tuple[str, str]]] | None:
        line = self.rfile.readline()
        if not line:
            return None
        headers = []
        while True:
            h = self.rfile.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            name, _, value = h.decode("latin-1").partition(":")
            headers.append((name.strip(), value.strip()))
        return line.decode("latin-1").strip(), headers

    def _read_body(self, headers: list[tuple[str, str]]) -> bytes:
        lookup = {k.lower(): v for k, v in headers}
        if lookup.get("expect", "").lower() == "100-continue":
            # botocore sends PutObject bodies only after this interim response.
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.wfile.flush()
        if lookup.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(lookup.get("content-length", "0") or 0))

    def _forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=30)
        try:
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                if name.lower() in ("transfer-encoding", "content-length", "connection", "expect"):
                    continue
                if name.lower() in self.server.dropped_headers:
                    continue
                conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            response = conn.getresponse()
            payload = response.read()
            return response.status, response.reason, list(response.getheaders()), payload
        finally:
            conn.close()

    def _send(
        self, status: int, reason: str, headers: list[tuple[str, str]], payload: bytes, method: str
    ) -> None:
        lines = [f"HTTP/1.1 {status} {reason}"]
        for name, value in headers:
            if name.lower() in ("transfer-encoding", "connection", "content-length"):
                continue
            lines.append(f"{name}: {value}")
        if method == "HEAD":
            length = dict((k.lower(), v) for k, v in headers).get("content-length", "0")
            lines.append(f"Content-Length: {length}")
            payload = b""
        else:
            lines.append(f"Content-Length: {len(payload)}")
        self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)
        self.wfile.flush()

    def _send_error(self, status: int, method: str) -> None:
        code, reason = {
            503: ("SlowDown", "Slow Down"),
            403: ("AccessDenied", "Forbidden"),  # what a store answers a wrong key or secret
        }.get(status, ("InternalError", "Internal Server Error"))
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
            f"<Message>injected by the test proxy</Message></Error>"
        ).encode()
        headers = [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))]
        self._send(status, reason, headers, body, method)


class _ProxyServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream_port: int, every: int, faults: tuple[str, ...], seed: int) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.upstream_port = upstream_port
        self.every = every
        self._faults = itertools.cycle(faults)
        # Seeded, not strictly periodic: an operation that always takes `every` requests would
        # otherwise meet a fault at the same step on every retry.
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self.requests: list[tuple[str, str, str | None]] = []  # (method, target, fault or None)
        self.enabled = True
        self.forced: list[str] = []  # faults for the next requests, before the periodic ones
        self.dropped_headers: set[str] = set()  # lower-case names never forwarded to moto

    def next_fault(self, method: str, target: str) -> str | None:
        with self._lock:
            if self.forced:
                fault: str | None = self.forced.pop(0)
            elif self.enabled and self.every and self._random.random() < 1 / self.every:
                fault = next(self._faults)
            else:
                fault = None
            self.requests.append((method, target, fault))
            return fault


class FaultProxy:
    """A running proxy; stop() is called by the fixture."""

    def __init__(self, upstream: str, every: int, faults: tuple[str, ...], seed: int = 0) -> None:
        for fault in faults:
            if fault not in ("503", "500", "403", "drop", "drop_after"):
                raise ValueError(f"unknown fault {fault!r}")
        port = int(upstream.rsplit(":", 1)[1])
        self._server = _ProxyServer(port, every, faults, seed)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    @property
    def requests(self) -> list[tuple[str, str, str | None]]:
        return self._server.requests

    @property
    def faults_injected(self) -> list[str]:
        return [f for _, _, f in self._server.requests if f]

    def set_enabled(self, enabled: bool) -> None:
        """Turn the periodic faults on or off (forced ones still apply)."""
        self._server.enabled = enabled

    def fail_next(self, *faults: str) -> None:
        """Give the next len(faults) requests these faults, in order."""
        with self._server._lock:
            self._server.forced.extend(faults)

    def ignore_conditions(self) -> None:
        """From now on, forward writes without their `If-None-Match` condition."""
        self._server.dropped_headers.add("if-none-match")

    def storage_options(self, **client: Any) -> dict[str, Any]:
        return s3_options(self.endpoint, **client)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(moto_endpoint: str) -> S3Bucket:
    import s3fs

    request = urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=10):
        pass
    options = s3_options(moto_endpoint)
    s3fs.S3FileSystem(**options).mkdir(BUCKET)
    return S3Bucket(BUCKET, moto_endpoint, options)


@pytest.fixture
def fault_proxy(moto_endpoint: str) -> Iterator[Any]:
    started: list[FaultProxy] = []

    def start(every: int = 3, faults: tuple[str, ...] = ("503",), seed: int = 0) -> FaultProxy:
        proxy = FaultProxy(moto_endpoint, every, faults, seed)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()
