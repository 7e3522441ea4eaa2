"""The shared master client against a tiny master servicer on 127.0.0.1: every kind of call
carries the token, each call has its deadline, and failed calls become the contract's errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest

from strata.contract.errors import ANSWERED, DeadlineExceeded, NotFound, Unavailable, Unreachable
from strata.contract.master import MasterClient
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc

TOKEN = "contract-master-token"


@dataclass
class Answers:
    """How the tiny master answers, and the tokens its calls carried (by method)."""

    tokens: dict[str, list[str | None]] = field(default_factory=dict)
    abort: tuple[grpc.StatusCode, str, bool] | None = None  # code, details, answered by the server
    hang: float = 0.0  # seconds each call waits before its answer
    progress: int = 3  # Load messages

    async def take(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        metadata = dict(context.invocation_metadata() or ())
        self.tokens.setdefault(method, []).append(metadata.get("authorization"))
        await asyncio.sleep(self.hang)
        if self.abort is not None:
            code, details, answered = self.abort
            await context.abort(code, details, trailing_metadata=ANSWERED if answered else ())


class TinyMaster(pb_grpc.MasterServicer):  # type: ignore[misc]
    def __init__(self, answers: Answers) -> None:
        self.answers = answers

    async def Report(self, request: pb.ReportRequest, context: Any) -> pb.ReportResponse:  # noqa: N802
        await self.answers.take("Report", context)
        return pb.ReportResponse(hits=7)

    async def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.FileInfo:  # noqa: N802
        await self.answers.take("GetStatus", context)
        return pb.FileInfo(path=request.path, length=3)

    async def Free(self, request: pb.FreeRequest, context: Any) -> pb.FreeResponse:  # noqa: N802
        await self.answers.take("Free", context)
        return pb.FreeResponse(bytes_freed=42)

    async def Load(self, request: pb.LoadRequest, context: Any) -> AsyncIterator[pb.LoadProgress]:  # noqa: N802
        await self.answers.take("Load", context)
        for i in range(self.answers.progress):
            yield pb.LoadProgress(path=request.path, bytes_loaded=i, bytes_total=self.answers.progress - 1)


@dataclass
class Running:
    answers: Answers
    address: str


@pytest.fixture
async def master() -> AsyncIterator[Running]:
    answers = Answers()
    server = grpc.aio.server()
    pb_grpc.add_MasterServicer_to_server(TinyMaster(answers), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield Running(answers, f"127.0.0.1:{port}")
    await server.stop(grace=None)


async def test_every_kind_of_call_carries_the_token(master: Running) -> None:
    async with MasterClient(master.address, TOKEN, timeout=5) as client:
        assert (await client.report()).hits == 7
        assert await client.free("/a") == 42
        assert [p.bytes_loaded async for p in client.load("/a")] == [0, 1, 2]
    assert master.answers.tokens == {m: [f"Bearer {TOKEN}"] for m in ("Report", "Free", "Load")}


async def test_start_load_returns_the_first_progress_and_leaves_the_rest(master: Running) -> None:
    async with MasterClient(master.address, TOKEN, timeout=5) as client:
        first = await client.start_load("/a")
        assert first is not None and first.bytes_loaded == 0 and first.bytes_total == 2
        master.answers.progress = 0
        assert await client.start_load("/b") is None


async def test_a_call_ends_at_its_own_deadline_or_the_clients(master: Running) -> None:
    master.answers.hang = 5.0
    async with MasterClient(master.address, TOKEN, timeout=1.0) as client:
        start = time.monotonic()
        with pytest.raises(Unreachable, match=r"^report: timed out \(.*Deadline Exceeded.*\)$"):
            await client.report(what="report")
        assert 0.9 < time.monotonic() - start < 3
        start = time.monotonic()
        with pytest.raises(Unreachable):
            await client.get_status("/a", timeout=0.1)
        assert time.monotonic() - start < 0.8
        # A caller that counts a late master as away names it in its own words.
        with pytest.raises(Unavailable, match="^no status of /a within 0.1s$") as late:
            await client.get_status("/a", timeout=0.1, late="no status of /a within 0.1s")
        assert not isinstance(late.value, Unreachable)


@pytest.mark.parametrize(
    ("code", "answered", "error", "message"),
    [
        (grpc.StatusCode.NOT_FOUND, True, NotFound, "^no such file$"),
        # The master answered that its store is down: it is there.
        (grpc.StatusCode.UNAVAILABLE, True, Unavailable, "^free /a: no such file$"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, True, DeadlineExceeded, r"^free /a: timed out \(no such file\)$"),
        # No mark of the master's own answer: something between did not let the call through.
        (grpc.StatusCode.UNAVAILABLE, False, Unreachable, "^free /a: no such file$"),
        (grpc.StatusCode.CANCELLED, False, Unreachable, "^no such file$"),
    ],
)
async def test_failed_calls_become_the_contracts_errors(master: Running, code: grpc.StatusCode, answered: bool,
                                                        error: type, message: str) -> None:
    master.answers.abort = (code, "no such file", answered)
    async with MasterClient(master.address, TOKEN, timeout=5) as client:
        with pytest.raises(error, match=message) as caught:
            await client.free("/a", what="free /a")
        assert isinstance(caught.value, Unreachable) == (error is Unreachable)


async def test_an_absent_master_is_unreachable_and_a_stream_says_so_too() -> None:
    async with MasterClient("127.0.0.1:1", TOKEN, timeout=2) as client:
        with pytest.raises(Unreachable, match="^report: "):
            await client.report(what="report")
        with pytest.raises(Unreachable, match="^load /a: "):
            [p async for p in client.load("/a", what="load /a")]


async def test_a_call_on_a_closed_client_is_unreachable_unless_its_task_is_cancelled(master: Running) -> None:
    master.answers.hang = 5.0
    client = MasterClient(master.address, TOKEN, timeout=10)
    call = asyncio.create_task(client.report())
    while "Report" not in master.answers.tokens:
        await asyncio.sleep(0.01)
    await client.close()
    with pytest.raises(Unreachable, match=f"master at {master.address} was closed during the call"):
        await call
    async with MasterClient(master.address, TOKEN, timeout=10) as client:
        call = asyncio.create_task(client.report())
        await asyncio.sleep(0.2)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
