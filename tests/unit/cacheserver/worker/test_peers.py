"""Peers and the gRPC adapter: a copy of a file only another worker holds reads its blocks
from that worker's WorkerService, over a real gRPC server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from strata.cacheserver import rpcutil
from strata.cacheserver.master.blocks import MAX_LOCATE_BLOCKS
from strata.cacheserver.worker import peers
from strata.cacheserver.worker.membership import Endpoints
from strata.cacheserver.worker.server import WorkerParts
from strata.cacheserver.worker.service import WorkerService
from strata.contract import rpc
from strata.contract.errors import FailedPrecondition, InvalidArgument
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc

from .conftest import BLOCK, CREDENTIALS, Cluster, chunks, ref_for

DATA = bytes(range(251)) * 50  # three blocks and a part


@pytest.fixture
async def served(cluster: Cluster) -> AsyncIterator[tuple[WorkerParts, grpc.aio.Server]]:
    """Worker w1's parts behind a real gRPC server, registered at its port."""
    await cluster.mount()
    parts = await cluster.worker("w1", register=False)
    server = rpcutil.server(CREDENTIALS, max_receive_bytes=rpcutil.WORKER_MAX_RECEIVE_BYTES)
    port = rpcutil.add_port(server, "worker", "127.0.0.1", 0)
    pb_grpc.add_WorkerServicer_to_server(
        WorkerService(reads=parts.reads, writes=parts.writes, retention=parts.retention), server)
    await server.start()
    parts.membership.listening(Endpoints(port=port, http_port=1, data_port=1))
    await parts.membership.register()
    yield parts, server
    await server.stop(0)


async def test_a_copy_reads_a_file_not_in_the_store_from_the_worker_holding_it(
        cluster: Cluster, served: tuple[WorkerParts, grpc.aio.Server]) -> None:
    holder, _ = served
    await holder.writes.write_file(chunks("/m/only-w1", DATA, write_type=pb.MUST_CACHE))
    await holder.membership.heartbeat_once()  # the master learns where its blocks are
    other = await cluster.worker("w2")
    await other.peers.refresh()
    info = await other.writes.copy_file(pb.CopyFileRequest(src="/m/only-w1", dst="/m/copy", write_type=pb.THROUGH))
    assert info.persisted and cluster.get("m/copy") == DATA
    assert holder.reads.counters.bytes_served == len(DATA)  # every byte came from w1


async def test_a_copy_whose_holder_does_not_answer_fails_naming_it(
        cluster: Cluster, served: tuple[WorkerParts, grpc.aio.Server]) -> None:
    holder, server = served
    await holder.writes.write_file(chunks("/m/gone", DATA[:BLOCK], write_type=pb.MUST_CACHE))
    await holder.membership.heartbeat_once()
    other = await cluster.worker("w2")
    await other.peers.refresh()
    await server.stop(0)
    with pytest.raises(FailedPrecondition, match=r"block 0 of /m/gone is not in the store.*w1:"):
        await other.writes.copy_file(pb.CopyFileRequest(src="/m/gone", dst="/m/copy2"))


