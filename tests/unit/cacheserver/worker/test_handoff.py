"""The hand-off of a leaving worker's blocks to the workers that stay: two workers' parts, each
behind a real gRPC server, a real master and a real S3 store (moto)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest

from strata.cacheserver import rpcutil
from strata.cacheserver.worker.settings import HandoffSettings
from strata.cacheserver.worker.membership import Endpoints
from strata.cacheserver.worker.server import WorkerParts
from strata.cacheserver.worker.service import WorkerService
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc

from .conftest import CREDENTIALS, Cluster, ref_for

DATA = bytes(range(251)) * 50  # three blocks and a part
BLOCKS = 4

Serve = Callable[[str], Awaitable[WorkerParts]]


@pytest.fixture
async def serve(cluster: Cluster) -> AsyncIterator[Serve]:
    """Workers' parts each behind a real gRPC server, registered at its port and heartbeating
    (as a running worker does: the master forgets a silent one within a second)."""
    servers: list[grpc.aio.Server] = []
    beating: list[asyncio.Task[None]] = []

    async def start(name: str) -> WorkerParts:
        parts = await cluster.worker(name, register=False)
        server = rpcutil.server(CREDENTIALS, max_receive_bytes=rpcutil.WORKER_MAX_RECEIVE_BYTES)
        port = rpcutil.add_port(server, "worker", "127.0.0.1", 0)
        pb_grpc.add_WorkerServicer_to_server(
            WorkerService(reads=parts.reads, writes=parts.writes, retention=parts.retention), server)
        await server.start()
        servers.append(server)
        parts.membership.listening(Endpoints(port=port, http_port=1, data_port=1))
        await parts.membership.register()
        beating.append(asyncio.create_task(parts.membership.heartbeat_loop()))
        return parts

    await cluster.mount()
    yield start
    for task in beating:
        task.cancel()
    await asyncio.gather(*beating, return_exceptions=True)
    for server in servers:
        await server.stop(0)


async def leaving_with_the_file(cluster: Cluster, serve: Serve) -> tuple[WorkerParts, WorkerParts, pb.FileInfo]:
    """w1 holds every block of a file and w2 none; both live."""
    cluster.put("m/hot", DATA)
    leaving, staying = await serve("w1"), await serve("w2")
    info = await cluster.status("/m/hot")
    await leaving.reads.cache_blocks([ref_for(info, i) for i in range(BLOCKS)])
    await leaving.membership.heartbeat_once()  # the master learns where the blocks are
    await staying.peers.refresh()
    return leaving, staying, info


async def decommission(cluster: Cluster, *names: str) -> None:
    await cluster.admin.DecommissionWorkers(pb.DecommissionWorkersRequest(worker_ids=list(names)), timeout=10)


def held(parts: WorkerParts) -> set[int]:
    return {b.key.index for b in parts.store.blocks()}


async def test_a_worker_scaled_in_hands_its_blocks_to_the_worker_that_stays_not_to_the_store(
        cluster: Cluster, serve: Serve) -> None:
    leaving, staying, _ = await leaving_with_the_file(cluster, serve)
    await decommission(cluster, "w1")
    result = await leaving.handoff.run()
    assert result is not None and (result.blocks, result.bytes) == (BLOCKS, len(DATA))
    assert held(staying) == set(range(BLOCKS))
    assert staying.reads.counters.peer_bytes_read == len(DATA)  # every byte from w1
    assert leaving.reads.counters.peer_bytes_served == len(DATA)
    assert staying.reads.counters.ufs_bytes_read == 0


async def test_a_worker_that_restarts_keeps_its_blocks_and_hands_nothing_off(
        cluster: Cluster, serve: Serve) -> None:
    leaving, staying, _ = await leaving_with_the_file(cluster, serve)
    leaving.handoff.settings = HandoffSettings(notice_seconds=0.5)
    started = time.monotonic()
    assert await leaving.handoff.run() is None  # not decommissioned: a restart or an update
    assert time.monotonic() - started >= 0.5  # asked until its notice time was over
    assert held(staying) == set()


async def test_a_worker_told_to_leave_just_after_its_stop_signal_hands_its_blocks_off(
        cluster: Cluster, serve: Serve) -> None:
    """A drain: the operator tells the master as the node is cordoned, at about the time the
    worker is evicted; the worker asks again within its notice time."""
    leaving, staying, _ = await leaving_with_the_file(cluster, serve)
    leaving.handoff.settings = HandoffSettings(notice_seconds=5)
    stopping = asyncio.create_task(leaving.handoff.run())
    await asyncio.sleep(1)
    assert not stopping.done()
    await decommission(cluster, "w1")
    result = await asyncio.wait_for(stopping, 10)
    assert result is not None and result.blocks == BLOCKS
    assert held(staying) == set(range(BLOCKS))
    assert staying.reads.counters.ufs_bytes_read == 0


async def test_blocks_another_worker_holds_are_left_alone(cluster: Cluster, serve: Serve) -> None:
    leaving, staying, info = await leaving_with_the_file(cluster, serve)
    await staying.reads.cache_blocks([ref_for(info, 0)])
    await staying.membership.heartbeat_once()
    await decommission(cluster, "w1")
    result = await leaving.handoff.run()
    assert result is not None and (result.blocks, result.held_elsewhere) == (BLOCKS - 1, 1)
    assert held(staying) == set(range(BLOCKS))
    assert leaving.reads.counters.peer_bytes_served == len(DATA)  # block 0 sent once, not again


async def test_the_hand_off_keeps_to_its_bandwidth_and_time(cluster: Cluster, serve: Serve) -> None:
    leaving, staying, _ = await leaving_with_the_file(cluster, serve)
    await decommission(cluster, "w1")
    leaving.handoff.settings = HandoffSettings(seconds=0.5, bytes_per_second=len(DATA))  # a second's worth
    result = await leaving.handoff.run()
    assert result is not None and (result.blocks, result.left) == (0, BLOCKS)
    assert held(staying) == set()

    leaving.handoff.settings = HandoffSettings(seconds=30, bytes_per_second=4 * len(DATA))
    started = time.monotonic()
    result = await leaving.handoff.run()
    assert result is not None and result.blocks == BLOCKS
    assert time.monotonic() - started >= 0.25  # never faster than its rate
