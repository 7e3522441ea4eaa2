"""The FUSE holder's protocol: what it refuses (and says why), the keepers it starts and
reaps, what a client hears when no holder listens; and the keeper's tolerant hello."""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from strata.contract.errors import InvalidArgument, Unavailable
from strata.cacheserver.fuse import holder, keeper


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "s"  # short: a Unix socket's path is at most 107 bytes
    folder.mkdir()
    monkeypatch.setenv(keeper.STATE_DIR_ENV, str(folder))
    return folder


@pytest.fixture
def running(root: Path) -> Iterator[holder.Holder]:
    h = holder.Holder(root / holder.SOCKET, root)
    h.listen()
    stop = threading.Event()
    thread = threading.Thread(target=h.serve, args=(stop,), daemon=True)
    thread.start()
    yield h
    stop.set()
    thread.join(timeout=10)
    h.close()


def ask(h: holder.Holder, payload: bytes, fds: list[int] | None = None) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(h.path))
        if fds:
            socket.send_fds(sock, [payload], fds)
        else:
            sock.sendall(payload)
        line, _ = holder.read_line(sock)
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


def test_the_socket_is_for_root_only_and_answers_a_probe(running: holder.Holder) -> None:
    assert running.path.stat().st_mode & 0o777 == 0o600
    holder.wait_ready(running.path, wait=5)


@pytest.mark.parametrize(("payload", "error"), [
    (b"{not json\n", "not a JSON request"),
    (b"[1, 2]\n", "not a JSON object"),
    (b"x" * (holder.MAX_MESSAGE + 10), f"longer than {holder.MAX_MESSAGE} bytes"),
])
def test_a_bad_or_oversized_request_is_refused(running: holder.Holder, payload: bytes, error: str) -> None:
    reply = ask(running, payload)
    assert error in str(reply["error"]), reply
    holder.wait_ready(running.path, wait=5)  # and the holder serves on


def test_a_request_must_name_its_mount_and_a_state_folder_of_the_holder(running: holder.Holder, root: Path) -> None:
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


def test_a_request_without_its_descriptor_or_with_another_one_is_refused(running: holder.Holder, root: Path) -> None:
    assert "came with 0 descriptors" in str(ask(running, request(root))["error"])
    r, w = os.pipe()
    try:
        assert "is not /dev/fuse" in str(ask(running, request(root), [r])["error"])
    finally:
        os.close(r)
        os.close(w)
    assert not running.keepers


def test_keepers_are_started_and_reaped(running: holder.Holder, root: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(holder, "is_fuse_device", lambda fd: True)
    state = root / "k1"
    state.mkdir()
    r, w = os.pipe()
    try:
        # Nothing is mounted at the mount point: the keeper starts, listens, then ends at once.
        pid = holder.start_keeper(running.path, r, state, tmp_path / "not-mounted", 5.0, wait=5)
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
        holder.start_keeper(missing, 0, root / "x", Path("/mnt/x"), 5.0, wait=1.0)
    assert 1.0 <= time.monotonic() - started < 5
    assert str(missing) in str(exc.value) and holder.HOLDER_ENV in str(exc.value)


def test_the_holder_is_configured_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(holder.HOLDER_ENV, raising=False)
    assert holder.configured() is None
    monkeypatch.setenv(holder.HOLDER_ENV, "/run/strata/fuse/holder.sock")
    assert holder.configured() == Path("/run/strata/fuse/holder.sock")


def test_the_wait_for_the_holder_is_30_s_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(holder.WAIT_ENV, raising=False)
    assert holder.wait_timeout() == 30
    monkeypatch.setenv(holder.WAIT_ENV, "2.5")
    assert holder.wait_timeout() == 2.5
    for bad in ("soon", "0", "-1", "nan", "inf"):
        monkeypatch.setenv(holder.WAIT_ENV, bad)
        with pytest.raises(InvalidArgument, match=f"STRATA_FUSE_HOLDER_WAIT must be seconds .*not '{bad}'"):
            holder.wait_timeout()


@pytest.fixture
def listening(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[keeper.Keeper, socket.socket]]:
    """A keeper of a stand-in descriptor (a pipe) whose mount is there, and a client connected
    to its socket; the test calls `_accept` itself."""
    r, w = os.pipe()
    k = keeper.Keeper(r, tmp_path, tmp_path / "m", 60)
    k.device = "0:99"
    monkeypatch.setattr(keeper, "find_mount", lambda path: SimpleNamespace(device="0:99"))
    k.listen()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(tmp_path / keeper.SOCKET))
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
        listening: tuple[keeper.Keeper, socket.socket], hello: dict[str, object]) -> None:
    k, sock = listening
    sock.sendall(json.dumps(hello).encode() + b"\n")
    assert k._accept(select.poll())
    message, fds, _, _ = socket.recv_fds(sock, 1024, 1)
    for fd in fds:
        os.close(fd)
    assert json.loads(message) == {"ok": True} and len(fds) == 1
    assert k.server_pid == 4242 and k.resume_timeout == 7


def test_the_keeper_refuses_a_hello_that_is_no_object(listening: tuple[keeper.Keeper, socket.socket]) -> None:
    k, sock = listening
    sock.sendall(b"[1]\n")
    assert k._accept(select.poll())
    assert sock.recv(100) == b""  # closed without a descriptor
    assert k.server is None
