"""A TCP proxy in front of a store (moto's S3 server) that tests can make misbehave.

    proxy = StoreProxy(target_port=s3_port)      # listens on 127.0.0.1, a free port
    options = {"endpoint_url": proxy.endpoint_url, ...}
    with proxy.refusing():   # connections refused, open ones reset: the store is down
        ...
    with proxy.hanging():    # connections accepted, nothing forwarded: a hung store
        ...
    with proxy.slowed(2.0):  # each answer waits 2 s for its first byte
        ...
    with proxy.holding(b"HEAD "):  # requests that start so wait, unsent, until the end
        ...
    with proxy.holding_answer(b"PUT "):  # the first such request is sent, its answer waits
        ...
    proxy.stop()

The proxy runs its own event loop in a daemon thread, so a test drives faults from plain
synchronous code while servers in other processes talk to the store through it. Leaving a
fault (the end of the `with`) makes the store behave again at once; connections opened while
it hung stay silent until the client gives up on them, as after a real outage.

Tests import it by name (pytest puts tests/support on sys.path).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Literal

Mode = Literal["pass", "refuse", "hang", "slow"]
CHUNK = 256 * 1024


class StoreProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1", port: int = 0,
                 host: str = "127.0.0.1") -> None:
        """`host`: the address it listens on (127.0.0.1; the e2e suite's pods reach the
        harness' own bridge address instead, where its store listens too)."""
        self.target = (target_host, target_port)
        self.host = host
        self.mode: Mode = "pass"
        self.delay = 0.0
        self.held: bytes | None = None  # requests starting with these bytes wait (`holding`)
        self.holds = 0  # requests held back since start (see `holding`)
        self.held_answer: bytes | None = None  # the answer to the next such request waits
        self.answers_held = 0  # answers held back since start (see `holding_answer`)
        self._answer_taken = False
        self.connections = 0  # accepted since start, for tests that check a fault was met
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        # Bind once here so the port is known, fixed, and reused when the store "comes back".
        probe = socket.socket()
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        self.port = int(probe.getsockname()[1])
        probe.close()
        self._thread = threading.Thread(target=self._loop.run_forever, name="store-proxy", daemon=True)
        self._thread.start()
        self._call(self._listen())

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _call(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)  # type: ignore[arg-type]

    async def _listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._handle, self.host, self.port, reuse_address=True)

    async def _close_all(self, *, listener: bool) -> None:
        if listener and self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            transport = writer.transport
            sock = transport.get_extra_info("socket")
            if sock is not None:  # reset, not a polite FIN: the store went away
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                except OSError:
                    pass  # the connection closed meanwhile: nothing left to reset
            transport.abort()
        self._writers.clear()

    async def _set(self, mode: Mode, delay: float) -> None:
        if mode == "refuse":
            await self._close_all(listener=True)
        elif self.mode == "refuse":
            await self._listen()
        if mode == "pass" and self.mode == "hang":
            # connections made while hung are dead to their clients: drop them
            await self._close_all(listener=False)
        self.mode, self.delay = mode, delay

    def set_mode(self, mode: Mode, delay: float = 0.0) -> None:
        self._call(self._set(mode, delay))

    @contextmanager
    def _fault(self, mode: Mode, delay: float = 0.0) -> Iterator[None]:
        self.set_mode(mode, delay)
        try:
            yield
        finally:
            self.set_mode("pass")

    def refusing(self) -> AbstractContextManager[None]:
        return self._fault("refuse")

    def hanging(self) -> AbstractContextManager[None]:
        return self._fault("hang")

    def slowed(self, seconds: float) -> AbstractContextManager[None]:
        return self._fault("slow", seconds)

    @contextmanager
    def holding(self, request_start: bytes) -> Iterator[None]:
        """Requests whose first bytes are `request_start` (b"HEAD ": status lookups) are
        held back until the `with` ends, then sent; the others pass meanwhile. `holds`
        counts them."""
        self.held = request_start
        try:
            yield
        finally:
            self.held = None

    @contextmanager
    def holding_answer(self, request_start: bytes) -> Iterator[None]:
        """The first request whose first bytes are `request_start` reaches the store, whose
        answer is held back until the `with` ends: the store did it, the client does not know
        yet (`answers_held` counts it). Later requests pass."""
        self.held_answer = request_start
        try:
            yield
        finally:
            self.held_answer = None
            self._answer_taken = False

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(client_w)
        if self.mode == "refuse":
            client_w.transport.abort()
            return
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.transport.abort()
            return
        self._writers.add(server_w)
        asked: list[float | None] = [None]
        hold_answer = [False]  # this connection carries the request whose answer waits

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, answers: bool) -> None:
            try:
                while data := await src.read(CHUNK):
                    if not answers and self.held is not None and data.startswith(self.held):
                        self.holds += 1
                        while self.held is not None:
                            await asyncio.sleep(0.05)
                    if (not answers and self.held_answer is not None and not self._answer_taken
                            and data.startswith(self.held_answer)):
                        self.answers_held += 1
                        self._answer_taken = True
                        hold_answer[0] = True
                    if answers and hold_answer[0]:
                        if data.startswith(b"HTTP/1.1 100 "):  # "go on" to a client that expects it
                            interim, _, data = data.partition(b"\r\n\r\n")
                            dst.write(interim + b"\r\n\r\n")
                            await dst.drain()
                            if not data:
                                continue
                        while self.held_answer is not None:
                            await asyncio.sleep(0.05)
                        hold_answer[0] = False
                    while self.mode == "hang":
                        await asyncio.sleep(0.05)
                    if not answers:
                        asked[0] = time.monotonic()
                    elif asked[0] is not None and self.mode == "slow":
                        wait = asked[0] + self.delay - time.monotonic()
                        asked[0] = None
                        if wait > 0:
                            await asyncio.sleep(wait)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pump(client_r, server_w, False), pump(server_r, client_w, True))
        self._writers.discard(client_w)
        self._writers.discard(server_w)

    def stop(self) -> None:
        self._call(self._close_all(listener=True))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
