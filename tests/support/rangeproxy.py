"""An HTTP proxy in front of a store (moto's S3 server) that answers ranged GETs with fewer
bytes than asked, as a faulty store or a middlebox may: a well-formed 206 answer (its
Content-Length and Content-Range say what it carries) whose object is still the version
asked for (the store itself checked the If-Match).

    proxy = RangeProxy(target_port=s3_port)   # listens on 127.0.0.1, a free port
    options = {"endpoint_url": proxy.endpoint_url, ...}
    proxy.cut = 100                           # each ranged answer ends 100 bytes early
    ...
    proxy.stop()

Every other request and answer passes unchanged. The proxy runs its own event loop in a
daemon thread, so servers in this process or others talk to the store through it.

Tests import it by name (pytest puts tests/support on sys.path).
"""

from __future__ import annotations

import asyncio
import re
import threading

import aiohttp
from aiohttp import web

# Headers the proxy's own client and server set for each hop.
_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})


class RangeProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = f"http://{target_host}:{target_port}"
        self.cut = 0  # bytes taken off the end of each ranged GET answer
        self.cut_answers = 0  # ranged answers shortened so far
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="range-proxy", daemon=True)
        self._thread.start()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _start(self) -> int:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets
        return int(server.sockets[0].getsockname()[1])

    async def _forward(self, request: web.Request) -> web.Response:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers["Host"] = request.host
        async with self._session.request(request.method, self.target + request.path_qs, headers=headers,
                                         data=await request.read(), allow_redirects=False) as answer:
            body = await answer.read()
            out = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
            ranged = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", answer.headers.get("Content-Range", ""))
            if request.method == "GET" and answer.status == 206 and ranged and self.cut and len(body) > self.cut:
                body = body[:-self.cut]
                first, last, total = (int(g) for g in ranged.groups())
                out["Content-Range"] = f"bytes {first}-{last - self.cut}/{total}"
                self.cut_answers += 1
            if request.method == "HEAD":  # no body, but the length of the one a GET would get
                out["Content-Length"] = answer.headers.get("Content-Length", "0")
                return web.Response(status=answer.status, headers=out)
            return web.Response(status=answer.status, headers=out, body=body)

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
