"""A TCP proxy that adds time to first byte to every request/response exchange.

    python -P bench/delayproxy.py --listen HOST --target HOST:PORT --ttfb-ms 20 [--rate-mbit R]

It prints `PORT <n>` once it listens, then serves until killed. On each connection the
proxy notes when the client last sent bytes; the first bytes the server sends after that
are held until `ttfb` has passed since then. HTTP/1.1 with keep-alive alternates requests
and responses on a connection, so every S3 request (GET, HEAD, LIST, PUT, the 100-continue
of an upload) waits `ttfb` for its first byte, as a store a few milliseconds away would make
it. Bodies then stream at the link's speed.

With `--rate-mbit` the proxy also caps the bytes it forwards (one token bucket per
direction, shared by all connections): the bandwidth cap of the loopback fallback, where no
`tc` qdisc can be put on a link of our own.
"""

from __future__ import annotations

import argparse
import asyncio
import time

CHUNK = 1024 * 1024


class TokenBucket:
    """Bytes per second, with a bucket of 10 ms of traffic."""

    def __init__(self, rate_mbit: float) -> None:
        self.rate = rate_mbit * 1e6 / 8
        self.capacity = max(self.rate / 100, 64 * 1024)
        self.tokens = self.capacity
        self.at = time.monotonic()

    async def take(self, n: int) -> None:
        while True:
            now = time.monotonic()
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens >= min(n, self.capacity):
                self.tokens -= n  # may go negative for a large chunk: later takes wait it off
                return
            await asyncio.sleep((min(n, self.capacity) - self.tokens) / self.rate)


class Proxy:
    def __init__(self, target_host: str, target_port: int, ttfb: float, rate_mbit: float | None) -> None:
        self.target = (target_host, target_port)
        self.ttfb = ttfb
        self.up = TokenBucket(rate_mbit) if rate_mbit else None
        self.down = TokenBucket(rate_mbit) if rate_mbit else None

    async def handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        # monotonic time the client last sent bytes that the server has not answered yet
        state: dict[str, float | None] = {"asked": None}

        async def upstream() -> None:
            while data := await client_r.read(CHUNK):
                state["asked"] = time.monotonic()
                if self.up is not None:
                    await self.up.take(len(data))
                server_w.write(data)
                await server_w.drain()
            if server_w.can_write_eof():
                server_w.write_eof()

        async def downstream() -> None:
            while data := await server_r.read(CHUNK):
                asked = state["asked"]
                if asked is not None:
                    state["asked"] = None
                    wait = asked + self.ttfb - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                if self.down is not None:
                    await self.down.take(len(data))
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        try:
            await asyncio.gather(*tasks)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for task in tasks:
                task.cancel()
            for writer in (client_w, server_w):
                writer.close()


async def serve(listen: str, target: str, ttfb_ms: float, rate_mbit: float | None) -> None:
    host, _, port = target.rpartition(":")
    proxy = Proxy(host, int(port), ttfb_ms / 1000.0, rate_mbit)
    server = await asyncio.start_server(proxy.handle, listen, 0, limit=CHUNK)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--listen", default="127.0.0.1")
    parser.add_argument("--target", required=True, help="HOST:PORT of the server behind the proxy")
    parser.add_argument("--ttfb-ms", type=float, default=20.0)
    parser.add_argument("--rate-mbit", type=float, default=None)
    args = parser.parse_args()
    try:
        asyncio.run(serve(args.listen, args.target, args.ttfb_ms, args.rate_mbit))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
