"""Where a FUSE mount's keeper keeps its state, how a server finds (or misses) it, and how an
unpublish ends it."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from strata.cacheserver.fuse import mountkeeper, settings


def test_the_state_folder_is_found_from_the_mount_point(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(settings.STATE_DIR_ENV, str(tmp_path))
    a, b = mountkeeper.state_dir(Path("/mnt/a")), mountkeeper.state_dir(Path("/mnt/b"))
    assert a.parent == tmp_path and b.parent == tmp_path and a != b
    assert mountkeeper.state_dir(Path("/mnt/a")) == a  # the same for every process
    assert len(str(a / mountkeeper.SOCKET)) < 108  # a Unix socket's path limit, with a short root




def test_no_keeper_or_a_dead_ones_socket_means_mount_anew(tmp_path: Path) -> None:
    assert mountkeeper.attach(tmp_path, 60) is None
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(tmp_path / mountkeeper.SOCKET))
    dead.close()  # the file stays, nobody listens
    assert mountkeeper.attach(tmp_path, 60) is None


def test_json_files_are_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / mountkeeper.SESSION
    mountkeeper.write_json(path, {"root": "/x"})
    assert mountkeeper.read_json(path) == {"root": "/x"}
    path.write_text("{cut")
    assert mountkeeper.read_json(path) == {}
    assert mountkeeper.read_json(tmp_path / "missing.json") == {}


@pytest.mark.parametrize(("answer", "ended"), [
    (b"", True),  # a keeper of this image ends without a word
    (b'{"gone": true}', True),  # one of an older image ends when its mount point is gone
    (b'{"error": "already a Strata mount, served by pid 7"}', False),  # one of an older image still serves
])
def test_ending_a_keeper_says_whether_it_ended(tmp_path: Path, answer: bytes, ended: bool) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / mountkeeper.SOCKET))
    listener.listen(1)

    def answer_once() -> None:
        conn, _ = listener.accept()
        with conn:
            assert json.loads(conn.recv(1024)) == {"version": mountkeeper.HELLO_VERSION, "end": True}
            conn.sendall(answer)

    thread = threading.Thread(target=answer_once)
    thread.start()
    try:
        assert mountkeeper.end(tmp_path, timeout=10) is ended
    finally:
        thread.join(10)
        listener.close()
