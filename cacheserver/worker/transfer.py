"""The worker's block sockets: the data port (TCP, block bytes sent from the block file by
sendfile(2), so the kernel copies them once; a range off the file's checksum chunks from the
bytes checked in memory) and the short-circuit socket (Unix, the block file's descriptor for
readers on this host). Both speak the protocol of `blockwire`.

Each connection gets a thread: a request waits on the worker's event loop only to find or
fetch its block, and the bytes move without holding the loop or the GIL. Connections are
bounded (`dataPort.maxConnections`: one more gets an UNAVAILABLE reply and is closed) and so
is idle time (`dataPort.idleTimeout`: no whole next request, or a reader that takes no bytes,
for that long closes the connection), so idle or trickling readers cannot pile up threads.
A connection the worker cannot take (out of descriptors) waits in the listen queue while the
accept loop pauses, and is served once descriptors are free again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import struct
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from strata.contract.config import DataPortSettings
from strata.contract.errors import StrataError
from strata.contract.proto import strata_pb2 as pb
from ..auth import BLOCK_SOCKET, Credentials, check_access
from ..common.blockwire import (MAX_REQUEST_BYTES, block_of, client_label, error_reply, listing_reply, ok_reply, parse_line,
                               reply_line, with_file)
from ..common.checksums import CHUNK_SIZE
from .keptopens import KeptOpens
from .reads import BlockReads, BlockSource

log = logging.getLogger(__name__)

# Seconds the accept loop pauses when the process is out of descriptors or memory for a new
# connection: waiting connections stay in the listen queue meanwhile.
ACCEPT_RETRY_DELAY = 1.0
# accept(2) errors of one connection (it was reset while queued): take the next one.
_ACCEPT_SKIP = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN})


class RequestTooLarge(Exception):
    """A request line over MAX_REQUEST_BYTES."""


def read_request(conn: socket.socket, pending: bytearray, timeout: float) -> bytes:
    """The next request line from `conn` (`pending`: bytes received past the previous one),
    b"" when the reader closed the connection. The whole line must arrive within `timeout`
    seconds, not each piece of it: TimeoutError otherwise (a reader that trickles a byte now
    and then holds its thread no longer than one that sends nothing); RequestTooLarge past
    MAX_REQUEST_BYTES."""
    deadline = time.monotonic() + timeout
    while (end := pending.find(b"\n")) < 0:
        if len(pending) > MAX_REQUEST_BYTES:
            raise RequestTooLarge()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError()
        conn.settimeout(remaining)
        data = conn.recv(65536)
        if not data:
            return b""
        pending += data
    if end >= MAX_REQUEST_BYTES:
        raise RequestTooLarge()
    line = bytes(pending[:end + 1])
    del pending[:end + 1]
    return line


class BlockSocketServer(ABC):
    """Accepts connections on a listening socket; a thread per connection reads request
    lines and answers each with `_serve_one`: a thin adapter over the worker's reads, which
    find (or fetch) the block."""

    name = "block-socket"
    # The path its bytes are counted under (`reads.SERVED_PATHS`).
    served_path = ""
    # Whether a block goes out as its file's descriptor (a reader on this host), not its bytes.
    sends_descriptors = False

    def __init__(self, reads: BlockReads, credentials: Credentials, loop: asyncio.AbstractEventLoop,
                 settings: DataPortSettings) -> None:
        self._reads = reads
        self._credentials = credentials
        self._loop = loop
        self._settings = settings
        self._sock: socket.socket | None = None
        self._closing = False
        self._slots = threading.BoundedSemaphore(settings.max_connections)
        self._kept_opens = KeptOpens(reads, loop)
        self.requests = 0  # request lines served (for the workers' metrics), under _counting
        self._counting = threading.Lock()

    def _listen(self, sock: socket.socket) -> None:
        sock.listen(128)
        self._sock = sock
        threading.Thread(target=self._accept_loop, name=f"{self.name}-accept", daemon=True).start()

    def stop(self) -> None:
        self._closing = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._closing:
            try:
                conn, _ = self._sock.accept()
            except OSError as exc:
                if self._closing:
                    return
                if exc.errno in _ACCEPT_SKIP:
                    continue
                # Out of descriptors (EMFILE, ENFILE) or memory: the connection waits in the
                # listen queue, and the loop goes on once the process has room again.
                log.warning("%s socket cannot accept a connection: %s; trying again in %gs",
                            self.name, exc, ACCEPT_RETRY_DELAY)
                time.sleep(ACCEPT_RETRY_DELAY)
                continue
            if not self._slots.acquire(blocking=False):
                self._refuse(conn)
                continue
            try:
                self._configure(conn)
                threading.Thread(target=self._serve, args=(conn,), name=f"{self.name}-conn", daemon=True).start()
            except (OSError, RuntimeError) as exc:  # no thread to be had: the reader is told, the socket lives
                self._slots.release()
                log.warning("%s: cannot serve a new connection: %s", self.name, exc)
                conn.close()

    def _refuse(self, conn: socket.socket) -> None:
        """Answer a connection past the limit and close it; the reader falls back to gRPC."""
        limit = self._settings.max_connections
        with conn, contextlib.suppress(OSError):
            conn.settimeout(1.0)
            self._send_reply(conn, error_reply(
                "UNAVAILABLE",
                f"worker {self.name} socket is serving its limit of {limit} connections "
                "(dataPort.maxConnections); read this block over gRPC or retry later",
            ))

    def _configure(self, conn: socket.socket) -> None:
        idle = self._settings.idle_timeout
        # A reader that takes no bytes of a reply for idle_timeout fails the send (the kernel's
        # timeout: sendfile and sendall stay blocking calls).
        seconds = int(idle)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                        struct.pack("ll", seconds, int((idle - seconds) * 1_000_000)))
        if conn.family != socket.AF_UNIX:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # reply and bytes at once
            # A reader whose host vanished is noticed within ~2 minutes, and its thread ends.
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 60)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 6)

    def _serve(self, conn: socket.socket) -> None:
        idle = self._settings.idle_timeout
        pending = bytearray()
        try:
            with conn:
                while True:
                    try:
                        line = read_request(conn, pending, idle)
                    except TimeoutError:
                        if pending:  # a request began and did not end in time: say why it is cut off
                            self._last_reply(conn, error_reply(
                                "DEADLINE_EXCEEDED", f"the request did not arrive whole within {idle:g}s "
                                "(dataPort.idleTimeout); connection closed"))
                        log.debug("%s connection idle for %ss: closed", self.name, idle)
                        return
                    except RequestTooLarge:
                        self._last_reply(conn, error_reply(
                            "INVALID_ARGUMENT", f"request too large: over {MAX_REQUEST_BYTES} bytes"))
                        return
                    except OSError as exc:
                        log.debug("%s connection ended: %s", self.name, exc)
                        return
                    if not line:
                        return
                    conn.settimeout(None)  # replies block; SO_SNDTIMEO bounds a stalled reader
                    try:
                        self._serve_one(conn, line)
                    except OSError as exc:  # the reader went away or stopped taking bytes
                        log.debug("%s connection ended: %s", self.name, exc)
                        return
        finally:
            self._slots.release()

    def _last_reply(self, conn: socket.socket, reply: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            conn.settimeout(None)  # SO_SNDTIMEO bounds the send
            self._send_reply(conn, reply)

    def _serve_one(self, conn: socket.socket, line: bytes) -> None:
        file: pb.FileInfo | None = None
        with self._counting:
            self.requests += 1
        try:
            request = parse_line(line)
            refusal = check_access(self._credentials, BLOCK_SOCKET, str(request.get("token", "")))
            if refusal is not None:
                self._send_reply(conn, error_reply(refusal[0].name, refusal[1]))
                return
            if "table" in request:  # the node's status table (worker/published.py)
                self._send_table(conn)
                return
            if "list" in request:  # a folder's statuses (worker/folders.py)
                listed = asyncio.run_coroutine_threadsafe(self._reads.folder_listing(str(request["list"])),
                                                          self._loop)
                data, age, too_large = listed.result()
                self._send_reply(conn, listing_reply(data, age, too_large=too_large))
                return
            if "open" in request:  # a file by path: its status, and its block if small
                kept = self._kept_opens.open(str(request["open"]), int(request.get("read_type", 0)),
                                             int(request.get("whole_below", 0)), as_file=self.sends_descriptors,
                                             served_path=self.served_path, client=client_label(request.get("client")))
                if kept is not None:  # counted by KeptOpens
                    file, kept_source = kept
                    if kept_source is None:
                        self._send_reply(conn, with_file({"ok": True}, file, block=False))
                        return
                    try:
                        self._deliver(conn, kept_source, file)
                        self._share(file, kept_source)
                    finally:
                        kept_source.close()
                    return
                opened = asyncio.run_coroutine_threadsafe(self._open_path(str(request["open"]), request), self._loop)
                file, found = opened.result()
                if found is None:
                    self._send_reply(conn, with_file({"ok": True}, file, block=False))
                    return
                source = found
            else:
                future = asyncio.run_coroutine_threadsafe(self._open(block_of(request), request), self._loop)
                source = future.result()
        except StrataError as exc:
            self._send_reply(conn, error_reply(exc.code.name, str(exc)))
            return
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self._send_reply(conn, error_reply("INVALID_ARGUMENT", f"bad block request: {exc}"))
            return
        except Exception as exc:  # noqa: BLE001 - the reader gets an answer, the worker lives
            log.exception("%s request failed", self.name)
            self._send_reply(conn, error_reply("INTERNAL", str(exc)))
            return
        # Counted on the loop, as every counter is (the connection threads race otherwise).
        self._loop.call_soon_threadsafe(self._count_served, client_label(request.get("client")), source.length)
        try:
            self._deliver(conn, source, file)
            if file is not None:
                self._share(file, source)
        finally:
            source.close()

    def _send_table(self, conn: socket.socket) -> None:
        """Read-only descriptors of the node's status table and, when the worker keeps one,
        its data table (worker/published.py), to readers on this host only."""
        if not self.sends_descriptors:
            self._send_reply(conn, error_reply("INVALID_ARGUMENT", "the node's status table is shared over the "
                                               "short-circuit socket only, with readers on the worker's host"))
            return
        published = self._reads.kept.published
        fd = published.descriptor()
        if fd is None:
            self._send_reply(conn, error_reply("FAILED_PRECONDITION", "this worker publishes no status table "
                                               "(STRATA_WORKER_STATUS_TABLE_BYTES=0, or the system gave it none)"))
            return
        fds = [fd]
        files = published.files.descriptor()
        if files is not None:
            fds.append(files)
        try:
            socket.send_fds(conn, [reply_line({"ok": True, "table": published.generation})], fds)
        finally:
            for one in fds:
                os.close(one)

    def _share(self, file: pb.FileInfo, source: BlockSource) -> None:
        """After an open of a small file was answered with its block: publish its bytes in
        the node's data table (readers on this host only; see worker/published.py)."""
        if not self.sends_descriptors or source.fd < 0 or source.offset or source.length != file.length:
            return

        def read() -> bytes | None:
            try:
                data = os.pread(source.fd, source.length, 0)
            except OSError:
                return None
            return data if len(data) == source.length else None

        self._reads.kept.published.publish_file(file, read, source.checksums, source.chunk_size)

    async def _open_path(self, path: str, request: dict[str, Any]) -> tuple[pb.FileInfo, BlockSource | None]:
        """The status of the file at `path` and its block when it is small (`blockwire`)."""
        return await self._reads.open_path(path, int(request.get("read_type", 0)),
                                           whole_below=int(request.get("whole_below", 0)),
                                           fetch=bool(request.get("fetch", False)),
                                           as_file=self.sends_descriptors)

    def _count_served(self, client: str, length: int) -> None:
        self._reads.counters.served_bytes[self.served_path, client] += length

    @staticmethod
    def _reply_of(reply: dict[str, Any], file: pb.FileInfo | None) -> dict[str, Any]:
        """A block's ok reply, with the file's status when it answers an open."""
        return reply if file is None else with_file(reply, file, block=True)

    @staticmethod
    def _send_reply(conn: socket.socket, reply: dict[str, Any], fd: int = -1) -> None:
        data = reply_line(reply)
        if fd >= 0:
            socket.send_fds(conn, [data], [fd])
        else:
            conn.sendall(data)

    @abstractmethod
    async def _open(self, ref: pb.BlockRef, request: dict[str, Any]) -> BlockSource:
        """Find (or fetch) what the request asks for, on the worker's loop."""

    @abstractmethod
    def _deliver(self, conn: socket.socket, source: BlockSource, file: pb.FileInfo | None) -> None:
        """Send the ok reply (with `file`, the status an open asked for) and what follows it."""


