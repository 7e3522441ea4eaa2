"""The FUSE session (the protocol layer) over a socket pair standing in for /dev/fuse, with a
fake file system behind the operations interface: what a kernel sends, what it is answered.
Real mounts run it in tests/integration/test_fuse*.py."""

from __future__ import annotations

import errno
import itertools
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from waiting import wait_until

from strata.cacheserver.fuse import wire
from strata.cacheserver.fuse.interface import MAX_IO, FileInfo, FuseError, Operations
from strata.cacheserver.fuse.nodes import NodeTable
from strata.cacheserver.fuse.handlers import WANT
from strata.cacheserver.fuse.session import Session

# Seconds a reply may take (a thread of the session answers each request at once).
REPLY_TIMEOUT = 10.0
# An INIT flag the kernel offers and Strata does not ask for (FUSE_FLOCK_LOCKS).
FLOCK_LOCKS = 1 << 10


@dataclass(frozen=True)
class FakeStatus:
    path: str
    version: str


class FakeFiles:
    """Files by path in memory; read handles are even numbers (the lowest bit: written)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.handles: dict[int, str] = {}
        self._ids = itertools.count(2, 2)
        self.committed = 0

    def _file(self, path: str) -> bytes:
        if path not in self.files:
            raise FuseError(errno.ENOENT)
        return self.files[path]

    def getattr(self, path: str, fh: FileInfo | None = None) -> dict[str, Any]:
        if path == "/":
            return {"st_ino": 1, "st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
        if path == "/broken":
            raise RuntimeError("a bug in the file system")
        if path == "/gone":
            raise FileNotFoundError(errno.ENOENT, "gone")
        return {"st_ino": 7, "st_mode": stat.S_IFREG | 0o644, "st_size": len(self._file(path)),
                "st_mtime": 1_700_000_000_123_456_789}

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_blocks": 100, "f_bfree": 40, "f_bavail": 40, "f_bsize": 4096, "f_frsize": 4096, "f_namemax": 255}

    def readdir(self, path: str, fh: Any) -> list[tuple[str, int, int]]:
        return [(name.lstrip("/"), 7, stat.S_IFREG) for name in sorted(self.files)]

    def passes_through(self) -> bool:
        return False

    def pass_through(self, register: Any, unregister: Any, *, resumed: bool) -> None:
        raise AssertionError("passthrough is not asked for")

    def listing_unchanged(self, path: str) -> bool:
        return False

    def chmod(self, path: str, mode: int) -> int:
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        return 0

    def utimens(self, path: str, times: Any = None) -> int:
        return 0

    def listxattr(self, path: str) -> list[str]:
        return []

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        raise FuseError(errno.ENODATA)

    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int:
        raise FuseError(errno.ENOTSUP)

    def removexattr(self, path: str, name: str) -> int:
        raise FuseError(errno.ENOTSUP)

    def is_write_handle(self, fh: int) -> bool:
        return bool(fh & 1)

    def has_handle(self, fh: int) -> bool:
        return fh in self.handles

    def reopen(self, path: str, fh: int) -> None:
        self.handles[fh] = path

    def open(self, path: str, fi: FileInfo) -> int:
        self._file(path)
        fi.fh = next(self._ids)
        fi.keep_cache = 1
        self.handles[fi.fh] = path
        return 0

    def create(self, path: str, mode: int, fi: FileInfo) -> int:
        raise FuseError(errno.EROFS)

    def read(self, path: str, size: int, offset: int, fi: FileInfo) -> bytes:
        return self._file(self.handles[fi.fh])[offset:offset + size]

    def write(self, path: str, data: bytes | memoryview, offset: int, fi: FileInfo) -> int:
        raise FuseError(errno.EROFS)

    def append(self, path: str, data: bytes | memoryview, fi: FileInfo) -> int:
        raise FuseError(errno.EROFS)

    def truncate(self, path: str, length: int, fh: FileInfo | None = None) -> int:
        raise FuseError(errno.EROFS)

    def flush(self, path: str, fi: FileInfo) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fi: FileInfo) -> int:
        return 0

    def release(self, path: str, fi: FileInfo) -> int:
        self.handles.pop(fi.fh, None)
        return 0

    def commit_all(self) -> None:
        self.committed += 1

    def status(self, path: str) -> FakeStatus | None:
        self._file(path)
        return FakeStatus(path, "1")

    def read_at(self, info: FakeStatus, size: int, offset: int, changed: Callable[[FakeStatus], None]) -> bytes:
        return self._file(info.path)[offset:offset + size]

    def drop_reader(self, old: FakeStatus, new: FakeStatus | None = None) -> None:
        pass

    def mkdir(self, path: str, mode: int) -> int:
        raise FuseError(errno.EROFS)

    def unlink(self, path: str) -> int:
        raise FuseError(errno.EROFS)

    def rmdir(self, path: str) -> int:
        raise FuseError(errno.EROFS)

    def rename(self, old: str, new: str) -> int:
        raise FuseError(errno.EROFS)


@dataclass(frozen=True)
class Reply:
    error: int  # 0 or a positive errno
    payload: bytes


class Kernel:
    """The kernel's end of the connection: one request, one reply (a packet each, as /dev/fuse)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(REPLY_TIMEOUT)
        self._unique = itertools.count(2, 2)
        self.notified: list[tuple[int, bytes]] = []

    def send(self, opcode: int, body: bytes = b"", nodeid: int = wire.ROOT_ID) -> int:
        unique = next(self._unique)
        self.sock.send(wire.IN_HEADER.pack(wire.IN_HEADER.size + len(body), opcode, unique, nodeid,
                                           1000, 1000, 4242, 0, 0) + body)
        return unique

    def receive(self, unique: int) -> Reply:
        """The reply to request `unique`; the notifications before it are kept in `notified`."""
        while True:
            data = self.sock.recv(MAX_IO + 4096)
            length, error, answered = wire.OUT_HEADER.unpack_from(data)
            assert length == len(data)
            if answered != 0:
                assert answered == unique
                return Reply(-error, data[wire.OUT_HEADER.size:])
            self.notified.append((error, data[wire.OUT_HEADER.size:]))  # its code in the error field

    def notification(self) -> tuple[int, bytes]:
        """The next notification the session sends unasked (code, body)."""
        data = self.sock.recv(MAX_IO + 4096)
        _length, code, answered = wire.OUT_HEADER.unpack_from(data)
        assert answered == 0, "a reply with no request"
        return code, data[wire.OUT_HEADER.size:]

    def request(self, opcode: int, body: bytes = b"", nodeid: int = wire.ROOT_ID) -> Reply:
        return self.receive(self.send(opcode, body, nodeid))

    def init(self, flags: int = wire.ASYNC_READ | wire.BIG_WRITES) -> Reply:
        return self.request(wire.INIT, wire.INIT_IN.pack(7, 40, 128 * 1024, flags))

    def lookup(self, name: str, parent: int = wire.ROOT_ID) -> Reply:
        return self.request(wire.LOOKUP, name.encode() + b"\0", parent)


