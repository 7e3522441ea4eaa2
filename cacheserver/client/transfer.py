"""The reader's side of the worker's block sockets (protocol: `blockwire`): block bytes
from the data port over TCP, received straight into the memory that is handed to the reader;
and, on the worker's host, block files' descriptors from the short-circuit socket. A block
file is read as a local file is, one copy into the reader's memory, range by range as the
reader asks (`LocalBlock`), and each range's chunks are verified there against the checksums
the worker sends (the files are on the node's disk, which may flip bits like any other): the
bytes checked are the bytes returned, whatever happens to the file after.

No wait is unbounded (`Patience`): a worker silent for `check_after` seconds is asked whether
it is alive; one that is not (stopped, hung), or that takes longer than `block_timeout`,
raises `WorkerStalled`, and the caller moves on to the next worker.
"""

from __future__ import annotations

import logging
import mmap
import os
import socket
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from strata.contract.errors import DataLoss, StrataError, Unavailable
from strata.contract.proto import strata_pb2 as pb
from ..common.blockwire import (DamagedInTransit, check_pieces, check_reply, file_of, list_line, listing_of, open_line,
                               request_line, table_line)
from ..common.checksums import chunk_span
from .. import native
from ..native import BlockFile

log = logging.getLogger(__name__)

_T = TypeVar("_T")


def block_ref(info: pb.FileInfo, index: int) -> pb.BlockRef:
    """The name of block `index` of the file as `info` describes it."""
    return pb.BlockRef(mount_id=info.mount_id, path=info.path, version=info.version, index=index,
                       block_size=info.block_size, file_length=info.length, in_store=info.persisted)


def opened_file(reply: dict[str, Any], where: str) -> pb.FileInfo:
    """The status an open's reply carries (Unavailable if none that parses)."""
    try:
        return file_of(reply)
    except ValueError as exc:
        raise Unavailable(f"the worker at {where} answered an open without a file status: {exc}") from exc


class WorkerStalled(Unavailable):
    """The worker stopped answering in the middle of a request: try another one."""


@dataclass(frozen=True)
class Patience:
    """How long to wait on a worker (seconds; see `ClientSettings`)."""

    connect_timeout: float
    check_after: float  # silence before asking `alive`
    block_timeout: float  # the most one request may take
    alive: Callable[[], bool]  # does the worker still answer? (its health check)


class BufferPool:
    """Buffers ranges are read into (private anonymous maps: a short-circuit range for
    pyarrow, a data-port block whose bytes did not come at once), used again once nothing
    refers to them. A new map costs the kernel a zeroed page for every page it touches
    (clearing 16 MiB took more of a reader's CPU than receiving it); a map used before has
    its pages.

    A buffer is free when the pool holds the only reference to it: every holder of its bytes
    (a block kept by a file object, a memoryview of it, a buffer exported to pyarrow or
    numpy) holds a reference, so a buffer anyone can still read is never handed out again.
    The pool keeps at most `count` buffers of at least `min_size` bytes (smaller reads get
    new maps); a free one idle for `idle_seconds`, or of another size when the pool is full,
    is let go when a new one is made.

    Ranges (`view`) take a free map at least as large, up to twice (new ones are made a power
    of two long, so ranges of varying lengths find one; a page past what a range fills is never
    touched); one over `max_view` bytes gets a map of its own, not kept."""

    def __init__(self, count: int = 32, min_size: int = 1 << 20, idle_seconds: float = 30.0,
                 max_view: int = 32 << 20) -> None:
        self._count = count
        self._min_size = min_size
        self._idle_seconds = idle_seconds
        self._max_view = max_view
        self._lock = threading.Lock()
        self._maps: list[mmap.mmap] = []
        self._used: list[float] = []  # time.monotonic() each was last handed out

    def _free(self, i: int) -> bool:
        # 2: the list's reference and getrefcount's argument. Only read under the lock:
        # nothing outside the pool can gain a reference to a free map.
        return sys.getrefcount(self._maps[i]) == 2

    def take(self, size: int) -> mmap.mmap:
        """A map of exactly `size` bytes that nobody else refers to (contents undefined)."""
        if size < self._min_size:
            return _new_map(size)
        return self._take(size, size, size)

    def view(self, size: int) -> memoryview:
        """A writable view of `size` bytes of a map that nobody else refers to (contents
        undefined), for a range to be read into: the view holds the map, which is not handed
        out again while it (or any slice or export of it) lives."""
        if size < self._min_size:
            return memoryview(bytearray(size))
        if size > self._max_view:
            return memoryview(_new_map(size))
        return memoryview(self._take(size, 2 * size - 1, 1 << (size - 1).bit_length()))[:size]

    def _take(self, least: int, most: int, new: int) -> mmap.mmap:
        """A free map of `least` to `most` bytes, else a new one of `new` bytes."""
        now = time.monotonic()
        with self._lock:
            free = [i for i in range(len(self._maps)) if self._free(i)]
            fits = [i for i in free if least <= len(self._maps[i]) <= most]
            if fits:
                i = min(fits, key=lambda i: len(self._maps[i]))
                self._used[i] = now
                return self._maps[i]
            stale = [i for i in free if now - self._used[i] > self._idle_seconds]
            if len(self._maps) - len(stale) >= self._count and len(stale) < len(free):
                stale.append(next(i for i in free if i not in stale))
            for i in sorted(stale, reverse=True):
                self._maps.pop(i).close()
                self._used.pop(i)
            out = _new_map(new)
            if len(self._maps) < self._count:
                self._maps.append(out)
                self._used.append(now)
            return out

    def clear(self) -> None:
        """Let go of every buffer: free ones are unmapped now, ones in use when their last
        holder drops them."""
        with self._lock:
            for i in range(len(self._maps)):
                if self._free(i):
                    self._maps[i].close()
            self._maps.clear()
            self._used.clear()


