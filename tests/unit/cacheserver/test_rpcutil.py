"""Block lists travel in messages under the servers' receive limits; a taken port is named;
channels carry the token on every kind of call; one channel cache per peer set."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
from collections.abc import AsyncIterator

import grpc
import pytest

from strata.cacheserver import rpcutil
from strata.cacheserver.auth import Credentials
from strata.cacheserver.common.blockwire import write_chunk
from strata.contract import rpc
from strata.contract.errors import FailedPrecondition
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc


def test_block_lists_are_split_into_bounded_batches() -> None:
    refs = [pb.BlockRef(mount_id=1, path=f"/datasets/x/part-{i:06d}.parquet", version="e" * 32, index=i,
                        block_size=16 << 20, file_length=1 << 30, in_store=True, length=16 << 20) for i in range(100_000)]
    batches, rest = [], refs
    while rest:
        batch, rest = rpcutil.split_batch(rest)
        assert batch
        batches.append(batch)
    assert [r for b in batches for r in b] == refs
    assert len(batches) > 1
    for batch in batches:
        size = pb.RegisterWorkerRequest(blocks=batch).ByteSize()
        assert size <= rpcutil.BLOCK_LIST_BATCH_BYTES + 1024
        assert size < rpcutil.MASTER_MAX_RECEIVE_BYTES
    assert rpcutil.split_batch([]) == ([], [])


async def test_a_grpc_server_on_a_taken_port_is_refused_by_name() -> None:
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        server = grpc.aio.server()
        with pytest.raises(FailedPrecondition, match=rf"^worker: port {port} is already in use \(gRPC on 127\.0\.0\.1\); .* --port$"):
            rpcutil.add_port(server, "worker", "127.0.0.1", port)
        await server.stop(0)


def test_other_listen_failures_name_the_address_and_the_flag() -> None:
    error = rpcutil.listen_error("master", "HTTP", "203.0.113.7", 19999, "--http-port",
                                 OSError(99, "Cannot assign requested address"))
    assert str(error) == ("master: cannot listen on 203.0.113.7:19999 for HTTP: Cannot assign requested address; "
                          "check --http-port and --bind")


class _Answers(pb_grpc.WorkerServicer):
    """Answers one call of each kind, so that only the token check can refuse it."""

    async def CopyFile(self, request: pb.CopyFileRequest, context: grpc.aio.ServicerContext) -> pb.WriteFileResponse:
        return pb.WriteFileResponse(file=pb.FileInfo(path=request.dst))

    async def ReadBlock(self, request: pb.ReadBlockRequest,  # type: ignore[override]
                        context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ReadBlockChunk]:
        yield pb.ReadBlockChunk(data=b"block")

    async def WriteFile(self, request_iterator: AsyncIterator[pb.WriteFileChunk],
                        context: grpc.aio.ServicerContext) -> pb.WriteFileResponse:
        return pb.WriteFileResponse(file=pb.FileInfo(length=sum([len(c.data) async for c in request_iterator])))


async def test_an_asyncio_channel_carries_the_token_on_streaming_calls_too() -> None:
    # A worker reads a peer's block (ReadBlock, a response stream) over such a channel.
    credentials = Credentials.from_admin("rpcutil-test-admin")
    server = rpcutil.server(credentials, max_receive_bytes=rpcutil.WORKER_MAX_RECEIVE_BYTES)
    port = rpcutil.add_port(server, "worker", "127.0.0.1", 0)
    pb_grpc.add_WorkerServicer_to_server(_Answers(), server)
    await server.start()

    async def two_chunks() -> AsyncIterator[pb.WriteFileChunk]:
        yield write_chunk(b"ab", path="/m/f")
        yield write_chunk(b"c")

    try:
        async with rpc.aio_channel(f"127.0.0.1:{port}", credentials.internal) as channel:
            stub = pb_grpc.WorkerStub(channel)
            assert (await stub.CopyFile(pb.CopyFileRequest(dst="/m/d"), timeout=10)).file.path == "/m/d"
            assert [c.data async for c in stub.ReadBlock(pb.ReadBlockRequest(), timeout=10)] == [b"block"]
            assert (await stub.WriteFile(two_chunks(), timeout=10)).file.length == 3
        async with rpc.aio_channel(f"127.0.0.1:{port}", "not-a-token") as channel:
            with pytest.raises(grpc.RpcError) as refused:
                [c async for c in pb_grpc.WorkerStub(channel).ReadBlock(pb.ReadBlockRequest(), timeout=10)]
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await server.stop(0)


def test_a_channel_cache_dials_once_per_address_and_retires_the_replaced_channel() -> None:
    dialled: list[str] = []
    retired: list[tuple[str, str]] = []

    def dial(address: str) -> str:
        dialled.append(address)
        return f"channel to {address} #{len(dialled)}"

    cache = rpcutil.ChannelCache(dial, retire=lambda server_id, channel: retired.append((server_id, channel)))
    first = cache.get("w1", "10.0.0.1:29999")
    assert cache.get("w1", "10.0.0.1:29999") == first and dialled == ["10.0.0.1:29999"]
    moved = cache.get("w1", "10.0.0.9:29999")  # w1 came back elsewhere
    assert moved != first and retired == [("w1", first)]
    other = cache.get("w2", "10.0.0.2:29999")
    cache.drop("w2")
    assert retired == [("w1", first), ("w2", other)]
    assert cache.take_all() == [moved] and cache.take_all() == []


def test_a_channel_cache_without_retire_keeps_replaced_channels_until_taken() -> None:
    cache = rpcutil.ChannelCache(lambda address: f"channel to {address}")
    old = cache.get("w1", "a:1")
    new = cache.get("w1", "b:1")
    cache.get("w2", "c:1")
    cache.drop("w2")
    assert sorted(cache.take_all()) == sorted([new, old, "channel to c:1"])


def test_a_server_raises_its_open_file_limit_and_holds_connections_for_half_of_it() -> None:
    # A process started with a soft limit under its hard one (1024, as many hosts give) runs
    # with the hard one; gRPC connections get half of it, the rest stays for reads.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 512:
        pytest.skip(f"the hard open file limit here is {hard}")
    script = ("import resource; from strata.cacheserver import rpcutil; "
              "print(rpcutil.raise_open_file_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    answer = subprocess.run(["sh", "-c", 'ulimit -Sn 256 && exec "$@"', "sh", sys.executable, "-c", script],
                            capture_output=True, text=True, check=True).stdout.split()
    raised, soft = int(answer[0]), int(answer[1])
    assert raised == soft > 256
    assert rpcutil.connection_limit(raised) == raised // 2
    assert rpcutil.connection_limit(20) == rpcutil.MIN_CONNECTIONS
