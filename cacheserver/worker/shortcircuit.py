"""Short-circuit reads: a client on the worker's host asks for a block over a Unix socket and
gets the block file's descriptor (SCM_RIGHTS), then reads it directly, without streaming the
bytes over gRPC.

Wire format, one request and one reply per line of JSON on a stream socket:
  request  {"token": "...", "block": {mount_id, path, version, index, block_size,
            file_length, in_store}, "read_type": 1}
  reply    {"ok": true, "length": N, "hit": true}  + the file descriptor as ancillary data
  or       {"ok": false, "code": "NOT_FOUND", "message": "..."}
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any

from ..errors import StrataError
from ..proto import strata_pb2 as pb
from .service import WorkerService, effective_read_type

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024


class ShortCircuitServer:
    """A thread per connection; each request runs the block lookup on the worker's loop."""

    def __init__(self, service: WorkerService, socket_path: Path, token: str, loop: asyncio.AbstractEventLoop,
                 advertised_path: Path | None = None) -> None:
        self._service = service
        self.socket_path = socket_path
        # Where readers on this host find the socket (its host path when the worker runs in a
        # container that mounts the folder from the node).
        self.advertised_path = advertised_path or socket_path
        self._token = token
        self._loop = loop
        self._sock: socket.socket | None = None
        self._closing = False

    def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o666)  # the token guards it; pods run as other users
        sock.listen(64)
        self._sock = sock
        threading.Thread(target=self._accept_loop, name="short-circuit-accept", daemon=True).start()

    def stop(self) -> None:
        self._closing = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._closing:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="short-circuit-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                if len(line) > MAX_REQUEST_BYTES:
                    self._reply(conn, {"ok": False, "code": "INVALID_ARGUMENT", "message": "request too large"})
                    return
                fd = -1
                try:
                    reply, fd = self._handle(json.loads(line))
                except StrataError as exc:
                    reply = {"ok": False, "code": exc.code.name, "message": str(exc)}
                except (ValueError, KeyError, TypeError) as exc:
                    reply = {"ok": False, "code": "INVALID_ARGUMENT", "message": f"bad short-circuit request: {exc}"}
                except Exception as exc:  # noqa: BLE001 - the reader gets an answer, the worker lives
                    log.exception("short-circuit request failed")
                    reply = {"ok": False, "code": "INTERNAL", "message": str(exc)}
                try:
                    self._reply(conn, reply, fd)
                except OSError:
                    return
                finally:
                    if fd >= 0:
                        os.close(fd)

    @staticmethod
    def _reply(conn: socket.socket, reply: dict[str, Any], fd: int = -1) -> None:
        data = (json.dumps(reply) + "\n").encode()
        if fd >= 0:
            socket.send_fds(conn, [data], [fd])
        else:
            conn.sendall(data)

    def _handle(self, request: dict[str, Any]) -> tuple[dict[str, Any], int]:
        if not hmac.compare_digest(str(request.get("token", "")).encode(), self._token.encode()):
            return {"ok": False, "code": "UNAUTHENTICATED", "message": "missing or wrong cluster token"}, -1
        ref = pb.BlockRef(**request["block"])
        read_type = pb.ReadType.ValueType(int(request.get("read_type", 0)))
        future = asyncio.run_coroutine_threadsafe(self._open(ref, read_type), self._loop)
        return future.result()

    async def _open(self, ref: pb.BlockRef, read_type: pb.ReadType.ValueType) -> tuple[dict[str, Any], int]:
        service = self._service
        mount = await service.mounts.get(ref.mount_id)
        promote = effective_read_type(read_type, mount, service.config) == pb.CACHE_PROMOTE
        block, hit = await service.ensure_cached(ref, promote=promote)
        if block.key.block_id not in service.verified:
            # Read whole once through the checksummed path; a bad copy is dropped and fetched.
            await service.read_cached(ref, 0, block.length, promote=False)
        fd, block = service.store.open_fd(block.key)
        service.counters.short_circuit_reads += 1
        service.counters.bytes_served += block.length
        return {"ok": True, "length": block.length, "hit": hit}, fd