class ShortCircuitServer(BlockSocketServer):
    """Readers on the worker's host get block files' descriptors over a Unix socket."""

    name = "short-circuit"
    served_path = "short_circuit"
    sends_descriptors = True

    def __init__(self, reads: BlockReads, socket_path: Path, credentials: Credentials,
                 loop: asyncio.AbstractEventLoop, settings: DataPortSettings,
                 advertised_path: Path | None = None) -> None:
        super().__init__(reads, credentials, loop, settings)
        self.socket_path = socket_path
        # Where readers on this host find the socket (its host path when the worker runs in a
        # container that mounts the folder from the node).
        self.advertised_path = advertised_path or socket_path

    def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o666)  # the token guards it; pods run as other users
        self._listen(sock)

    def stop(self) -> None:
        super().stop()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def _open(self, ref: pb.BlockRef, request: dict[str, Any]) -> BlockSource:
        return await self._reads.short_circuit(ref, int(request.get("read_type", 0)),
                                               verify=bool(request.get("verify", False)))

    def _deliver(self, conn: socket.socket, source: BlockSource, file: pb.FileInfo | None) -> None:
        reply = ok_reply(source.length, source.hit, checksums=source.checksums, chunk_size=source.chunk_size)
        self._send_reply(conn, self._reply_of(reply, file), source.fd)