async def test_the_adapter_turns_errors_into_statuses(
        cluster: Cluster, served: tuple[WorkerParts, grpc.aio.Server]) -> None:
    _, server = served
    master = await cluster.admin.ListWorkers(pb.ListWorkersRequest(), timeout=30)
    [w1] = master.workers
    async with rpc.aio_channel(w1.address, CREDENTIALS.data) as channel:
        stub = pb_grpc.WorkerStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            await stub.CopyFile(pb.CopyFileRequest(src="/m/x", dst="/m/x"), timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "onto itself" in caught.value.details()
        response = await stub.WriteFile(chunks("/m/via-grpc", DATA, write_type=pb.CACHE_THROUGH), timeout=30)
        assert response.file.length == len(DATA) and cluster.get("m/via-grpc") == DATA
        ref = pb.BlockRef(mount_id=response.file.mount_id, path="/m/via-grpc", version=response.file.version,
                          index=3, block_size=BLOCK, file_length=len(DATA), in_store=True)
        read = [c async for c in stub.ReadBlock(pb.ReadBlockRequest(block=ref), timeout=30)]
        assert b"".join(c.data for c in read) == DATA[3 * BLOCK:] and read[0].cache_hit


async def test_a_held_only_read_answers_from_the_cache_alone(
        cluster: Cluster, served: tuple[WorkerParts, grpc.aio.Server]) -> None:
    """What a worker that misses a block asks its holder: the cached bytes, or NOT_FOUND at
    once, never a store fetch made for it."""
    holder, _ = served
    master = await cluster.admin.ListWorkers(pb.ListWorkersRequest(), timeout=30)
    [w1] = master.workers
    response = await holder.writes.write_file(chunks("/m/held", DATA, write_type=pb.THROUGH))  # in the store only
    ref = pb.BlockRef(mount_id=response.mount_id, path="/m/held", version=response.version, index=1,
                      block_size=BLOCK, file_length=len(DATA), in_store=True)
    async with rpc.aio_channel(w1.address, CREDENTIALS.internal) as channel:
        stub = pb_grpc.WorkerStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            [c async for c in stub.ReadBlock(pb.ReadBlockRequest(block=ref, held_only=True), timeout=30)]
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND and "does not hold block 1" in caught.value.details()
        assert holder.reads.counters.ufs_bytes_read == 0
        await holder.reads.ensure_cached(ref)
        read = [c async for c in stub.ReadBlock(pb.ReadBlockRequest(block=ref, offset=10, length=100, held_only=True),
                                                timeout=30)]
        assert b"".join(c.data for c in read) == DATA[BLOCK + 10:BLOCK + 110]
        assert holder.reads.counters.peer_bytes_served == 100


async def test_the_master_says_where_blocks_are_from_its_index_and_bounds_the_question(cluster: Cluster) -> None:
    await cluster.mount()
    cluster.put("m/located", DATA)
    parts = await cluster.worker("w1")
    info = await cluster.status("/m/located")
    refs = [ref_for(info, i) for i in range(4)]
    await parts.reads.cache_blocks(refs[:2])
    await parts.membership.heartbeat_once()
    located = await parts.link.client.locate_blocks(refs)
    assert [(b.index, list(b.worker_ids), list(b.hosts)) for b in located] == [
        (0, ["w1"], ["host-w1"]), (1, ["w1"], ["host-w1"]), (2, [], []), (3, [], [])]
    with pytest.raises(InvalidArgument, match=f"at most {MAX_LOCATE_BLOCKS}"):
        await parts.link.client.locate_blocks([refs[0]] * (MAX_LOCATE_BLOCKS + 1))



async def test_cache_blocks_tells_the_store_bytes_apart_from_a_peers_copy(
        cluster: Cluster, served: tuple[WorkerParts, grpc.aio.Server]) -> None:
    """A load asks the block's owner; a block another worker holds is copied from it, which
    costs the store nothing (what a load's bytes_fetched counts)."""
    holder, _ = served
    cluster.put("m/p.bin", DATA)
    info = await cluster.status("/m/p.bin")
    refs = [ref_for(info, i) for i in range(len(DATA) // BLOCK + 1)]
    assert await holder.reads.cache_blocks(refs[:2]) == (2 * BLOCK, 2 * BLOCK, 2 * BLOCK)
    await holder.membership.heartbeat_once()
    other = await cluster.worker("w2")
    await other.peers.refresh()
    rest = len(DATA) - 2 * BLOCK
    assert await other.reads.cache_blocks(refs) == (len(DATA), len(DATA), rest)


async def test_a_worker_alone_fetches_a_store_block_it_misses_without_asking_the_master_where_it_is(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold read on the only worker (a training epoch's) costs the store request alone: no
    other worker can hold the block. A worker that joins is seen by the next miss once the
    list is older than ALONE_FOR, which then asks where the block is."""
    await cluster.mount()
    cluster.put("m/alone.bin", DATA)
    info = await cluster.status("/m/alone.bin")
    worker = await cluster.worker("w1")
    await worker.peers.refresh()
    asked: list[pb.BlockRef] = []
    locate = worker.link.client.locate_blocks

    async def counted(refs: list[pb.BlockRef], **kwargs: object) -> list[pb.BlockLocation]:
        asked.extend(refs)
        return await locate(refs, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(worker.link.client, "locate_blocks", counted)
    assert await worker.peers.held_elsewhere(ref_for(info, 0)) is None
    assert (await worker.reads.read_cached(ref_for(info, 1), 0, 10, promote=False))[0] == DATA[BLOCK:BLOCK + 10]
    assert asked == []
    monkeypatch.setattr(peers, "ALONE_FOR", 0.0)  # every miss looks at the list again
    await cluster.worker("w2")
    assert await worker.peers.held_elsewhere(ref_for(info, 2)) is None
    assert [r.index for r in asked] == [2]
