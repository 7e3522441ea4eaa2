"""A real S3 endpoint for tests and benchmarks: moto's server in a child process on 127.0.0.1.

    server = start_moto_server()               # or start_moto_server(enforce_auth=True)
    server.create_bucket("data")
    server.put_object("data", "a/part-0", b"...")
    fs_options = server.storage_options()     # endpoint_url, key, secret for s3fs / Store
    ...
    server.stop()

The server runs in its own process so its auth switch (process-wide in moto) and its load
never touch the process under test. `server.recording()` captures every request the server
sees (moto's request recorder), e.g. to count the GETs behind one read.

Tests import it by name (pytest puts tests/support on sys.path, pyproject.toml); scripts add
the folder tests/support to sys.path themselves. Never the repo root: its folder operator/
would shadow the standard library's `operator`.

Run it alone for manual tests and benchmarks: `python -P tests/support/s3server.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.cacheserver import launcher

# Seconds the child may take to import moto and bind its port (a loaded 2-core machine).
START_TIMEOUT = 60.0
REGION = "us-east-1"
# Keys of the account's admin user; with auth off moto accepts any key.
ADMIN_KEY = "AKIASTRATAADMIN00001"
ADMIN_SECRET = "strata-admin-secret"

_S3_ALL = json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
)
_ALL = json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
)


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    url: str
    headers: dict[str, str]

    @property
    def path(self) -> str:
        return urllib.parse.urlsplit(self.url).path

    @property
    def range(self) -> str | None:
        for name, value in self.headers.items():
            if name.lower() == "range":
                return value
        return None


@dataclass
class Recording:
    """Requests seen between entering and leaving `S3Server.recording()`."""

    requests: list[RecordedRequest] = field(default_factory=list)

    def matching(self, method: str, path_suffix: str = "") -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == method and r.path.endswith(path_suffix)]


@dataclass
class S3Server:
    endpoint_url: str
    child: launcher.Child
    recording_file: Path
    auth_enforced: bool = False
    admin_key: str = ADMIN_KEY
    admin_secret: str = ADMIN_SECRET
    _clients: dict[str, Any] = field(default_factory=dict, repr=False)

    # -- clients ------------------------------------------------------------------------------

    def client(self, service: str = "s3", *, key: str | None = None, secret: str | None = None) -> Any:
        """A boto3 client for this server (the admin user's keys unless given)."""
        import boto3
        from botocore.config import Config

        if key is None and secret is None and service in self._clients:
            return self._clients[service]
        made = boto3.client(
            service,
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=key or self.admin_key,
            aws_secret_access_key=secret or self.admin_secret,
            config=Config(retries={"total_max_attempts": 1}),
        )
        if key is None and secret is None:
            self._clients[service] = made
        return made

    def storage_options(self, *, key: str | None = None, secret: str | None = None) -> dict[str, str]:
        """Store options (strings, as a Mount carries them) that reach this server."""
        return {
            "endpoint_url": self.endpoint_url,
            "region": REGION,
            "key": key or self.admin_key,
            "secret": secret or self.admin_secret,
        }

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def put_object(self, bucket: str, key: str, data: bytes) -> str:
        """Write an object; returns its ETag."""
        return str(self.client().put_object(Bucket=bucket, Key=key, Body=data)["ETag"])

    def get_object(self, bucket: str, key: str) -> bytes:
        return bytes(self.client().get_object(Bucket=bucket, Key=key)["Body"].read())

    def create_user(self, name: str, *, allow_s3: bool = True) -> tuple[str, str]:
        """An IAM user with an access key (and, with `allow_s3`, a policy granting s3:*).
        Returns (key, secret). Only enforced-auth servers care about users."""
        iam = self.client("iam")
        iam.create_user(UserName=name)
        if allow_s3:
            iam.put_user_policy(UserName=name, PolicyName="s3-all", PolicyDocument=_S3_ALL)
        created = iam.create_access_key(UserName=name)["AccessKey"]
        return str(created["AccessKeyId"]), str(created["SecretAccessKey"])

    # -- moto's control API -------------------------------------------------------------------

    def _moto_api(self, path: str, data: bytes | None = b"") -> bytes:
        request = urllib.request.Request(
            f"{self.endpoint_url}/moto-api/{path}",
            data=data,
            method="POST" if data is not None else "GET",
            # Not form-encoded: moto reads the raw body (e.g. the auth count).
            headers={"Content-Type": "application/octet-stream"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return bytes(response.read())

    def enforce_auth(self) -> None:
        """From now on every request must be signed by a known user allowed to do it."""
        self._moto_api("reset-auth", b"0")
        self.auth_enforced = True
        self._clients.clear()

    def reset(self) -> None:
        """Forget all buckets, objects and users (auth is switched off again)."""
        self._moto_api("reset")
        self._moto_api("reset-auth", str(float("inf")).encode())
        self.auth_enforced = False

    @contextmanager
    def recording(self) -> Iterator[Recording]:
        """Record the requests the server receives inside the `with` block."""
        result = Recording()
        self._moto_api("recorder/reset-recording")
        self._moto_api("recorder/start-recording")
        try:
            yield result
        finally:
            self._moto_api("recorder/stop-recording")
            text = self._moto_api("recorder/download-recording", data=None).decode()
            for line in text.splitlines():
                entry = json.loads(line)
                result.requests.append(
                    RecordedRequest(method=entry["method"], url=entry["url"], headers=dict(entry["headers"]))
                )

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.child.process

    def stop(self) -> None:
        self.child.stop()
        self.recording_file.unlink(missing_ok=True)
        self.child.log.unlink(missing_ok=True)


def start_moto_server(*, enforce_auth: bool = False) -> S3Server:
    """Start moto's S3 (and IAM) server on 127.0.0.1 with a free port.

    With `enforce_auth` the server refuses unsigned requests, unknown keys, wrong secrets and
    users without permission, like AWS; the admin user (`S3Server.admin_key`) may do anything.
    """
    fd, recording = tempfile.mkstemp(prefix="strata-moto-", suffix=".jsonl")
    os.close(fd)
    env = {
        **os.environ,
        "MOTO_RECORDER_FILEPATH": recording,
        "PYTHONSAFEPATH": "1",
    }
    child = launcher.start("moto server", [sys.executable, "-P", str(Path(__file__).resolve()), "--child"],
                           Path(recording).with_suffix(".log"), env=env, stdout_pipe=True)
    try:
        port = child.read_port(START_TIMEOUT)
    except launcher.LaunchError:
        Path(recording).unlink(missing_ok=True)
        raise
    server = S3Server(endpoint_url=f"http://127.0.0.1:{port}", child=child, recording_file=Path(recording))
    if enforce_auth:
        # The admin user must exist before auth is on: creating it is itself a request.
        iam = server.client("iam")
        iam.create_user(UserName="strata-admin")
        iam.put_user_policy(UserName="strata-admin", PolicyName="all", PolicyDocument=_ALL)
        created = iam.create_access_key(UserName="strata-admin")["AccessKey"]
        server.admin_key = str(created["AccessKeyId"])
        server.admin_secret = str(created["SecretAccessKey"])
        server.enforce_auth()
    return server


def _serve() -> None:
    """The child: serve moto on a free loopback port and print it."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    httpd = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    print(f"PORT {httpd.server_port}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        _serve()
    else:
        server = start_moto_server()
        print(f"S3 endpoint: {server.endpoint_url} (Ctrl-C stops it)", flush=True)
        try:
            server.process.wait()
        except KeyboardInterrupt:
            server.stop()