class DataServer(BlockSocketServer):
    """Any reader gets block bytes over TCP, sent from the block file by the kernel."""

    name = "data"
    served_path = "data_port"

    def start(self, bind: str, port: int) -> int:
        sock = socket.create_server((bind, port), family=socket.AF_INET6 if ":" in bind else socket.AF_INET)
        self._listen(sock)
        return int(sock.getsockname()[1])

    async def _open(self, ref: pb.BlockRef, request: dict[str, Any]) -> BlockSource:
        source = await self._reads.read_source(
            ref, int(request.get("read_type", 0)), offset=int(request.get("offset", 0)),
            length=int(request.get("length", 0)), readahead=int(request.get("readahead", 0)),
        )
        self._reads.counters.data_port_reads += 1
        return source

    def _deliver(self, conn: socket.socket, source: BlockSource, file: pb.FileInfo | None) -> None:
        self._send_reply(conn, self._reply_of(ok_reply(source.length, source.hit, checksums=source.sent_checksums(),
                                                       chunk_size=CHUNK_SIZE), file))
        if source.fd < 0:
            conn.sendall(source.data)
            return
        sent, end = source.offset, source.offset + source.length
        while sent < end:
            n = os.sendfile(conn.fileno(), source.fd, sent, end - sent)
            if n == 0:
                raise OSError(f"block file ended at byte {sent} of {end}")
            sent += n
