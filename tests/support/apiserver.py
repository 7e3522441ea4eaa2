"""A local HTTP server on 127.0.0.1 that answers like the Kubernetes API server for the paths a
test sets: it records each request (method, path, query, content type, credential, JSON body)
and answers with the status and JSON the test gave for (method, path), else 200 with the
request's own body (what a server-side apply of it gives back). Tests of the Kubernetes client
modules go through the real client library to it."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    auth: str | None
    body: Any


@dataclass
class ApiServer:
    url: str = ""
    requests: list[Request] = field(default_factory=list)
    answers: dict[tuple[str, str], tuple[int, Obj]] = field(default_factory=dict)
    # Set to hold every answer until released (a server that does not answer in time).
    hold: threading.Event | None = None

    def answer(self, method: str, path: str, status: int, body: Obj) -> None:
        self.answers[(method, path)] = (status, body)


@contextmanager
def api_server() -> Iterator[ApiServer]:
    seen = ApiServer()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            path, _, query = self.path.partition("?")
            seen.requests.append(Request(self.command, path, dict(urllib.parse.parse_qsl(query)),
                                         self.headers.get("Content-Type"), self.headers.get("Authorization"), body))
            if seen.hold is not None:
                seen.hold.wait(10)
            status, payload = seen.answers.get((self.command, path), (200, body or {}))
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = _answer  # noqa: N815

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    seen.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        if seen.hold is not None:
            seen.hold.set()
        server.shutdown()
        server.server_close()


def kubeconfig(server: str, token: str) -> Obj:
    """A kubeconfig of one cluster at `server` and a user with a bearer token."""
    return {"apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": server}}],
            "users": [{"name": "test", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}]}
