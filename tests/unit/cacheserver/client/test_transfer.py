"""The client's block sockets never wait without a deadline: a worker that accepts a request
and then says nothing (stopped, hung) is given up on. The worker here is a real listening
socket that never answers, as a SIGSTOPped worker's kernel does.

A block's bytes come as the bytes object the kernel received them into, also when the worker
pauses in the middle: the worker here is a real socket that answers every request with bytes
of its own. The client's buffers are used again, but never while anything can still read them.

Bytes whose checksums do not match are never returned: a worker here sends bytes damaged on
the way (checksums of other bytes), or none at all."""

from __future__ import annotations

import json
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pyarrow as pa
import pytest

from strata.cacheserver.common.blockwire import DamagedInTransit, ok_reply, reply_line
from strata.cacheserver.common.checksums import CHUNK_SIZE, compute_checksums
from strata.cacheserver.client.transfer import BufferPool, DataReader, Patience, WorkerStalled
from strata.contract.proto import strata_pb2 as pb

REF = pb.BlockRef(mount_id=1, path="/m/f", version="v1", index=0, block_size=1024, file_length=1024, in_store=True)


@contextmanager
def listening(on_connection: Callable[[socket.socket], None]) -> Iterator[int]:
    """A port on loopback; each connection accepted is handed to `on_connection`."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            on_connection(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()


@pytest.fixture
def silent_worker() -> Iterator[int]:
    """A port that accepts connections and reads requests, and never answers."""
    held: list[socket.socket] = []
    with listening(held.append) as port:
        yield port
    for conn in held:
        conn.close()


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


@pytest.fixture
def counting_worker() -> Iterator[int]:
    """A port that answers the n-th block request (n = 1, 2, ...) with `length` bytes of
    value n."""
    served = [0]

    def serve(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                served[0] += 1
                length = json.loads(line)["length"]
                body = bytes([served[0]]) * length
                conn.sendall(reply_line(ok_reply(length, True, checksums=compute_checksums(body), chunk_size=CHUNK_SIZE)))
                conn.sendall(body)

    with listening(lambda conn: threading.Thread(target=serve, args=(conn,), daemon=True).start()) as port:
        yield port


@contextmanager
def pooled_reader(port: int, pool: BufferPool) -> Iterator[DataReader]:
    patience = Patience(connect_timeout=1.0, check_after=5.0, block_timeout=10.0, alive=lambda: True)
    data = DataReader("127.0.0.1", port, "token", patience, pool)
    try:
        yield data
    finally:
        data.close()


def test_a_whole_block_comes_as_the_bytes_the_kernel_received_it_into(counting_worker: int) -> None:
    with pooled_reader(counting_worker, BufferPool(count=4, min_size=1)) as data:
        first = data.read(REF, 0, 1024)
        # bytes: a reader's read() of the whole block hands it over as it is, with no copy
        assert type(first) is bytes and first == b"\x01" * 1024
        assert data.read(REF, 0, 1024) == b"\x02" * 1024  # the connection is reused, in step


@pytest.fixture
def pausing_worker() -> Iterator[int]:
    """A port that sends the first half of each block's bytes, pauses longer than the
    client's check_after, then sends the rest."""
    body = bytes(range(256)) * 4096  # 1 MiB, 16 chunks

    def serve(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            for _ in lines:
                conn.sendall(reply_line(ok_reply(len(body), True, checksums=compute_checksums(body),
                                                 chunk_size=CHUNK_SIZE)) + body[:len(body) // 2])
                time.sleep(0.5)
                conn.sendall(body[len(body) // 2:])

    with listening(lambda conn: threading.Thread(target=serve, args=(conn,), daemon=True).start()) as port:
        yield port


def test_a_block_whose_bytes_pause_past_check_after_is_received_whole_and_checked(pausing_worker: int) -> None:
    asked: list[float] = []
    patience = Patience(connect_timeout=1.0, check_after=0.1, block_timeout=10.0,
                        alive=lambda: asked.append(time.monotonic()) is None)
    data = DataReader("127.0.0.1", pausing_worker, "token", patience, BufferPool(count=2, min_size=1))
    try:
        for _ in range(2):
            got = data.read(REF, 0, 1 << 20)
            assert bytes(got) == bytes(range(256)) * 4096
        assert asked  # the silence was looked into, and the worker found alive
    finally:
        data.close()


def test_a_buffer_is_used_again_once_nothing_refers_to_it() -> None:
    pool = BufferPool(count=4, min_size=1)
    first = pool.take(1024)
    memory = weakref.ref(first)  # kept alive by the pool, not by this test
    del first
    assert pool.take(1024) is memory()


def test_a_buffer_anyone_can_still_read_is_never_handed_out_again() -> None:
    pool = BufferPool(count=4, min_size=1)
    first = pool.take(1024)
    first[:] = b"\x01" * 1024
    view = memoryview(first)[100:200]  # a slice handed on (fsspec's read_buffer, pread)
    exported = pa.py_buffer(first)  # a buffer held by C code (pyarrow decoding from it)
    memory = weakref.ref(first)
    del first
    second = pool.take(1024)
    assert second is not memory()
    second[:] = b"\x02" * 1024
    assert bytes(view) == b"\x01" * 100 and exported.to_pybytes() == b"\x01" * 1024
    del second
    view.release()
    third = pool.take(1024)  # the second's map: the first is still exported
    assert third is not memory()
    third[:] = b"\x03" * 1024
    assert exported.to_pybytes() == b"\x01" * 1024


def test_the_pool_keeps_a_bounded_number_of_buffers() -> None:
    pool = BufferPool(count=2, min_size=512)
    held = [pool.take(1024) for _ in range(4)]  # all in use: two of them are not kept
    small = pool.take(100)  # below min_size: never pooled
    assert len(pool._maps) == 2 and all(m is not small for m in pool._maps)
    del held
    other = pool.take(2048)  # full of free maps of another size: one makes room
    assert sorted(len(m) for m in pool._maps) == [1024, 2048] and any(m is other for m in pool._maps)
    pool.clear()  # the client closes: the free map goes, the one in use stays its holder's
    other[:4] = b"abcd"
    assert pool._maps == [] and bytes(other[:4]) == b"abcd"


def test_a_range_buffer_is_used_again_for_ranges_of_other_lengths_and_never_while_held() -> None:
    mib = 1 << 20
    pool = BufferPool(count=4, min_size=mib, max_view=8 * mib)
    first = pool.view(3 * mib)
    first[:] = b"\x01" * (3 * mib)
    held = first[mib:mib + 10].toreadonly()  # a slice handed on (pyarrow decoding from it)
    second = pool.view(3 * mib)  # the first is still referred to: another map
    assert second.obj is not first.obj
    second[:] = b"\x02" * (3 * mib)
    assert bytes(held) == b"\x01" * 10 and bytes(first[:1]) == b"\x01"
    kept = id(second.obj)  # the pool keeps the map alive: its id stays its own
    del second
    shorter = pool.view(2 * mib + 5)  # a free map of 4 MiB (3 rounded up) holds it: no new memory
    assert id(shorter.obj) == kept and len(shorter) == 2 * mib + 5
    del shorter
    assert pool.view(9 * mib).obj not in pool._maps  # over max_view: its own map, not kept
    assert pool.view(mib // 2).obj.__class__ is bytearray  # under min_size: not a map at all
    assert id(pool.view(5 * mib).obj) != kept  # longer than the free 4 MiB map: a new one (8 MiB)


@contextmanager
def worker_sending(replies: list[tuple[dict[str, object], bytes]]) -> Iterator[int]:
    """A port that answers the n-th block request with the n-th reply and body."""
    def serve(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            for _ in lines:
                reply, body = replies.pop(0)
                conn.sendall(reply_line(reply) + body)

    with listening(lambda conn: threading.Thread(target=serve, args=(conn,), daemon=True).start()) as port:
        yield port


def test_bytes_damaged_on_the_way_are_never_returned() -> None:
    sent = bytes(range(256)) * (3 * CHUNK_SIZE // 256 + 1)  # three chunks and a piece
    damaged = bytearray(sent)
    damaged[CHUNK_SIZE + 7] ^= 0x10  # one bit, in the second chunk
    good = ok_reply(len(sent), True, checksums=compute_checksums(sent), chunk_size=CHUNK_SIZE)
    unchecked = ok_reply(len(sent), True)  # a worker that sends no checksums
    with worker_sending([(good, bytes(damaged)), (unchecked, sent), (good, sent)]) as port, \
            pooled_reader(port, BufferPool(count=2, min_size=1)) as data:
        with pytest.raises(DamagedInTransit, match=rf"bytes {CHUNK_SIZE}-{2 * CHUNK_SIZE - 1} failed their CRC-32C"):
            data.read(REF, 0, len(sent))
        with pytest.raises(DamagedInTransit, match=r"0 checksums came with"):
            data.read(REF, 0, len(sent))
        assert bytes(data.read(REF, 0, len(sent))) == sent  # a new connection after each refusal
