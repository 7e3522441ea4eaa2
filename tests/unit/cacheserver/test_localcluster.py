"""`strata local up/down/status` without the CLI: what `up` refuses before it starts anything
(a cluster already running, ports in use, a bad tier), what it does when a server does not
come up, the cluster's token, and how `down` and `status` treat the processes and MEM tier
folders recorded in the state file. Real parts throughout (sockets, an HTTP server, processes
in sessions of their own, files under a STRATA_HOME of the test's), except where noted."""

from __future__ import annotations

import hashlib
import http.server
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from strata.cacheserver import launcher, localcluster
from strata.cacheserver.client import localstate
from strata.contract import constants
from strata.contract.errors import FailedPrecondition, StrataError, Unavailable


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(constants.ENV_HOME, str(tmp_path / "home"))
    return tmp_path / "home"


def free_port(count: int = 1) -> int:
    """The first of `count` consecutive ports free now."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if all(localcluster.port_free("127.0.0.1", p) for p in range(port, port + count)):
            return port


@pytest.fixture
def healthy_http() -> Iterator[int]:
    """An HTTP server answering 200 on every path: a master's /healthz, as `up` asks it."""
    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_a_port_in_use_is_not_free() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        assert not localcluster.port_free("127.0.0.1", held.getsockname()[1])
    assert localcluster.port_free("127.0.0.1", free_port())


def test_up_refuses_while_a_cluster_answers(healthy_http: int) -> None:
    localstate.write_state(localstate.LocalState(master="127.0.0.1:19998", master_http=healthy_http))
    with pytest.raises(FailedPrecondition, match=r"already running \(master 127.0.0.1:19998\).*strata local down"):
        localcluster.up(localcluster.LocalClusterSpec())


def test_up_names_the_ports_in_use_and_starts_nothing(home: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        spec = localcluster.LocalClusterSpec(master_port=port, worker_port=free_port())
        with pytest.raises(FailedPrecondition, match=rf"ports \[[0-9, ]*\b{port}\b[0-9, ]*\] on 127.0.0.1 are in use.*--master-port"):
            localcluster.up(spec)
    assert localstate.read_state() is None
    assert not (home / "local" / "logs").exists()  # no server was started


def test_disk_tiers_add_their_sizes_and_give_each_worker_a_folder(tmp_path: Path) -> None:
    tier = localcluster._disk_tier("SSD", (f"{tmp_path}/a:1Gi", f"{tmp_path}/b:512Mi"), 2)
    assert tier == {"medium": "SSD", "quota": (1 << 30) + (512 << 20),
                    "dirs": [str(tmp_path / "a" / "worker-2"), str(tmp_path / "b" / "worker-2")]}
    assert localcluster._disk_tier("HDD", (), 0) is None


@pytest.mark.parametrize("bad", ["/mnt/nvme", ":10Gi", "10Gi"])
def test_a_disk_tier_without_folder_and_size_is_refused_with_an_example(bad: str) -> None:
    with pytest.raises(StrataError, match=rf"--ssd '{bad}': write DIR:SIZE, e.g. "):
        localcluster._disk_tier("SSD", (bad,), 0)


def test_the_token_of_an_earlier_cluster_is_kept_owner_only(tmp_path: Path) -> None:
    token = tmp_path / "token"
    localcluster._keep_or_make_token(token)
    made = token.read_text()
    assert made.strip() and stat.S_IMODE(token.stat().st_mode) == 0o600
    token.chmod(0o644)
    localcluster._keep_or_make_token(token)
    assert token.read_text() == made and stat.S_IMODE(token.stat().st_mode) == 0o600
    token.write_text("\n")  # empty: a new one
    localcluster._keep_or_make_token(token)
    assert token.read_text().strip() and token.read_text() != made


def test_a_token_file_that_is_a_link_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("someone else's\n")
    (tmp_path / "token").symlink_to(target)
    with pytest.raises(OSError):
        localcluster._keep_or_make_token(tmp_path / "token")
    assert target.read_text() == "someone else's\n"


def test_a_master_that_does_not_come_up_fails_up_and_is_stopped(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real master process with a block size it refuses: `up` says so and leaves no state."""
    monkeypatch.setattr(localcluster, "STARTUP_TIMEOUT", 30.0)
    spec = localcluster.LocalClusterSpec(block_size="lots", master_port=free_port(2),
                                         worker_port=free_port(localcluster.WORKER_PORTS))
    with pytest.raises(Unavailable, match="master"):
        localcluster.up(spec)
    assert localstate.read_state() is None
    tokens = list((home / "local").glob("*token*"))
    assert tokens and all(stat.S_IMODE(t.stat().st_mode) == 0o600 for t in tokens)
    assert "lots" in (home / "local" / "logs" / "master.log").read_text()


def sleeper(log: Path) -> launcher.Child:
    return launcher.start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], log)


def test_status_and_down_of_the_recorded_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`written_blocks_in` (the cache's sidecar format, tested with the cache) stands in here
    for a MEM tier folder that holds the only copy of written blocks."""
    assert localcluster.status() is None
    assert localcluster.down() == localcluster.Stopped([], [])
    live = sleeper(tmp_path / "live.log")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    localstate.write_state(localstate.LocalState(master="127.0.0.1:1", master_http=1,
                                                 pids={"master": live.pid, "worker-0": gone.pid}))
    assert localcluster.status() == {"master": True, "worker-0": False}

    tag = hashlib.sha256(str(localstate.local_dir().resolve()).encode()).hexdigest()[:8]
    shm = Path("/dev/shm")
    empty, holding, other = shm / f"strata-{tag}-worker-0", shm / f"strata-{tag}-worker-1", shm / "strata-other-worker-0"
    try:
        for folder in (empty, holding, other):
            folder.mkdir(exist_ok=True)
            (folder / "block").write_bytes(b"x")
        monkeypatch.setattr(localcluster, "written_blocks_in", lambda folder: 1 if folder == holding else 0)
        stopped = localcluster.down()
        assert stopped == localcluster.Stopped(["master"], [holding])
        assert not empty.exists() and holding.exists() and other.exists()
        deadline = time.monotonic() + 10
        while live.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert live.process.poll() is not None
        assert localstate.read_state() is None and localcluster.status() is None
    finally:
        live.process.kill()
        live.process.wait()
        for folder in (empty, holding, other):
            subprocess.run(["rm", "-rf", str(folder)], check=False)
