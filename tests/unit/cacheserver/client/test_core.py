"""The client through a master outage, against the real master service (in this process, on
its own event loop thread, 127.0.0.1) stopped for real: files already looked at stay
openable for `master_outage_grace` seconds; nothing else is made up. And a block read
returns exactly the bytes asked for, whichever way a worker sent them."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from threadmaster import MASTER_TOKEN, Run, threaded_master

from strata.cacheserver.auth import Credentials
from strata.cacheserver.blockwire import ok_reply, reply_line
from strata.cacheserver.cache.metadata import CHUNK_SIZE, compute_checksums
from strata.cacheserver.client.core import StrataClient
from strata.cacheserver.client.settings import ClientSettings
from strata.cacheserver.master.server import MasterHandle
from strata.contract import rpc
from strata.contract.errors import NotFound, Unavailable
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc


@pytest.fixture
def master(tmp_path: Path) -> Iterator[tuple[MasterHandle, Run[Any]]]:
    with threaded_master(tmp_path) as running:
        yield running


def client_of(handle: MasterHandle, tmp_path: Path, **settings: float) -> StrataClient:
    (tmp_path / "store").mkdir(exist_ok=True)
    (tmp_path / "store" / "seen").write_bytes(b"seen")
    (tmp_path / "store" / "unseen").write_bytes(b"unseen")
    client = StrataClient(master=f"127.0.0.1:{handle.port}", token=MASTER_TOKEN, host="h",
                          settings=ClientSettings(**settings))
    if not client.mounts():
        client.mount("/m", f"file://{tmp_path / 'store'}")
    return client


def test_a_file_looked_at_opens_again_while_the_master_is_down(master: tuple[MasterHandle, Run[Any]], tmp_path: Path) -> None:
    handle, run = master
    client = client_of(handle, tmp_path)
    try:
        seen = client.stat("/m/seen")
        assert client.workers() == []
        run(handle.stop(grace=0))
        started = time.monotonic()
        assert client.stat("/m/seen") == seen
        assert time.monotonic() - started < 2.5  # a refused master is told at once
        assert client.workers(refresh=True) == []  # the last list
        with pytest.raises(Unavailable):
            client.stat("/m/unseen")  # never looked at: nothing to go on with
    finally:
        client.close()


def test_without_a_grace_or_after_it_the_outage_is_an_error(master: tuple[MasterHandle, Run[Any]], tmp_path: Path) -> None:
    handle, run = master
    off = client_of(handle, tmp_path, master_outage_grace=0)
    short = client_of(handle, tmp_path, master_outage_grace=0.5)
    try:
        off.stat("/m/seen")
        short.stat("/m/seen")
        with pytest.raises(NotFound):
            short.stat("/m/missing")  # an answer of the master is never replaced
        run(handle.stop(grace=0))
        with pytest.raises(Unavailable):
            off.stat("/m/seen")
        short.stat("/m/seen")
        time.sleep(0.6)  # past the grace
        with pytest.raises(Unavailable):
            short.stat("/m/seen")
    finally:
        off.close()
        short.close()


def test_a_block_of_another_length_than_asked_is_never_returned(master: tuple[MasterHandle, Run[Any]],
                                                                tmp_path: Path) -> None:
    """Whatever way a worker serves a block, bytes of another length than the block's are
    refused. The worker here is a stand-in on this host, registered with the real master,
    whose short-circuit socket hands out a file shorter than the block, with checksums that
    match it: a real worker keeps a block only under a key that carries its length, so it
    cannot be made to do that; a worker of another release, or a bug, could."""
    handle, run = master
    short = bytes(range(256)) * 12  # 3072 bytes of a 4096-byte block
    held = tmp_path / "held-block"
    held.write_bytes(short)
    sock_path = tmp_path / "sc.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    server.listen(4)
    server.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn, conn.makefile("rb") as lines:
                for _ in lines:
                    fd = os.open(held, os.O_RDONLY)
                    try:
                        reply = ok_reply(len(short), True, checksums=compute_checksums(short), chunk_size=CHUNK_SIZE)
                        socket.send_fds(conn, [reply_line(reply)], [fd])
                    finally:
                        os.close(fd)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with rpc.sync_channel(f"127.0.0.1:{handle.port}", Credentials.from_admin(MASTER_TOKEN).internal) as channel:
        pb_grpc.MasterStub(channel).RegisterWorker(pb.RegisterWorkerRequest(worker=pb.WorkerInfo(
            worker_id="stand-in", host="h", address="127.0.0.1:1", domain_socket=str(sock_path))), timeout=10)
    client = client_of(handle, tmp_path)
    ref = pb.BlockRef(mount_id=1, path="/m/f", version="v1", index=0, block_size=4096, file_length=4096,
                      in_store=True)
    try:
        with pytest.raises(Unavailable, match=r"stand-in sent 3072 bytes of block 0 of /m/f, expected 4096"):
            client.read_block(ref)  # the whole block
        with pytest.raises(Unavailable, match=r"stand-in sent 50 bytes of block 0 of /m/f, expected 100"):
            client.read_block(ref, 3022, 100)  # a range that runs past the short file's end
    finally:
        client.close()
        stop.set()
        thread.join(timeout=5)
        server.close()