@dataclass
class Served:
    kernel: Kernel
    files: FakeFiles
    session: Session[FakeStatus]
    inits: list[wire.InitReply]


@pytest.fixture
def served() -> Iterator[Served]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    files = FakeFiles({"/hello.txt": b"hello, world\n" * 100})
    ops: Operations[FakeStatus] = files
    inits: list[wire.InitReply] = []
    session = Session(theirs.fileno(), ops, NodeTable("/"), timeout=1.5, read_only=False, on_init=inits.append)
    session.start(threads=2)
    try:
        yield Served(Kernel(ours), files, session, inits)
    finally:
        ours.close()  # the session reads the end of the file and ends
        waiter = threading.Thread(target=session.wait)
        waiter.start()
        waiter.join(REPLY_TIMEOUT)
        theirs.close()
        assert not waiter.is_alive(), "the session did not end with its connection"


def test_init_agrees_on_the_version_and_the_flags_both_sides_have(served: Served) -> None:
    offered = wire.ASYNC_READ | wire.BIG_WRITES | FLOCK_LOCKS
    reply = served.kernel.init(offered)
    assert reply.error == 0
    major, minor, readahead, flags, _bg, _cong, max_write, _gran, max_pages, _align, flags2, _depth = \
        wire.INIT_OUT.unpack(reply.payload)
    assert (major, minor, readahead, max_write, max_pages) == (7, 40, 128 * 1024, MAX_IO, MAX_IO // 4096)
    assert flags == offered & WANT == wire.ASYNC_READ | wire.BIG_WRITES  # nothing Strata did not ask for
    assert flags2 == 0
    assert [(r.major, r.minor) for r in served.inits] == [(7, 40)]  # a successor is told what was agreed


def test_init_from_another_major_version_fails_and_the_session_goes_on(served: Served) -> None:
    assert served.kernel.request(wire.INIT, wire.INIT_IN.pack(8, 0, 0, 0)).error == errno.EIO
    assert served.inits == []
    assert served.kernel.init().error == 0


def test_lookup_getattr_and_read_reach_the_operations(served: Served) -> None:
    kernel = served.kernel
    kernel.init()
    entry = kernel.lookup("hello.txt")
    assert entry.error == 0
    nodeid, _gen, entry_valid, attr_valid, entry_nsec, attr_nsec = wire.ENTRY_OUT_HEAD.unpack_from(entry.payload)
    assert nodeid != wire.ROOT_ID
    assert (entry_valid, attr_valid, entry_nsec, attr_nsec) == (1, 1, 500_000_000, 500_000_000)
    attr = wire.ATTR.unpack_from(entry.payload, wire.ENTRY_OUT_HEAD.size)
    assert (attr[0], attr[1], attr[9]) == (7, 1300, stat.S_IFREG | 0o644)  # ino, size, mode
    assert (attr[4], attr[7]) == (1_700_000_000, 123_456_789)  # mtime, its nanoseconds

    got = kernel.request(wire.GETATTR, wire.GETATTR_IN.pack(0, 0, 0), nodeid)
    assert got.error == 0
    assert wire.ATTR.unpack_from(got.payload, wire.ATTR_OUT_HEAD.size)[1] == 1300

    opened = kernel.request(wire.OPEN, wire.OPEN_IN.pack(0, 0), nodeid)
    fh, open_flags, _ = wire.OPEN_OUT.unpack(opened.payload)
    assert served.files.handles == {fh: "/hello.txt"}
    assert open_flags == wire.FOPEN_KEEP_CACHE | wire.FOPEN_NOFLUSH  # read-only: close(2) waits for nothing
    read = kernel.request(wire.READ, wire.READ_IN.pack(fh, 7, 5, 0, 0, 0, 0), nodeid)
    assert read == Reply(0, b"world")
    assert kernel.request(wire.RELEASE, wire.RELEASE_IN.pack(fh, 0, 0, 0), nodeid).error == 0
    assert served.files.handles == {}


def test_errors_of_the_operations_are_answered_with_their_errno(served: Served) -> None:
    kernel = served.kernel
    kernel.init()
    assert kernel.lookup("missing") == Reply(errno.ENOENT, b"")   # FuseError
    assert kernel.lookup("gone") == Reply(errno.ENOENT, b"")      # any OSError
    assert kernel.lookup("broken") == Reply(errno.EIO, b"")       # a bug: EIO, logged
    assert kernel.lookup("..") == Reply(errno.EINVAL, b"")        # never a path outside the mount
    assert kernel.request(wire.GETATTR, wire.GETATTR_IN.pack(0, 0, 0), 999).error == errno.ESTALE  # no such node
    assert kernel.lookup("hello.txt").error == 0


@pytest.mark.parametrize("opcode", [wire.SYMLINK, wire.MKNOD, wire.LINK, 4242])
def test_a_request_the_session_does_not_serve_is_answered_enosys(served: Served, opcode: int) -> None:
    served.kernel.init()
    assert served.kernel.request(opcode, b"x\0y\0") == Reply(errno.ENOSYS, b"")
    assert served.kernel.lookup("hello.txt").error == 0


def test_malformed_requests_are_refused_and_the_session_goes_on(served: Served) -> None:
    kernel = served.kernel
    kernel.init()
    kernel.sock.send(b"\x01\x02\x03")  # shorter than a header: nothing to answer
    assert kernel.request(wire.LOOKUP, b"no terminating NUL").error == errno.EIO
    assert kernel.request(wire.GETATTR, b"\x00" * 3).error == errno.EIO  # a body cut short
    assert kernel.request(wire.READ, b"").error == errno.EIO
    entry = kernel.lookup("hello.txt")
    assert entry.error == 0
    nodeid = wire.ENTRY_OUT_HEAD.unpack_from(entry.payload)[0]
    assert kernel.request(wire.GETATTR, wire.GETATTR_IN.pack(0, 0, 0), nodeid).error == 0


def test_forget_is_not_answered(served: Served) -> None:
    kernel = served.kernel
    kernel.init()
    nodeid = wire.ENTRY_OUT_HEAD.unpack_from(kernel.lookup("hello.txt").payload)[0]
    kernel.send(wire.FORGET, wire.FORGET_IN.pack(1), nodeid)
    statfs = kernel.request(wire.STATFS)  # the next reply is this one's
    assert statfs.error == 0
    assert wire.STATFS_OUT.unpack(statfs.payload)[:3] == (100, 40, 40)
    # The session's reader threads take requests in turn, so the STATFS can be answered
    # before another thread has applied the FORGET (the kernel waits for neither).
    wait_until(lambda: nodeid not in served.session.nodes, 10, "the FORGET to drop the node")
    assert kernel.request(wire.GETATTR, wire.GETATTR_IN.pack(0, 0, 0), nodeid).error == errno.ESTALE


def test_destroy_writes_the_open_files(served: Served) -> None:
    served.kernel.init()
    assert served.kernel.request(wire.DESTROY) == Reply(0, b"")
    assert served.files.committed == 1


class ChangingFiles(FakeFiles):
    """Files with a version each, changed by `replace`: a read of another version than the
    file's is refused as Strata's are (the store no longer has it), telling `changed`."""

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(files)
        self.versions = dict.fromkeys(files, 1)

    def replace(self, path: str, data: bytes) -> None:
        self.files[path] = data
        self.versions[path] += 1

    def status(self, path: str) -> FakeStatus | None:
        self._file(path)
        return FakeStatus(path, str(self.versions[path]))

    def read_at(self, info: FakeStatus, size: int, offset: int, changed: Callable[[FakeStatus], None]) -> bytes:
        now = self.status(info.path)
        if now != info:
            assert now is not None
            changed(now)
            raise FuseError(errno.EIO)
        return self._file(info.path)[offset:offset + size]


def test_a_file_changed_under_the_kernel_is_not_read_at_the_size_the_kernel_holds() -> None:
    """A read-only mount lets the kernel open files without asking; its reads are of the
    version the kernel was told of. Once one is refused (the file changed), none is answered
    with the new version until the kernel is told its size: the kernel would cut the new
    version at the old size, or fill the pages past its shorter end with zeros."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    files = ChangingFiles({"/f.bin": b"old version " * 100})
    session = Session(theirs.fileno(), files, NodeTable("/"), timeout=1.5, read_only=True)
    session.start(threads=2)
    kernel = Kernel(ours)
    try:
        kernel.init()
        nodeid = wire.ENTRY_OUT_HEAD.unpack_from(kernel.lookup("f.bin").payload)[0]
        kernel.notified.clear()
        read = wire.READ_IN.pack(0, 0, 4096, 0, 0, 0, 0)  # no file handle: opened by the kernel
        assert kernel.request(wire.READ, read, nodeid) == Reply(0, b"old version " * 100)

        files.replace("/f.bin", b"new")
        assert kernel.request(wire.READ, read, nodeid).error == errno.EIO
        # The kernel drops its pages and attributes (told by another thread: before or after the reply).
        code, body = kernel.notified.pop(0) if kernel.notified else kernel.notification()
        assert (code, wire.NOTIFY_INVAL_INODE_OUT.unpack(body)[0]) == (wire.NOTIFY_INVAL_INODE, nodeid)
        assert kernel.request(wire.READ, read, nodeid).error == errno.EIO  # its size is the old one

        got = kernel.request(wire.GETATTR, wire.GETATTR_IN.pack(0, 0, 0), nodeid)
        assert wire.ATTR.unpack_from(got.payload, wire.ATTR_OUT_HEAD.size)[1] == len(b"new")
        assert kernel.request(wire.READ, read, nodeid) == Reply(0, b"new")
    finally:
        ours.close()
        session.wait()
        theirs.close()


def test_an_ioctl_is_answered_not_a_terminal(served: Served) -> None:
    """Python's buffered open() asks each file whether it is a terminal (TCGETS): the kernel
    passes every ioctl on, and never remembers an answer."""
    served.kernel.init()
    tcgets = wire.IOCTL_IN.pack(0, 0, 0x5401, 0, 0, 60)
    assert served.kernel.request(wire.IOCTL, tcgets, 5) == Reply(errno.ENOTTY, b"")
    assert served.kernel.lookup("hello.txt").error == 0  # served on


def test_past_its_node_limit_the_kernel_is_asked_to_drop_the_least_recent_entries() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    files = FakeFiles({f"/f{i}": b"x" * i for i in range(30)})
    nodes = NodeTable("/", limit=21)  # 20 files and the root
    session = Session(theirs.fileno(), files, nodes, timeout=1.5, read_only=True)
    session.start(threads=2)
    kernel = Kernel(ours)
    try:
        kernel.init()
        ids = [wire.ENTRY_OUT_HEAD.unpack_from(kernel.lookup(f"f{i}").payload)[0] for i in range(22)]
        # The two past the limit and a twentieth of it more (one): the three looked up first.
        dropped = []
        while len(dropped) < 3:
            code, body = kernel.notified.pop(0) if kernel.notified else kernel.notification()
            if code == wire.NOTIFY_INVAL_ENTRY:
                parent, size, _ = wire.NOTIFY_INVAL_ENTRY_OUT.unpack_from(body)
                dropped.append((parent, body[wire.NOTIFY_INVAL_ENTRY_OUT.size:]))
        assert dropped == [(wire.ROOT_ID, b"f0\0"), (wire.ROOT_ID, b"f1\0"), (wire.ROOT_ID, b"f2\0")]
        assert len(nodes) == 23  # kept until the kernel forgets them
        kernel.send(wire.BATCH_FORGET, wire.BATCH_FORGET_IN.pack(3, 0)
                    + b"".join(wire.FORGET_ONE.pack(nodeid, 1) for nodeid in ids[:3]))
        assert kernel.lookup("f3").error == 0  # in order after the forget
        assert len(nodes) == 20 and ids[0] not in nodes
        again = kernel.lookup("f0")  # looked up anew: a new node, read right
        assert again.error == 0 and wire.ENTRY_OUT_HEAD.unpack_from(again.payload)[0] not in ids
    finally:
        ours.close()
        session.wait()
        theirs.close()
