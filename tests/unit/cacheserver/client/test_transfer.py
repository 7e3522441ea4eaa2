"""The client's block sockets never wait without a deadline: a worker that accepts a request
and then says nothing (stopped, hung) is given up on. The worker here is a real listening
socket that never answers, as a SIGSTOPped worker's kernel does."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from strata.cacheserver.client.transfer import DataReader, Patience, WorkerStalled
from strata.cacheserver.proto import strata_pb2 as pb

REF = pb.BlockRef(mount_id=1, path="/m/f", version="v1", index=0, block_size=1024, file_length=1024, in_store=True)


@pytest.fixture
def silent_worker() -> Iterator[int]:
    """A port that accepts connections and reads requests, and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join(timeout=5)
    for conn in held:
        conn.close()
    server.close()


def reader(port: int, *, alive: bool, block_timeout: float, checks: list[float]) -> DataReader:
    def check() -> bool:
        checks.append(time.monotonic())
        return alive

    patience = Patience(connect_timeout=1.0, check_after=0.2, block_timeout=block_timeout, alive=check)
    return DataReader("127.0.0.1", port, "token", patience)


def test_a_silent_worker_that_fails_its_health_check_is_given_up_on(silent_worker: int) -> None:
    checks: list[float] = []
    data = reader(silent_worker, alive=False, block_timeout=30, checks=checks)
    started = time.monotonic()
    with pytest.raises(WorkerStalled, match=r"does not answer its health check"):
        data.read(REF, 0, 1024)
    assert time.monotonic() - started < 1.0
    assert len(checks) == 1


def test_a_live_but_silent_worker_is_given_up_on_at_the_block_deadline(silent_worker: int) -> None:
    checks: list[float] = []
    data = reader(silent_worker, alive=True, block_timeout=1.0, checks=checks)
    started = time.monotonic()
    with pytest.raises(WorkerStalled, match=r"took over 1\.\ds for one block"):
        data.read(REF, 0, 1024)
    assert 1.0 <= time.monotonic() - started < 2.0
    assert len(checks) >= 3  # asked every check_after while it waited
