"""The reader's side of the worker's block sockets (protocol: `blockwire`): block bytes
from the data port over TCP, received straight into the memory that is handed to the reader;
and, on the worker's host, block files' descriptors from the short-circuit socket.

No wait is unbounded (`Patience`): a worker silent for `check_after` seconds is asked whether
it is alive; one that is not (stopped, hung), or that takes longer than `block_timeout`,
raises `WorkerStalled`, and the caller moves on to the next worker.
"""

from __future__ import annotations

import mmap
import os
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..blockwire import check_reply, request_line
from ..errors import StrataError, Unavailable
from ..proto import strata_pb2 as pb

T = TypeVar("T")


class WorkerStalled(Unavailable):
    """The worker stopped answering in the middle of a request: try another one."""


@dataclass(frozen=True)
class Patience:
    """How long to wait on a worker (seconds; see `ClientSettings`)."""

    connect_timeout: float
    check_after: float  # silence before asking `alive`
    block_timeout: float  # the most one request may take
    alive: Callable[[], bool]  # does the worker still answer? (its health check)


class _BlockSocketClient(ABC):
    """One connection per thread to one worker socket; a request line out, a reply line in."""

    def __init__(self, where: str, token: str, patience: Patience) -> None:
        self.where = where
        self._token = token
        self._patience = patience
        self._local = threading.local()

    @abstractmethod
    def _connect(self) -> socket.socket:
        """A new connection to the worker's socket."""

    def _conn(self) -> tuple[socket.socket, bytearray]:
        conn: tuple[socket.socket, bytearray] | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                sock = self._connect()
            except OSError as exc:
                raise Unavailable(f"block socket {self.where}: {exc.strerror or exc}") from exc
            sock.settimeout(self._patience.check_after)
            conn = (sock, bytearray())  # bytes received past the reply line
            self._local.conn = conn
            self._local.used = False
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn[0].close()
            self._local.conn = None

    def _patiently(self, receive: Callable[[], T], since: float) -> T:
        """`receive()`, called again while the worker is silent but alive and the request
        (started at `since`) is within its deadline; WorkerStalled otherwise."""
        while True:
            try:
                return receive()
            except TimeoutError:
                waited = time.monotonic() - since
                if waited >= self._patience.block_timeout:
                    raise WorkerStalled(
                        f"worker at {self.where} took over {waited:.1f}s for one block "
                        f"(STRATA_CLIENT_BLOCK_TIMEOUT={self._patience.block_timeout:g})"
                    ) from None
                if not self._patience.alive():
                    raise WorkerStalled(
                        f"worker at {self.where} went silent for {waited:.1f}s and does not answer "
                        "its health check (stopped or hung)"
                    ) from None

    def _receive(self, sock: socket.socket, pending: bytearray) -> list[int]:
        """More bytes into `pending`; descriptors that came with them."""
        data = sock.recv(65536)
        if not data:
            raise Unavailable(f"block socket {self.where} closed by the worker")
        pending.extend(data)
        return []

    def _exchange(self, request: bytes) -> tuple[dict[str, Any], bytearray, list[int]]:
        """Send a request, return the reply, the connection's pending bytes (the reply's
        payload starts there) and any descriptors received. Error replies raise; the caller
        owns the descriptors. A kept connection the worker has closed since (it restarted)
        gets one retry on a new one."""
        since = time.monotonic()
        while True:
            sock, pending = self._conn()
            reused = self._local.used
            self._local.used = True
            fds: list[int] = []
            try:
                sock.sendall(request)
                while b"\n" not in pending:
                    fds += self._patiently(lambda: self._receive(sock, pending), since)
                break
            except (OSError, Unavailable) as exc:
                self._drop()
                for fd in fds:
                    os.close(fd)
                if reused and not pending and not isinstance(exc, WorkerStalled):
                    continue
                if isinstance(exc, Unavailable):
                    raise
                raise Unavailable(f"block request over {self.where} failed: {exc}") from exc
        end = pending.index(b"\n")
        line = bytes(pending[:end])
        del pending[:end + 1]
        try:
            return check_reply(line), pending, fds
        except StrataError:
            for fd in fds:
                os.close(fd)
            raise

    def close(self) -> None:
        self._drop()


