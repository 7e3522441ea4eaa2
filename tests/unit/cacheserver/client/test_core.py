"""The client through a master outage, against the real master service (in this process, on
its own event loop thread, 127.0.0.1) stopped for real: files already looked at stay
openable for `master_outage_grace` seconds; nothing else is made up. A block read returns
exactly the bytes asked for, whichever way a worker sent them. And the master's answers
for read-only mounts are reused while the master would give them (counted at the master),
never longer."""

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
from strata.cacheserver.common.blockwire import ok_reply, reply_line
from strata.cacheserver.common.checksums import CHUNK_SIZE, compute_checksums
from strata.cacheserver.client.core import StrataClient, StallWatch
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


# -- answers reused while the master would give them ------------------------------------------


def metadata_requests(handle: MasterHandle) -> int:
    return sum(handle.parts.files.metadata_requests.values())


def mounted_client(handle: MasterHandle, tmp_path: Path, *, read_only: bool, interval: float,
                   **settings: float) -> tuple[StrataClient, Path]:
    store = tmp_path / "reused"
    store.mkdir()
    for i in range(3):
        (store / f"f{i}").write_bytes(b"x" * i)
    client = StrataClient(master=f"127.0.0.1:{handle.port}", token=MASTER_TOKEN, host="h",
                          settings=ClientSettings(**settings))
    client.mount("/r", f"file://{store}", pb.MountOptions(read_only=read_only, metadata_sync_interval=interval))
    return client, store


def rewrite(path: Path, data: bytes) -> None:
    """A new version of a file:// file (its size and mtime are its version)."""
    path.write_bytes(data)
    later = time.time_ns() + 1_000_000_000
    os.utime(path, ns=(later, later))


@pytest.mark.parametrize("grace", [120.0, 0.0], ids=["outage-grace", "no-outage-grace"])
def test_repeated_stats_of_a_read_only_mount_ask_the_master_once(master: tuple[MasterHandle, Run[Any]],
                                                                 tmp_path: Path, grace: float) -> None:
    handle, _ = master
    client, _ = mounted_client(handle, tmp_path, read_only=True, interval=30, master_outage_grace=grace)
    try:
        first = client.stat("/r/f1")
        assert 29_000 < first.valid_for_ms <= 30_000
        asked = metadata_requests(handle)
        for _ in range(20):
            assert client.stat("/r/f1") == first
        assert metadata_requests(handle) == asked
        listed = client.ls("/r")  # one listing, then each file listed opens with no question
        assert metadata_requests(handle) == asked + 1
        assert [client.stat(f.path) for f in listed] == listed
        assert metadata_requests(handle) == asked + 1
        assert client.stat("/r/f1", fresh=True).version == first.version
        assert metadata_requests(handle) == asked + 2
    finally:
        client.close()


def test_a_writable_mount_is_asked_on_every_stat(master: tuple[MasterHandle, Run[Any]], tmp_path: Path) -> None:
    handle, _ = master
    client, _ = mounted_client(handle, tmp_path, read_only=False, interval=30)
    try:
        first = client.stat("/r/f1")
        assert first.valid_for_ms == 0
        asked = metadata_requests(handle)
        client.ls("/r")
        for _ in range(5):
            client.stat("/r/f1")
        assert metadata_requests(handle) == asked + 6
    finally:
        client.close()


def test_a_file_changed_in_the_store_is_seen_no_later_than_the_master_sees_it(
        master: tuple[MasterHandle, Run[Any]], tmp_path: Path) -> None:
    """The client's answer never lags the master's: once the master answers the new version,
    the client's next stat does too; and that within the mount's interval."""
    handle, _ = master
    interval = 2.0
    client, store = mounted_client(handle, tmp_path, read_only=True, interval=interval)
    direct = StrataClient(master=f"127.0.0.1:{handle.port}", token=MASTER_TOKEN, host="h",
                          settings=ClientSettings(master_outage_grace=0))
    try:
        direct.stat("/r/f2")  # the master asks the store now
        time.sleep(1.0)
        old = client.stat("/r/f2")  # half of the master's interval gone: held for the rest only
        assert old.valid_for_ms <= 1000
        rewrite(store / "f2", b"changed")
        changed_at = time.monotonic()
        master_saw_it = False
        while True:
            seen = client.stat("/r/f2")
            assert not (master_saw_it and seen.version == old.version), "the client lagged the master"
            if seen.version != old.version:
                break
            master_saw_it = direct.stat("/r/f2", fresh=True).version != old.version
            assert time.monotonic() - changed_at < interval + 1, "not seen within the interval"
            time.sleep(0.01)
        assert seen.length == 7
    finally:
        client.close()
        direct.close()