def _new_map(size: int) -> mmap.mmap:
    out = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # Huge pages: a new 16 MiB block takes 8 page faults instead of 4096 (3-4x faster to
    # fill, and fewer TLB misses for whoever reads it).
    out.madvise(mmap.MADV_HUGEPAGE)
    return out


class _BlockSocketClient(ABC):
    """One connection per thread to one worker socket; a request line out, a reply line in."""

    def __init__(self, where: str, token: str, patience: Patience, client: str = "") -> None:
        self.where = where
        self._token = token
        self._client = client  # the kind of reader the worker counts this one's bytes under
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

    def _patiently(self, receive: Callable[[], _T], since: float) -> _T:
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

    def _send_and_receive(self, sock: socket.socket, request: bytes, pending: bytearray, fds: list[int],
                          since: float) -> None:
        """Send the request and receive through the reply line into `pending` (and the
        descriptors sent along into `fds`), waiting as `Patience` says. Both are done by the
        compiled core, which lets go of the GIL once for them rather than once a system call:
        a thread fetching blocks ahead of a reader busy in Python takes the GIL back only
        after up to the switch interval (5 ms) each time."""
        unsent = [request]

        def receive() -> list[int]:
            data, received, status = self._native_exchange(sock.fileno(), unsent.pop() if unsent else None)
            pending.extend(data)
            fds.extend(received)
            if status == native.CLOSED:
                raise Unavailable(f"block socket {self.where} closed by the worker")
            if status == native.TIMED_OUT:
                raise TimeoutError
            return []

        self._patiently(receive, since)

    @abstractmethod
    def _native_exchange(self, fd: int, request: bytes | None) -> tuple[bytes, list[int], int]:
        """One call of the compiled core's exchange on this kind of socket: (bytes received,
        descriptors received, native.COMPLETE / TIMED_OUT / CLOSED)."""

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
                self._send_and_receive(sock, request, pending, fds, since)
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

    def list_folder(self, path: str) -> tuple[list[pb.FileInfo], float] | bool:
        """The statuses of the entries of the folder at `path` as the worker keeps them, and
        how long ago it asked the master for them (`blockwire`); False when the folder's
        answers are not reusable, True when it is too large to be listed this way."""
        reply, _, fds = self._exchange(list_line(self._token, path, client=self._client))
        for fd in fds:
            os.close(fd)
        try:
            return listing_of(reply)
        except ValueError as exc:
            raise Unavailable(f"the worker at {self.where} answered a listing of {path} with: {exc}") from exc

    def close(self) -> None:
        self._drop()


