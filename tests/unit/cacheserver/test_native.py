"""The compiled core (native/src/lib.rs). Its block file: ranges of a real file read and
checked against its chunks' CRC-32C outside the interpreter's lock, the next range of a
sequential reader read ahead in a thread of its own, and every damaged or missing byte refused.
Its data port receive: a reply line taken without the payload behind it, a payload received
whole and checked, and a silent or gone worker said so with what came."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from damage import flip_byte

from strata.cacheserver import native
from strata.cacheserver.common.checksums import compute_checksums
from strata.cacheserver.native import BlockFile

CHUNK = 64 * 1024
MiB = 1 << 20


def block_file(path: Path, data: bytes, chunk: int = CHUNK) -> BlockFile:
    """A BlockFile over `data` written at `path`; the descriptor it was made from is closed
    at once (it holds its own)."""
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        return BlockFile(fd, len(data), compute_checksums(data, chunk), chunk)
    finally:
        os.close(fd)


@pytest.fixture
def data() -> bytes:
    return os.urandom(16 * MiB + 12345)  # a block with a short last chunk


def test_a_reader_going_through_the_block_gets_every_byte_in_order(tmp_path: Path, data: bytes) -> None:
    block = block_file(tmp_path / "b", data)
    assert (block.length, block.chunk_size) == (len(data), CHUNK)
    got = []
    for start in range(0, len(data), MiB):  # each range after the first was read ahead
        got.append(block.read(start, min(start + MiB, len(data))))
    assert b"".join(got) == data  # type: ignore[arg-type]
    assert block.read(0, 3 * CHUNK, ahead=False) == data[:3 * CHUNK]
    block.close()


def test_a_range_read_ahead_is_the_bytes_checked_when_it_was_read(tmp_path: Path, data: bytes) -> None:
    """The next range is read and checked while the reader works on this one: a chunk damaged
    on disk after that (the file's later bytes are not the reader's) does not reach it, and a
    range not read ahead that holds the damage is refused."""
    path = tmp_path / "b"
    block = block_file(path, data)
    assert block.read(0, MiB) == data[:MiB]
    block.close()  # waits for the read-ahead of [1 MiB, 2 MiB)
    block = block_file(path, data)
    assert block.read(0, MiB) == data[:MiB]
    flip_byte(path, MiB + 100, 0x01)
    # The read-ahead may have started before or after the damage: either its bytes are the
    # block's own, or the range is refused; never the damaged byte.
    got = block.read(MiB, 2 * MiB)
    assert got is None or got == data[MiB:2 * MiB]
    assert block.read(MiB, 2 * MiB, ahead=False) is None  # read anew: the damage is found


@pytest.mark.parametrize("at", [0, CHUNK - 1, 5 * MiB + 7, 16 * MiB + 12344])
def test_a_damaged_chunk_fails_the_range_it_lies_in_and_no_other(tmp_path: Path, data: bytes, at: int) -> None:
    path = tmp_path / "b"
    path.write_bytes(data)
    flip_byte(path, at, 0x01)
    fd = os.open(path, os.O_RDONLY)
    block = BlockFile(fd, len(data), compute_checksums(data), CHUNK)
    os.close(fd)
    first = at // CHUNK * CHUNK
    assert block.read(first, min(first + CHUNK, len(data)), ahead=False) is None
    whole = bytearray(len(data))
    assert block.read_into(memoryview(whole), 0) is False  # two threads: each half checked
    other = CHUNK if first == 0 else 0
    assert block.read(other, other + CHUNK, ahead=False) == data[other:other + CHUNK]


def test_a_file_shorter_than_the_block_is_refused(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "b"
    block = block_file(path, data)
    os.truncate(path, 8 * MiB)
    assert block.read(8 * MiB, 9 * MiB, ahead=False) is None
    assert block.read_into(memoryview(bytearray(16 * MiB)), 0) is False
    assert block.read(0, MiB, ahead=False) == data[:MiB]


def test_read_into_fills_the_buffer_checked_in_place(tmp_path: Path, data: bytes) -> None:
    block = block_file(tmp_path / "b", data)
    whole = bytearray(len(data))  # long enough to be read by two threads
    assert block.read_into(memoryview(whole), 0) is True
    assert whole == data
    part = bytearray(2 * CHUNK)
    assert block.read_into(memoryview(part), 3 * CHUNK) is True
    assert part == data[3 * CHUNK:5 * CHUNK]
    with pytest.raises(ValueError, match="writable"):
        block.read_into(memoryview(bytes(CHUNK)), 0)


@pytest.mark.parametrize(("start", "stop", "says"), [
    (1, CHUNK, "chunk boundaries"),
    (0, CHUNK + 1, "chunk boundaries"),
    (0, 17 * MiB, "not within"),
    (2 * CHUNK, CHUNK, "not within"),
])
def test_a_range_off_the_chunks_is_refused_with_its_reason(tmp_path: Path, data: bytes, start: int, stop: int,
                                                           says: str) -> None:
    block = block_file(tmp_path / "b", data)
    with pytest.raises(ValueError, match=says):
        block.read(start, stop)


def test_a_description_that_does_not_fit_the_block_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "b"
    path.write_bytes(b"x" * (3 * CHUNK))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="2 checksums for a block of 196608 bytes"):
            BlockFile(fd, 3 * CHUNK, [0, 0], CHUNK)
        with pytest.raises(ValueError, match="chunk size 0"):
            BlockFile(fd, 3 * CHUNK, [0, 0, 0], 0)
        with pytest.raises(OverflowError):
            BlockFile(fd, 3 * CHUNK, [0, 0, 1 << 40], CHUNK)  # not a CRC-32C
    finally:
        os.close(fd)
    with pytest.raises(OSError, match="cannot duplicate descriptor"):
        BlockFile(fd, 3 * CHUNK, [0, 0, 0], CHUNK)  # closed


def test_threads_reading_one_block_at_once_each_get_their_own_bytes(tmp_path: Path, data: bytes) -> None:
    """A FUSE mount's reads of one open file come from several threads: none is refused or
    handed another's range (the read-ahead one reader started is another's wait at most)."""
    block = block_file(tmp_path / "b", data)
    wrong: list[tuple[int, int]] = []

    def reader(offset: int) -> None:
        for _ in range(4):
            for start in range(offset * CHUNK, len(data) - MiB, 3 * MiB):
                if block.read(start, start + MiB) != data[start:start + MiB]:
                    wrong.append((offset, start))

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


# -- the data port's receive (a real socket pair) ---------------------------------------------

def test_a_forked_child_reads_ahead_with_threads_of_its_own(tmp_path: Path, data: bytes) -> None:
    """The read-ahead threads are started once per process; a child forked after the parent
    read ahead (a data loader's workers) has none of them, and must not wait for them."""
    block = block_file(tmp_path / "b", data)
    assert block.read(0, MiB) == data[:MiB] and block.read(MiB, 2 * MiB) == data[MiB:2 * MiB]
    pid = os.fork()
    if pid == 0:  # the child: a sequential read of its own, each range after the first read ahead
        ok = False
        try:
            child = block_file(tmp_path / "c", data)
            ok = b"".join(child.read(at, min(at + MiB, len(data))) or b"" for at in range(0, len(data), MiB)) == data
        finally:
            os._exit(0 if ok else 1)
    assert wait_for_child(pid, "the forked child's read ahead never ended") == 0
    block.close()


def wait_for_child(pid: int, what: str) -> int:
    """The child's exit code; it is killed and the test failed if it takes 30 s."""
    deadline = time.monotonic() + 30
    while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail(what)
        time.sleep(0.005)
    return os.waitstatus_to_exitcode(ended[1])


def test_children_forked_while_the_parent_reads_ahead_read_on_their_own(tmp_path: Path, data: bytes) -> None:
    """A data loader forks its workers while its other threads read: a fork in the moment a
    read-ahead thread of the parent holds the threads' list, or a range of the parent's still
    being read ahead, must not leave a child waiting for a thread it does not have. Each child
    goes on with a block its parent was reading (the range read ahead at the fork is not its
    own) and reads it right to the end."""
    blocks = [block_file(tmp_path / f"b{i}", data) for i in range(2)]
    stop = threading.Event()

    def read_on(block: BlockFile) -> None:
        while not stop.is_set():
            for at in range(0, len(data), MiB):
                block.read(at, min(at + MiB, len(data)))

    readers = [threading.Thread(target=read_on, args=(b,)) for b in blocks]
    for reader in readers:
        reader.start()
    try:
        mine = block_file(tmp_path / "mine", data)
        for _ in range(40):
            assert mine.read(0, MiB) == data[:MiB]  # the next MiB is being read ahead
            pid = os.fork()
            if pid == 0:
                ok = False
                try:
                    ok = b"".join(mine.read(at, min(at + MiB, len(data))) or b""
                                  for at in range(MiB, len(data), MiB)) == data[MiB:]
                finally:
                    os._exit(0 if ok else 1)
            assert wait_for_child(pid, "a child forked while its parent read ahead never ended") == 0
        mine.close()
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    for block in blocks:
        block.close()


def test_an_exchange_sends_the_request_and_takes_the_reply_line_and_nothing_past_it() -> None:
    ours, worker = socket.socketpair()
    with ours, worker:
        worker.sendall(b'{"length": 5}\nhello')
        line, status = native.exchange(ours.fileno(), b"request\n", 1.0)
        assert (line, status) == (b'{"length": 5}\n', native.COMPLETE)
        assert worker.recv(100) == b"request\n"
        assert ours.recv(100) == b"hello"  # the payload stayed in the socket


def test_an_exchange_says_when_the_worker_is_silent_or_gone_with_what_came() -> None:
    ours, worker = socket.socketpair()
    with ours:
        worker.sendall(b'{"len')
        assert native.exchange(ours.fileno(), None, 0.05) == (b'{"len', native.TIMED_OUT)
        worker.sendall(b'gth": 0}\n')
        assert native.exchange(ours.fileno(), None, 1.0) == (b'gth": 0}\n', native.COMPLETE)
        worker.close()
        assert native.exchange(ours.fileno(), None, 1.0) == (b"", native.CLOSED)


def test_a_reply_line_without_an_end_is_refused() -> None:
    ours, worker = socket.socketpair()
    with ours, worker:
        def flood() -> None:
            with contextlib.suppress(OSError):
                worker.sendall(b"x" * (5 << 20))
        sender = threading.Thread(target=flood)
        sender.start()
        with pytest.raises(OSError, match="reply line longer than"):
            native.exchange(ours.fileno(), None, 1.0)
        ours.close()
        sender.join()


def test_a_payload_is_received_whole_and_checked_and_damage_is_named() -> None:
    payload = os.urandom(3 * CHUNK + 100)
    sums = compute_checksums(payload)
    ours, worker = socket.socketpair()
    with ours, worker:
        sender = threading.Thread(target=worker.sendall, args=(payload,))
        sender.start()
        data, got, bad, status = native.receive_checked(ours.fileno(), len(payload), sums, CHUNK, 1.0)
        sender.join()
        assert (data, got, bad, status) == (payload, len(payload), None, native.COMPLETE)
        damaged = bytearray(payload)
        damaged[2 * CHUNK + 5] ^= 0x10
        worker.sendall(bytes(damaged))
        assert native.receive_checked(ours.fileno(), len(payload), sums, CHUNK, 1.0)[1:] == (len(payload), 2, native.COMPLETE)
        with pytest.raises(ValueError, match="2 checksums for"):
            native.receive_checked(ours.fileno(), len(payload), sums[:2], CHUNK, 1.0)


def test_a_payload_cut_short_returns_what_came_and_how() -> None:
    payload = os.urandom(2 * CHUNK)
    sums = compute_checksums(payload)
    ours, worker = socket.socketpair()
    with ours:
        worker.sendall(payload[:1000])
        data, got, bad, status = native.receive_checked(ours.fileno(), len(payload), sums, CHUNK, 0.05)
        assert (data[:got], bad, status) == (payload[:1000], None, native.TIMED_OUT)
        assert data[got:] == bytes(len(payload) - got)  # zeros, not memory the process held before
        worker.sendall(payload[1000:5000])
        worker.close()
        data, got, bad, status = native.receive_checked(ours.fileno(), len(payload), sums, CHUNK, 1.0)
        assert (data[:got], bad, status) == (payload[1000:5000], None, native.CLOSED)


def test_an_exchange_on_the_short_circuit_socket_takes_the_descriptors_sent_with_the_reply(tmp_path: Path) -> None:
    block = tmp_path / "block"
    block.write_bytes(b"the block's bytes")
    ours, worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, worker, open(block, "rb") as f:
        socket.send_fds(worker, [b'{"length": 17}\n'], [f.fileno()])
        data, fds, status = native.exchange_fds(ours.fileno(), b"open\n", 1.0, 2)
        assert (data, status, len(fds)) == (b'{"length": 17}\n', native.COMPLETE, 1)
        assert worker.recv(100) == b"open\n"
        try:
            assert os.pread(fds[0], 100, 0) == b"the block's bytes"
            assert os.get_inheritable(fds[0]) is False
        finally:
            os.close(fds[0])
        assert native.exchange_fds(ours.fileno(), None, 0.05, 2) == (b"", [], native.TIMED_OUT)
        worker.close()
        assert native.exchange_fds(ours.fileno(), None, 1.0, 2) == (b"", [], native.CLOSED)