def test_changes_through_the_client_drop_what_it_holds(master: tuple[MasterHandle, Run[Any]], tmp_path: Path) -> None:
    """A remount through this client (here: the same folder made writable) is seen by its
    next stat, not after the reuse of the read-only mount's answers ends."""
    handle, _ = master
    client, store = mounted_client(handle, tmp_path, read_only=True, interval=-1)
    try:
        client.ls("/r")
        assert client.stat("/r/f1").read_only
        client.mount("/r", f"file://{store}", pb.MountOptions(metadata_sync_interval=-1), replace=True)
        assert not client.stat("/r/f1").read_only
    finally:
        client.close()


def test_an_answer_not_to_reuse_replaces_the_one_held(master: tuple[MasterHandle, Run[Any]], tmp_path: Path) -> None:
    handle, _ = master
    client, store = mounted_client(handle, tmp_path, read_only=True, interval=30, master_outage_grace=0)
    other = StrataClient(master=f"127.0.0.1:{handle.port}", token=MASTER_TOKEN, host="h")
    try:
        assert client.stat("/r/f1").read_only
        other.mount("/r", f"file://{store}", pb.MountOptions(metadata_sync_interval=30), replace=True)
        assert client.stat("/r/f1").read_only  # a remount elsewhere shows when the answer held ends
        assert not client.stat("/r/f1", fresh=True).read_only
        assert not client.stat("/r/f1").read_only  # not the older answer, held still
    finally:
        client.close()
        other.close()


@pytest.mark.parametrize("grace", [120.0, 0.0], ids=["outage-grace", "no-outage-grace"])
def test_a_listing_whose_caller_keeps_its_entries_holds_none_and_drops_an_older_answer(
        master: tuple[MasterHandle, Run[Any]], tmp_path: Path, grace: float) -> None:
    """ls_pages(hold_reusable=False), as a read-only FUSE mount lists (its attribute cache
    keeps the entries): none is held, and a held answer the listing shows to be of an older
    version goes, so a stat asks again rather than answer older than the listing."""
    handle, _ = master
    client, store = mounted_client(handle, tmp_path, read_only=True, interval=30, master_outage_grace=grace)
    other = StrataClient(master=f"127.0.0.1:{handle.port}", token=MASTER_TOKEN, host="h")
    try:
        old = client.stat("/r/f1")
        rewrite(store / "f1", b"a new version")
        # The master learns of the new version early (a reader found the file changed).
        assert other.call("GetStatus", pb.GetStatusRequest(path="/r/f1", refresh=True), what="stat").version != old.version
        listed = {e.path: e for page in client.ls_pages("/r", hold_reusable=False) for e in page}
        assert listed["/r/f1"].version != old.version
        assert client._held.get("/r/f0") is None and client._held.get("/r/f1") is None
        assert client.stat("/r/f1").version == listed["/r/f1"].version
    finally:
        client.close()
        other.close()


def test_a_listing_of_many_pages_gives_every_entry_once_with_its_size(master: tuple[MasterHandle, Run[Any]],
                                                                      tmp_path: Path) -> None:
    handle, _ = master
    store = tmp_path / "many"
    for folder in range(3):
        (store / f"d{folder}").mkdir(parents=True)
        for i in range(900):
            (store / f"d{folder}" / f"f{i:04d}").write_bytes(b"x" * (folder * 1000 + i))
    client = StrataClient(master=f"127.0.0.1:{handle.port}", token=MASTER_TOKEN, host="h")
    try:
        client.mount("/many", f"file://{store}", pb.MountOptions(read_only=True, metadata_sync_interval=60))
        pages = list(client.ls_pages("/many", recursive=True))
        assert len(pages) > 2 and all(len(page) <= 1000 for page in pages)  # the master's default page
        files = [e for page in pages for e in page if not e.is_dir]
        assert len(files) == len({e.path for e in files}) == 2700
        assert all(e.length == int(e.path[-7]) * 1000 + int(e.path[-4:]) for e in files)
        assert all(e.valid_for_ms > 50_000 for page in pages for e in page)
    finally:
        client.close()


def test_a_listing_gives_up_when_no_page_comes_in_time_and_not_while_its_reader_holds_one() -> None:
    stopped = threading.Event()
    watch = StallWatch(stopped.set, 0.3)
    watch.pause()  # the reader takes its time with a page
    assert not stopped.wait(0.6) and not watch.stalled
    watch.heard()  # waiting for the next one again
    assert stopped.wait(2) and watch.stalled
    quiet = threading.Event()
    heard = StallWatch(quiet.set, 0.3)
    for _ in range(6):  # pages keep coming within the timeout
        time.sleep(0.1)
        heard.heard()
    heard.stop()
    assert not quiet.wait(0.5) and not heard.stalled