class DataReader(_BlockSocketClient):
    """Block bytes from a worker's data port."""

    def __init__(self, host: str, port: int, token: str, patience: Patience) -> None:
        super().__init__(f"{host}:{port}", token, patience)
        self._address = (host, port)

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self._address, timeout=self._patience.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def read(self, ref: pb.BlockRef, offset: int, length: int, read_type: int = 0, readahead: int = 0) -> mmap.mmap | bytes:
        """Bytes [offset, offset+length) of the block, in a private anonymous map the socket
        fills directly (one copy, by the kernel); slicing it copies only what is sliced."""
        since = time.monotonic()
        reply, pending, _ = self._exchange(
            request_line(self._token, ref, read_type, offset=offset, length=length, readahead=readahead)
        )
        size = int(reply["length"])
        if size == 0:
            return b""
        out = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        # Huge pages: a new 16 MiB block takes 8 page faults instead of 4096 (3-4x faster to
        # fill, and fewer TLB misses for whoever reads it).
        out.madvise(mmap.MADV_HUGEPAGE)
        got = min(len(pending), size)
        out[:got] = pending[:got]
        del pending[:got]
        view = memoryview(out)
        sock = self._conn()[0]
        try:
            while got < size:
                n = self._patiently(lambda: sock.recv_into(view[got:]), since)
                if n == 0:
                    raise Unavailable(f"worker {self.where} closed the connection after {got} of {size} bytes")
                got += n
        except Unavailable:  # WorkerStalled included: it must keep its type
            self._drop()
            raise
        except OSError as exc:
            self._drop()
            raise Unavailable(f"reading block {ref.index} of {ref.path} from {self.where}: {exc}") from exc
        finally:
            view.release()
        return out


class ShortCircuitReader(_BlockSocketClient):
    """Block files of the worker on this host, read directly."""

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self._patience.connect_timeout)
        try:
            sock.connect(self.where)
        except OSError:
            sock.close()
            raise
        return sock

    def _receive(self, sock: socket.socket, pending: bytearray) -> list[int]:
        data, fds, _, _ = socket.recv_fds(sock, 65536, 1)
        if not data:
            for fd in fds:
                os.close(fd)
            raise Unavailable(f"short-circuit socket {self.where} closed by the worker")
        pending.extend(data)
        return list(fds)

    def _open(self, ref: pb.BlockRef, read_type: int) -> tuple[int, int]:
        """The block's file descriptor and length; the caller closes the descriptor."""
        reply, _, fds = self._exchange(request_line(self._token, ref, read_type))
        if not fds:
            raise Unavailable(f"the worker at {self.where} answered without a file descriptor")
        for extra in fds[1:]:
            os.close(extra)
        return fds[0], int(reply["length"])

    def map(self, ref: pb.BlockRef, read_type: int = 0) -> mmap.mmap | bytes:
        """The whole block, mapped read-only from the worker's block file: slicing it copies
        only what is sliced, as a read from the page cache does."""
        fd, length = self._open(ref, read_type)
        try:
            if length == 0:
                return b""
            return mmap.mmap(fd, length, prot=mmap.PROT_READ)
        finally:
            os.close(fd)

    def read(self, ref: pb.BlockRef, offset: int, length: int, read_type: int = 0) -> bytes:
        """Bytes [offset, offset+length) of the block, from the worker's block file."""
        fd, available = self._open(ref, read_type)
        try:
            if offset > available:
                raise StrataError(f"offset {offset} is past the end of block {ref.index} ({available} bytes)")
            want = min(length, available - offset)
            data = os.pread(fd, want, offset)
            if len(data) != want:
                raise Unavailable(f"block {ref.index} of {ref.path}: short read from the worker's file")
            return data
        finally:
            os.close(fd)
