"""A TCP front for a real server that fails the first connections on purpose.

    proxy = FlakyProxy(upstream="127.0.0.1:5000", failures=2, reply=SLOW_DOWN)
    ... point a client at proxy.endpoint_url ...
    proxy.failed, proxy.forwarded   # connections answered with the failure / passed on
    proxy.stop()

Each of the first `failures` connections reads one request and gets `reply` (e.g. an S3
503 SlowDown), or is closed at once when `reply` is None (a dropped connection); later
connections are piped to `upstream` unchanged, except that with `flip_at` the first one
piped has one bit of byte `flip_at` of what `upstream` sends changed on its way (a link that
damages bytes: `proxy.flipped` says when it has).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

_SLOW_DOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
)
SLOW_DOWN = (
    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
    b"Content-Length: " + str(len(_SLOW_DOWN_BODY)).encode() + b"\r\nConnection: close\r\n\r\n" + _SLOW_DOWN_BODY
)


class FlakyProxy:
    def __init__(self, upstream: str, *, failures: int, reply: bytes | None = SLOW_DOWN,
                 flip_at: int | None = None) -> None:
        host, port = upstream.rsplit(":", 1)
        self._flip_at = flip_at
        self.flipped = False
        self._upstream = (host, int(port))
        self._reply = reply
        self._lock = threading.Lock()
        self.failures_left = failures
        self.failed = 0
        self.forwarded = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, name="flaky-accept", daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                fail = self.failures_left > 0
                if fail:
                    self.failures_left -= 1
                    self.failed += 1
                else:
                    self.forwarded += 1
            target = self._fail if fail else self._forward
            thread = threading.Thread(target=target, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _fail(self, conn: socket.socket) -> None:
        with conn:
            if self._reply is None:
                return
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            conn.sendall(self._reply)

    def _forward(self, conn: socket.socket) -> None:
        upstream = socket.create_connection(self._upstream, timeout=30)
        with self._lock:
            flip_at, self._flip_at = self._flip_at, None
        pipes = [
            threading.Thread(target=_pipe, args=(conn, upstream), daemon=True),
            threading.Thread(target=_pipe, args=(upstream, conn, flip_at, self._mark_flipped), daemon=True),
        ]
        for pipe in pipes:
            pipe.start()
        for pipe in pipes:
            pipe.join()
        conn.close()
        upstream.close()

    def _mark_flipped(self) -> None:
        self.flipped = True

    def stop(self) -> None:
        self._stopping.set()
        self._listener.close()
        self._accepting.join(timeout=5)


def _pipe(src: socket.socket, dst: socket.socket, flip_at: int | None = None,
          flipped: Callable[[], None] = lambda: None) -> None:
    passed = 0
    try:
        while True:
            chunk = src.recv(65536)
            if not chunk:
                break
            if flip_at is not None and passed <= flip_at < passed + len(chunk):
                damaged = bytearray(chunk)
                damaged[flip_at - passed] ^= 0x04
                chunk = bytes(damaged)
                flipped()
            passed += len(chunk)
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
