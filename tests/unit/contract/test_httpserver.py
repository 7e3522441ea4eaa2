"""The servers' HTTP side (/metrics, /healthz): real sockets on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from strata.contract import httpserver
from strata.contract.httpserver import HttpServer


@pytest.fixture
async def port() -> AsyncIterator[int]:
    server = HttpServer(CollectorRegistry(), healthy=lambda: True)
    bound = await server.start("127.0.0.1", 0)
    try:
        yield bound
    finally:
        await server.stop()


async def exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=30)
    finally:
        writer.close()


async def test_healthz_and_metrics_answer(port: int) -> None:
    assert (await exchange(port, b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n")).startswith(b"HTTP/1.0 200 OK")
    assert (await exchange(port, b"GET /metrics HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.0 200 OK")
    assert (await exchange(port, b"GET /nope HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.0 404")


@pytest.mark.parametrize("head", [
    b"GET /healthz?" + b"x" * 100_000 + b" HTTP/1.0\r\n\r\n",  # one line over the stream's buffer
    b"GET /healthz HTTP/1.0\r\n" + b"X-Filler: yyyyyyyyyyyyyyyy\r\n" * 3000 + b"\r\n",  # many lines
], ids=["long-line", "many-headers"])
async def test_a_request_head_over_the_bound_gets_431_and_the_server_keeps_serving(port: int, head: bytes) -> None:
    answer = await exchange(port, head)
    assert answer.startswith(b"HTTP/1.0 431"), answer[:200]
    assert str(httpserver.MAX_HEAD_BYTES).encode() in answer
    assert (await exchange(port, b"GET /healthz HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.0 200 OK")


async def test_a_head_trickled_past_the_deadline_is_dropped(port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client sending a header line now and then, each well within the deadline, is still
    cut off once the whole head took longer than HEAD_TIMEOUT."""
    monkeypatch.setattr(httpserver, "HEAD_TIMEOUT", 1.0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /healthz HTTP/1.0\r\n")
        closed = False
        for _ in range(40):  # up to 10 s of trickling, a line every 0.25 s
            try:
                writer.write(b"X-Slow: 1\r\n")
                await writer.drain()
            except ConnectionError:
                closed = True
                break
            if reader.at_eof() or await _eof_within(reader, 0.25):
                closed = True
                break
        assert closed, "the server kept a trickling request head open past its deadline"
    finally:
        writer.close()
    assert (await exchange(port, b"GET /healthz HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.0 200 OK")


async def _eof_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        data = await asyncio.wait_for(reader.read(1), timeout=seconds)
    except asyncio.TimeoutError:
        return False
    except ConnectionError:
        return True
    assert data == b"", data  # no answer for a head that never ended
    return True


async def test_connections_past_the_bound_are_answered_503_and_closed_at_once(port: int) -> None:
    """A flood of connections that send nothing holds at most MAX_CONNECTIONS of them (and
    of the server's descriptors) until the head deadline: one more is told and closed."""
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(httpserver.MAX_CONNECTIONS)]
    try:
        extra = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
        for reader, writer in extra:
            try:
                # Well within HEAD_TIMEOUT, which is all a held connection would get.
                answer = await asyncio.wait_for(reader.read(), timeout=httpserver.HEAD_TIMEOUT / 2)
            except asyncio.TimeoutError:
                pytest.fail(f"a connection past the {httpserver.MAX_CONNECTIONS} held was kept open")
            finally:
                writer.close()
            assert answer.startswith(b"HTTP/1.0 503") and b"connections are open" in answer, answer
    finally:
        for _, writer in idle:
            writer.close()

    async def healthy() -> bool:
        try:
            return (await exchange(port, b"GET /healthz HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.0 200 OK")
        except ConnectionError:  # still past the bound: closed with the request unread
            return False

    for _ in range(100):  # until the server has seen the idle ones closed
        if await healthy():
            return
        await asyncio.sleep(0.05)
    pytest.fail("/healthz did not answer 200 once the idle connections were closed")
