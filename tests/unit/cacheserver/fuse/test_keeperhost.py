"""The FUSE holder's protocol: what it refuses (and says why), the keepers it starts and
reaps, what a client hears when no holder listens; and the keeper's tolerant hello."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from waiting import wait_until

from strata.contract.errors import Unavailable
from strata.cacheserver.fuse import keeperhost, mountkeeper, settings


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "s"  # short: a Unix socket's path is at most 107 bytes
    folder.mkdir()
    monkeypatch.setenv(settings.STATE_DIR_ENV, str(folder))
    return folder


@pytest.fixture
def running(root: Path) -> Iterator[keeperhost.Holder]:
    h = keeperhost.Holder(root / keeperhost.SOCKET, root)
    h.listen()
    stop = threading.Event()
    thread = threading.Thread(target=h.serve, args=(stop,), daemon=True)
    thread.start()
    yield h
    stop.set()
    thread.join(timeout=10)
    h.close()


def ask(h: keeperhost.Holder, payload: bytes, fds: list[int] | None = None) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(h.path))
        if fds:
            socket.send_fds(sock, [payload], fds)
        else:
            sock.sendall(payload)
        line, _ = keeperhost.read_line(sock)
    reply = json.loads(line)
    assert isinstance(reply, dict)
    return reply


def request(root: Path, **changes: object) -> bytes:
    value = {"version": 1, "mountpoint": "/mnt/x", "state": str(root / "abc"), "resume_timeout": 5, **changes}
    return json.dumps(value).encode() + b"\n"


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_socket_is_for_root_only_and_answers_a_probe(running: keeperhost.Holder) -> None:
    assert running.path.stat().st_mode & 0o777 == 0o600
    keeperhost.wait_ready(running.path, wait=5)


@pytest.mark.parametrize(("payload", "error"), [
    (b"{not json\n", "not a JSON request"),
    (b"[1, 2]\n", "not a JSON object"),
    (b"x" * (keeperhost.MAX_MESSAGE + 10), f"longer than {keeperhost.MAX_MESSAGE} bytes"),
])
def test_a_bad_or_oversized_request_is_refused(running: keeperhost.Holder, payload: bytes, error: str) -> None:
    reply = ask(running, payload)
    assert error in str(reply["error"]), reply
    keeperhost.wait_ready(running.path, wait=5)  # and the holder serves on


def test_a_request_must_name_its_mount_and_a_state_folder_of_the_holder(running: keeperhost.Holder, root: Path) -> None:
    r, w = os.pipe()
    try:
        assert "mountpoint must be an absolute path" in str(ask(running, request(root, mountpoint="x"), [r])["error"])
        assert "not a folder of this holder's state root" in str(
            ask(running, request(root, state="/etc"), [r])["error"])
        assert "not a folder of this holder's state root" in str(
            ask(running, request(root, state=str(root / "a" / ".." / ".." / "b")), [r])["error"])
        assert "resume_timeout must be seconds" in str(ask(running, request(root, resume_timeout="5"), [r])["error"])
    finally:
        os.close(r)
        os.close(w)


def test_a_request_without_its_descriptor_or_with_another_one_is_refused(running: keeperhost.Holder, root: Path) -> None:
    assert "came with 0 descriptors" in str(ask(running, request(root))["error"])
    r, w = os.pipe()
    try:
        assert "is not /dev/fuse" in str(ask(running, request(root), [r])["error"])
    finally:
        os.close(r)
        os.close(w)
    assert not running.keepers


def test_keepers_are_started_and_reaped(running: keeperhost.Holder, root: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keeperhost, "is_fuse_device", lambda fd: True)
    state = root / "k1"
    state.mkdir()
    r, w = os.pipe()
    try:
        # Nothing is mounted at the mount point: the keeper starts, listens, then ends at once.
        pid = keeperhost.start_keeper(running.path, r, state, tmp_path / "not-mounted", 5.0, wait=5)
    finally:
        os.close(r)
        os.close(w)
    assert pid > 0
    deadline = time.monotonic() + 30
    while (pid in running.keepers or alive(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid not in running.keepers and not alive(pid), "the ended keeper was not reaped (a zombie)"
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_a_client_says_which_holder_socket_is_not_reachable(root: Path) -> None:
    missing = root / "nobody.sock"
    started = time.monotonic()
    with pytest.raises(Unavailable) as exc:
        keeperhost.start_keeper(missing, 0, root / "x", Path("/mnt/x"), 5.0, wait=1.0)
    assert 1.0 <= time.monotonic() - started < 5
    assert str(missing) in str(exc.value) and settings.HOLDER_ENV in str(exc.value)


@pytest.fixture
def listening(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[mountkeeper.Keeper, socket.socket]]:
    """A keeper of a stand-in descriptor (a pipe) whose mount is there, and a client connected
    to its socket; the test calls `_accept` itself."""
    r, w = os.pipe()
    k = mountkeeper.Keeper(r, tmp_path, tmp_path / "m", 60)
    k.device = "0:99"
    monkeypatch.setattr(mountkeeper, "find_mount", lambda path: SimpleNamespace(device="0:99"))
    k.listen()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(tmp_path / mountkeeper.SOCKET))
            yield k, sock
    finally:
        if k.server is not None:
            k.server.close()
        k.listener.close()
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("hello", [
    {"pid": 4242, "resume_timeout": 7},  # a server of the first images: no version
    {"version": 9, "pid": 4242, "resume_timeout": 7, "later": {"field": [1]}},  # of a newer image
])
def test_the_keeper_hands_over_to_a_hello_of_any_version(
        listening: tuple[mountkeeper.Keeper, socket.socket], hello: dict[str, object]) -> None:
    k, sock = listening
    sock.sendall(json.dumps(hello).encode() + b"\n")
    assert k._accept(select.poll())
    message, fds, _, _ = socket.recv_fds(sock, 1024, 1)
    for fd in fds:
        os.close(fd)
    assert json.loads(message) == {"ok": True} and len(fds) == 1
    assert k.server_pid == 4242 and k.resume_timeout == 7


def test_the_keeper_refuses_a_hello_that_is_no_object(listening: tuple[mountkeeper.Keeper, socket.socket]) -> None:
    k, sock = listening
    sock.sendall(b"[1]\n")
    assert k._accept(select.poll())
    assert sock.recv(100) == b""  # closed without a descriptor
    assert k.server is None


# -- the keeper's deadlines while a server is attached ---------------------------------------------

@pytest.fixture
def ended(listening: tuple[mountkeeper.Keeper, socket.socket], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the keeper ended and unmounted (the stand-in connection is no kernel's)."""
    k, _ = listening
    k.fd = os.dup(k.fd)  # the keeper closes its own when it ends the connection
    calls: list[str] = []
    monkeypatch.setattr(mountkeeper.kernel, "abort", lambda device: calls.append(f"abort {device}") or True)
    monkeypatch.setattr(mountkeeper, "unmount", lambda path, lazy=False: calls.append(f"unmount {path}"))
    return calls