class DataReader(_BlockSocketClient):
    """Block bytes from a worker's data port."""

    def __init__(self, host: str, port: int, token: str, patience: Patience, buffers: BufferPool | None = None,
                 client: str = "") -> None:
        super().__init__(f"{host}:{port}", token, patience, client)
        self._address = (host, port)
        self._buffers = buffers or BufferPool()

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self._address, timeout=self._patience.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _native_exchange(self, fd: int, request: bytes | None) -> tuple[bytes, list[int], int]:
        # The reply line and none past it: the payload that follows stays in the socket, to
        # be received whole into the object handed to the reader (`_payload`).
        line, status = native.exchange(fd, request, self._patience.check_after)
        return line, [], status

    def read(self, ref: pb.BlockRef, offset: int, length: int, read_type: int = 0, readahead: int = 0) -> mmap.mmap | bytes:
        """Bytes [offset, offset+length) of the block, in the bytes object the socket fills
        directly (one copy, by the kernel; a map of the pool when they come in pieces, see
        `_payload`); slicing a view of it copies only what is sliced."""
        since = time.monotonic()
        reply, pending, _ = self._exchange(
            request_line(self._token, ref, read_type, client=self._client, offset=offset, length=length,
                         readahead=readahead)
        )
        return self._payload(reply, pending, since, f"block {ref.index} of {ref.path}")

    def open_path(self, path: str, read_type: int, *, whole_below: int,
                  fetch: bool) -> tuple[pb.FileInfo, mmap.mmap | bytes | None]:
        """The status of the file at `path` as the worker answers it (`blockwire`) and, when
        it came with it, the whole file's bytes, checked."""
        since = time.monotonic()
        reply, pending, _ = self._exchange(open_line(self._token, path, read_type, whole_below=whole_below,
                                                     fetch=fetch, client=self._client))
        info = opened_file(reply, self.where)
        if not reply.get("block"):
            return info, None
        return info, self._payload(reply, pending, since, f"{path}")

    def _payload(self, reply: dict[str, Any], pending: bytearray, since: float, what: str) -> mmap.mmap | bytes:
        """The bytes that follow an ok reply, checked against the reply's checksums: received
        whole by the kernel into the bytes object returned (a reader that reads whole blocks
        gets them with no copy of its own), or, when they do not all come within
        `check_after` (or a signal cuts the wait), into a map of the pool, waiting on as
        `Patience` says."""
        size = int(reply["length"])
        if size == 0:
            return b""
        sock = self._conn()[0]
        checksums = reply.get("checksums", ())
        chunk_size = int(reply.get("chunk_size", 0))
        first = bytes(pending[:size])  # none: `_native_exchange` leaves the payload in the socket
        del pending[:size]
        if not first and chunk_size > 0 and len(checksums) == -(-size // chunk_size):
            data, got, bad, status = self._receive_checked(sock, size, checksums, chunk_size, what)
            if got == size and bad is None:
                return data
            first = data if got == size else data[:got]
            if status == native.CLOSED:
                self._drop()
                raise Unavailable(f"worker {self.where} closed the connection after {got} of {size} bytes of {what}")
        out: mmap.mmap | bytes = first
        if len(first) < size:
            out = self._buffers.take(size)
            out[:len(first)] = first
            self._receive_rest(sock, out, len(first), since, what)
        try:
            check_pieces(out, checksums, chunk_size, f"{what} from {self.where}")
        except DamagedInTransit:
            self._drop()
            raise
        return out

    def _receive_checked(self, sock: socket.socket, size: int, checksums: Sequence[int], chunk_size: int,
                         what: str) -> tuple[bytes, int, int | None, int]:
        """Up to `size` bytes of the connection in one bytes object, received and checked by
        the compiled core with the GIL let go once: all of them unless the worker is silent
        for `check_after` (the rest is waited on patiently by the caller). Returns the bytes
        (only the first `got` are the payload's), got, the first chunk that failed its
        checksum, and how the receive ended (native.COMPLETE / TIMED_OUT / CLOSED)."""
        try:
            return native.receive_checked(sock.fileno(), size, checksums, chunk_size, self._patience.check_after)
        except OSError as exc:
            self._drop()
            raise Unavailable(f"reading {what} from {self.where}: {exc}") from exc

    def _receive_rest(self, sock: socket.socket, out: mmap.mmap, got: int, since: float, what: str) -> None:
        """Bytes [got, len(out)) of a payload into `out`, as patiently as `Patience` says."""
        size = len(out)
        view = memoryview(out)
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
            raise Unavailable(f"reading {what} from {self.where}: {exc}") from exc
        finally:
            view.release()


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

    def _native_exchange(self, fd: int, request: bytes | None) -> tuple[bytes, list[int], int]:
        return native.exchange_fds(fd, request, self._patience.check_after, 2)

    def _open(self, ref: pb.BlockRef, read_type: int, verify: bool) -> BlockFile:
        """The block's file, length and checksums. `verify` has the worker check the whole
        block first."""
        extra = {"verify": 1} if verify else {}
        reply, _, fds = self._exchange(request_line(self._token, ref, read_type, client=self._client, **extra))
        return self._block_of(reply, fds, ref)

    def _block_of(self, reply: dict[str, Any], fds: list[int], ref: pb.BlockRef) -> BlockFile:
        """The block file an ok reply handed over (the first descriptor, which the returned
        object holds a duplicate of; all those received are closed)."""
        if not fds:
            raise Unavailable(f"the worker at {self.where} answered without a file descriptor")
        try:
            length, chunk_size = int(reply["length"]), int(reply.get("chunk_size", 0))
            checksums = reply.get("checksums", ())
            if chunk_size <= 0 or len(checksums) != -(-length // chunk_size):
                raise Unavailable(f"the worker at {self.where} sent no checksums for block {ref.index} of {ref.path}")
            try:
                return BlockFile(fds[0], length, checksums, chunk_size)
            except (ValueError, TypeError, OverflowError) as e:
                raise Unavailable(f"the worker at {self.where} described block {ref.index} of {ref.path} "
                                  f"wrongly: {e}") from None
        finally:
            for fd in fds:
                os.close(fd)

    def _verified(self, ref: pb.BlockRef, read_type: int, read: Callable[[BlockFile], _T | None]) -> _T:
        """`read(block)` of the block file, which returns what it read or None when a chunk
        failed its checksum (or the file is shorter than the block). After a failure the
        worker checks the block, dropping a damaged copy and fetching the block again, and
        the read is tried once more; DataLoss if it fails again."""
        for verify in (False, True):
            block = self._open(ref, read_type, verify)
            try:
                result = read(block)
            finally:
                block.close()
            if result is not None:
                return result
            log.warning("block %d of %s from the worker at %s: a chunk failed its CRC-32C check%s",
                        ref.index, ref.path, self.where, "" if verify else "; asking the worker to check it")
        raise DataLoss(f"block {ref.index} of {ref.path} from the worker at {self.where}: a chunk failed "
                       "its CRC-32C check again after the worker checked the block")

    def hold(self, ref: pb.BlockRef, read_type: int = 0) -> LocalBlock | bytes:
        """The block's file, held open for ranges to be read from it (`LocalBlock`); the
        worker fetches the block first if it does not hold it."""
        block = self._open(ref, read_type, False)
        if block.length == 0:
            return b""
        return LocalBlock(self, ref, read_type, block)

    def open_path(self, path: str, read_type: int, *, whole_below: int,
                  fetch: bool) -> tuple[pb.FileInfo, LocalBlock | bytes | None]:
        """The status of the file at `path` as the worker answers it (`blockwire`) and, when
        it came with it, its only block's file, held open as `hold` holds one."""
        reply, _, fds = self._exchange(open_line(self._token, path, read_type, whole_below=whole_below, fetch=fetch,
                                                 client=self._client))
        try:
            info = opened_file(reply, self.where)
        except Unavailable:
            for fd in fds:
                os.close(fd)
            raise
        if not reply.get("block"):
            for fd in fds:
                os.close(fd)
            return info, None
        ref = block_ref(info, 0)
        block = self._block_of(reply, fds, ref)
        if block.length == 0:
            return info, b""
        return info, LocalBlock(self, ref, read_type, block)

    def status_table(self) -> int:
        """A read-only descriptor of the node's status table (`statustable`); the caller
        owns it. Unavailable when the worker sends none."""
        status, data = self.node_tables()
        if data is not None:
            os.close(data)
        return status

    def node_tables(self) -> tuple[int, int | None]:
        """Read-only descriptors of the node's status table and of its data table
        (`datatable`; None when the worker keeps none); the caller owns them. Unavailable
        when the worker sends no status table."""
        reply, _, fds = self._exchange(table_line(self._token, client=self._client))
        for fd in fds[2:]:
            os.close(fd)
        if not fds:
            raise Unavailable(f"the worker at {self.where} answered {reply} without the status table's descriptor")
        return fds[0], fds[1] if len(fds) > 1 else None

    def read(self, ref: pb.BlockRef, offset: int, length: int, read_type: int = 0) -> bytes:
        """Bytes [offset, offset+length) of the block, from the worker's block file; the
        chunks they lie in are verified."""

        def read(block: BlockFile) -> bytes | None:
            if offset > block.length:
                raise StrataError(f"offset {offset} is past the end of block {ref.index} ({block.length} bytes)")
            want = min(length, block.length - offset)
            start, stop = chunk_span(offset, want, block.chunk_size, block.length)
            data = block.read(start, stop, ahead=False)
            return None if data is None else data[offset - start:offset - start + want]

        return self._verified(ref, read_type, read)


class LocalBlock:
    """A block file of the worker on this host, held open while a reader reads from it:
    each range asked for is read from the file (one copy, as a read of a local file would
    make) and its chunks are checked against the block's checksums before it is returned, so
    what the file holds later, damaged or not, never reaches the reader unchecked. Both run
    in the compiled core (`native.BlockFile`) without the interpreter's lock, and a reader
    going through the block in order has its next range read and checked meanwhile. A range
    whose chunks fail is read again through the worker, which checks the block (dropping a
    damaged copy and fetching it anew). The file is closed when the last holder lets go of
    the object."""

    def __init__(self, reader: ShortCircuitReader, ref: pb.BlockRef, read_type: int, block: BlockFile) -> None:
        self._reader = reader
        self._ref = ref
        self._read_type = read_type
        self._block = block
        self._damaged = False

    def __len__(self) -> int:
        return self._block.length

    def sound(self) -> bool:
        """Whether a later open may read the block from this file again: no range of it
        failed its check, and the worker still keeps the file (client/heldblocks.py)."""
        return not self._damaged and self._block.linked()

    def stop_reading_ahead(self) -> None:
        """Let go of a range read ahead (a reader is done with the block for now); the file
        stays open."""
        self._block.close()

    def _failed(self) -> None:
        self._damaged = True  # the worker checks it; later ranges go through it too
        log.warning("block %d of %s from the worker at %s: a chunk failed its CRC-32C check; asking the "
                    "worker to check it", self._ref.index, self._ref.path, self._reader.where)

    def read(self, start: int, end: int) -> bytes | memoryview:
        """Bytes [start, end) of the block, checked (a view when they are part of the
        chunks read)."""
        block = self._block
        end = min(end, block.length)
        if start >= end:
            return b""
        if not self._damaged:
            lo, hi = chunk_span(start, end - start, block.chunk_size, block.length)
            data = block.read(lo, hi)
            if data is not None:
                return data if (lo, hi) == (start, end) else memoryview(data)[start - lo:end - lo]
            self._failed()
        return self._reader.read(self._ref, start, end - start, self._read_type)

    def read_into(self, start: int, end: int, out: memoryview) -> None:
        """Bytes [start, end) of the block into `out` (of that length), checked there: the
        whole chunks among them are read straight into `out` (one copy, by the kernel) and
        checked in place; the partial chunks at either end, and any range whose check fails
        (read again through the worker, see `read`), come through `read`."""
        chunk = self._block.chunk_size
        end = min(end, self._block.length)
        first = -(-start // chunk) * chunk  # the whole chunks: [first, last)
        last = end if end == self._block.length else end // chunk * chunk
        if self._damaged or first >= last:
            out[:end - start] = self.read(start, end)
            return
        if start < first:
            out[:first - start] = self.read(start, first)
        middle = out[first - start:last - start]
        if not self._block.read_into(middle, first):
            self._failed()
            middle[:] = self.read(first, last)
        if last < end:
            out[last - start:end - start] = self.read(last, end)


