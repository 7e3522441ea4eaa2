"""The reader's side of short-circuit reads: ask the local worker for a block's file
descriptor over its Unix socket, read the file directly."""

from __future__ import annotations

import json
import mmap
import os
import socket
import threading
from typing import Any

from ..errors import StrataError, Unavailable
from ..proto import strata_pb2 as pb

_ERRORS_BY_NAME = {cls.code.name: cls for cls in StrataError.__subclasses__()}


class ShortCircuitReader:
    """One connection per thread to one worker's socket."""

    def __init__(self, socket_path: str, token: str) -> None:
        self.socket_path = socket_path
        self._token = token
        self._local = threading.local()

    def _conn(self) -> tuple[socket.socket, Any]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.socket_path)
            except OSError as exc:
                sock.close()
                raise Unavailable(f"short-circuit socket {self.socket_path}: {exc.strerror}") from exc
            conn = (sock, bytearray())
            self._local.conn = conn
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn[0].close()
            self._local.conn = None

    def _open(self, ref: pb.BlockRef, read_type: int) -> tuple[int, int]:
        """Ask the worker for the block: (file descriptor, block length). The caller closes
        the descriptor."""
        request = {
            "token": self._token,
            "block": {
                "mount_id": ref.mount_id, "path": ref.path, "version": ref.version, "index": ref.index,
                "block_size": ref.block_size, "file_length": ref.file_length, "in_store": ref.in_store,
            },
            "read_type": read_type,
        }
        sock, pending = self._conn()
        fd = -1
        try:
            sock.sendall((json.dumps(request) + "\n").encode())
            while b"\n" not in pending:
                data, fds, _, _ = socket.recv_fds(sock, 65536, 1)
                if not data:
                    raise Unavailable(f"short-circuit socket {self.socket_path} closed by the worker")
                pending.extend(data)
                if fds:
                    fd = fds[0]
        except OSError as exc:
            self._drop()
            if fd >= 0:
                os.close(fd)
            raise Unavailable(f"short-circuit read over {self.socket_path} failed: {exc}") from exc
        line, _, rest = bytes(pending).partition(b"\n")
        pending[:] = rest
        reply = json.loads(line)
        if not reply.get("ok"):
            if fd >= 0:
                os.close(fd)
            cls = _ERRORS_BY_NAME.get(reply.get("code", ""), StrataError)
            raise cls(reply.get("message", "short-circuit read refused"))
        if fd < 0:
            raise Unavailable(f"the worker at {self.socket_path} answered without a file descriptor")
        return fd, int(reply["length"])

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

    def close(self) -> None:
        self._drop()