def attach_as_server(k: mountkeeper.Keeper, sock: socket.socket, poller: select.poll, **hello: object) -> None:
    sock.sendall(json.dumps({"version": 1, "pid": 4242, "resume_timeout": 60, **hello}).encode() + b"\n")
    assert k._accept(poller)
    _, fds, _, _ = socket.recv_fds(sock, 1024, 1)
    for fd in fds:
        os.close(fd)


def test_a_successor_that_attaches_but_never_serves_keeps_the_readers_deadline(
        listening: tuple[mountkeeper.Keeper, socket.socket]) -> None:
    k, sock = listening
    deadline = k.deadline
    poller = select.poll()
    attach_as_server(k, sock, poller)
    assert k.unserved() and k.deadline == deadline  # attached is not serving
    sock.sendall(b"serving\n")
    k._from_server(poller)
    assert not k.unserved() and k.deadline is None


def test_a_server_of_the_first_images_is_served_once_attached(listening: tuple[mountkeeper.Keeper, socket.socket]) -> None:
    k, sock = listening
    sock.sendall(json.dumps({"pid": 4242, "resume_timeout": 7}).encode() + b"\n")  # never says `serving`
    assert k._accept(select.poll())
    assert not k.unserved()


def test_a_silent_server_ends_the_mount_even_where_its_process_is_not_visible(
        listening: tuple[mountkeeper.Keeper, socket.socket], ended: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A keeper of the holder's pod sees no process of the plugin's: the heartbeat tells."""
    k, sock = listening
    monkeypatch.setattr(mountkeeper, "peer_pid", lambda conn: 0)
    poller = select.poll()
    attach_as_server(k, sock, poller, heartbeat=1.0)
    sock.sendall(b"serving\nalive\n")
    k._from_server(poller)
    assert k._check_server(poller) and not ended
    k.last_sign -= max(k.resume_timeout, mountkeeper.UNRESPONSIVE_MIN) + 1  # stopped, frozen or hung since
    assert not k._check_server(poller)
    assert ended == ["abort 0:99", f"unmount {k.mountpoint}"]


def test_a_server_whose_process_ended_is_dropped_though_its_connection_stays_open(
        listening: tuple[mountkeeper.Keeper, socket.socket], ended: list[str]) -> None:
    """A killed server one of whose threads waits on the mount keeps its descriptors: the
    keeper takes it for gone all the same, and a successor may take over."""
    k, sock = listening
    poller = select.poll()
    attach_as_server(k, sock, poller, heartbeat=1.0)
    sock.sendall(b"serving\n")
    k._from_server(poller)
    assert k.process == os.getpid()  # (this test is the server)
    zombie = subprocess.Popen(["true"])
    try:
        wait_until(lambda: mountkeeper.process_ended(zombie.pid), 30, "the child to end", interval=0.01)
        k.process = zombie.pid  # as a killed server's main thread is, while another waits in the kernel
        assert k._check_server(poller)
    finally:
        zombie.wait()
    assert k.server is None and k.deadline is not None and not ended
    assert not mountkeeper.process_ended(os.getpid())


def test_an_end_request_ends_the_keeper_whatever_serves_the_mount(
        listening: tuple[mountkeeper.Keeper, socket.socket], ended: list[str]) -> None:
    k, sock = listening
    poller = select.poll()
    attach_as_server(k, sock, poller)
    done = threading.Event()

    def run() -> None:
        k.run()
        k.cleanup()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert mountkeeper.end(k.state, timeout=10)
    assert done.wait(10) and ended[0] == "abort 0:99" and not (k.state / mountkeeper.SOCKET).exists()
    assert mountkeeper.end(k.state)  # nothing there: nothing to do
