"""The HTTP side of each server: Prometheus `/metrics` and `/healthz`."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

# A request head (request line and headers) must arrive within this long and this size: a
# client that trickles or floods headers holds no connection open for long.
HEAD_TIMEOUT = 10.0
MAX_HEAD_BYTES = 64 * 1024
# Connections served at once (a scrape and a few health checks need a handful): one more is
# answered 503 and closed at once, so a flood of connections, which needs no token, holds
# no more of the server's file descriptors than this.
MAX_CONNECTIONS = 64


def _response(status: str, ctype: str, body: bytes) -> bytes:
    return (f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


_BUSY = _response("503 Service Unavailable", "text/plain",
                  f"busy: {MAX_CONNECTIONS} connections are open; try again\n".encode())


class HeadTooLarge(Exception):
    """The request line and headers together are over MAX_HEAD_BYTES."""


class HttpServer:
    """A tiny HTTP/1.0 server on asyncio: GET /metrics, GET /healthz. Nothing else."""

    def __init__(self, registry: CollectorRegistry, healthy: Callable[[], bool]) -> None:
        self._registry = registry
        self._healthy = healthy
        self._server: asyncio.base_events.Server | None = None
        self._open = 0  # connections being served

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._handle, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS:
            writer.write(_BUSY)  # into the socket's buffer: nothing waits on this reader
            writer.close()
            return
        self._open += 1
        try:
            try:
                request = await asyncio.wait_for(self._read_head(reader), timeout=HEAD_TIMEOUT)
            except HeadTooLarge:
                await self._answer(writer, "431 Request Header Fields Too Large", "text/plain",
                                   f"request head over {MAX_HEAD_BYTES} bytes\n".encode())
                return
            parts = request.decode("latin-1").split()
            path = parts[1].split("?")[0] if len(parts) >= 2 else ""
            if path == "/metrics":
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, generate_latest(self._registry)
            elif path in ("/healthz", "/readyz", "/livez"):
                ok = self._healthy()
                status = "200 OK" if ok else "503 Service Unavailable"
                ctype, body = "text/plain", (b"ok\n" if ok else b"not ready\n")
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found: try /metrics or /healthz\n"
            await self._answer(writer, status, ctype, body)
        except (asyncio.TimeoutError, ConnectionError) as exc:
            log.debug("http request failed: %s", exc)
        finally:
            self._open -= 1
            writer.close()

    @staticmethod
    async def _read_head(reader: asyncio.StreamReader) -> bytes:
        """The request line, after reading the headers up to their blank line; HeadTooLarge
        past MAX_HEAD_BYTES in all (a line longer than the reader's buffer included)."""
        request = b""
        seen = 0
        while True:
            try:
                line = await reader.readline()
            except ValueError:  # one line longer than the stream's limit
                raise HeadTooLarge() from None
            seen += len(line)
            if seen > MAX_HEAD_BYTES:
                raise HeadTooLarge()
            if not request:
                request = line
                if not line:
                    return b""
            elif line in (b"\r\n", b"\n", b""):
                return request

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, status: str, ctype: str, body: bytes) -> None:
        writer.write(_response(status, ctype, body))
        await asyncio.wait_for(writer.drain(), timeout=HEAD_TIMEOUT)  # a reader that takes nothing


async def serve_until_signalled(name: str, stop: Callable[[], Awaitable[None]]) -> None:
    """Block until SIGTERM or SIGINT, then run `stop` (a server's graceful shutdown)."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # the servers run on Linux: always supported
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    log.info("%s stopping", name)
    await stop()
