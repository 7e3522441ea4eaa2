"""The master's parts work without gRPC: the composition root wires them, and a concern is
driven by calling it (here the workers' membership RPCs and the write leases they end)."""

from __future__ import annotations

import asyncio
import gc
import os
from pathlib import Path

from strata.cacheserver.master.server import build_parts
from strata.cacheserver.namespace.tree import Namespace
from strata.cacheserver.namespace.mounts import MountTable
from strata.contract.config import ServerConfig
from strata.contract.proto import strata_pb2 as pb


async def test_a_new_run_of_a_worker_ends_the_append_its_previous_run_held_open() -> None:
    config = ServerConfig()
    mounts = MountTable(None)
    mounts.add("/m", "memory://parts-test")
    parts = build_parts(config, mounts, Namespace(mounts, None, block_size=config.block_size), "token")
    worker = pb.WorkerInfo(worker_id="w0", address="127.0.0.1:1", host="node-a")
    try:
        await parts.workers.register_worker(pb.RegisterWorkerRequest(worker=worker, incarnation="run-1"))
        append = await parts.writes.prepare_write(pb.PrepareWriteRequest(path="/m/f", overwrite=True, exclusive=True,
                                                                         worker_id="w0"))
        waiting = asyncio.ensure_future(parts.writes.prepare_write(
            pb.PrepareWriteRequest(path="/m/f", overwrite=True, worker_id="w1")))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # an append of the file is open: the other write waits its turn
        again = await parts.workers.register_worker(pb.RegisterWorkerRequest(worker=worker, incarnation="run-2"))
        assert again.mount_table_version == parts.mounting.table_version
        after = await asyncio.wait_for(waiting, 5)  # the append ended with run-1: no lease to wait out
        assert after.write_id and after.write_id != append.write_id
        assert [w.worker_id for w in (await parts.workers.list_workers(pb.ListWorkersRequest())).workers] == ["w0"]
    finally:
        await parts.close()


def _refs(count: int, prefix: str) -> list[pb.BlockRef]:
    return [pb.BlockRef(mount_id=1, path=f"/m/{prefix}-{i}", version="v1", index=0, block_size=1 << 20,
                        file_length=4096, in_store=True, length=4096) for i in range(count)]


async def test_other_workers_heartbeat_between_the_steps_of_a_full_report() -> None:
    """A restarted master hears every worker's full block list at once: applied whole, those
    held the heartbeats behind them past the worker timeout, and the master dropped live
    workers. Now a heartbeat is answered while a large report is still being taken in."""
    config = ServerConfig()
    mounts = MountTable(None)
    parts = build_parts(config, mounts, Namespace(mounts, None, block_size=config.block_size), "token")
    try:
        other = pb.WorkerInfo(worker_id="w1", address="127.0.0.1:2", host="node-b")
        await parts.workers.register_worker(pb.RegisterWorkerRequest(worker=other, incarnation="r"))
        big = pb.RegisterWorkerRequest(worker=pb.WorkerInfo(worker_id="w0", address="127.0.0.1:1", host="node-a"),
                                       incarnation="r", blocks=_refs(20_000, "big"))
        report = asyncio.ensure_future(parts.workers.register_worker(big))
        await asyncio.sleep(0)  # the report has started
        answer = await parts.workers.heartbeat(pb.HeartbeatRequest(worker_id="w1"))
        assert not answer.reregister
        assert not report.done()  # answered between the report's steps, not after all of it
        await report
        assert len(parts.workers.blocks) == 20_000
    finally:
        await parts.close()


async def test_a_worker_s_heartbeat_is_answered_while_its_own_full_list_is_taken_in() -> None:
    """Every worker registering again at once (a master restart) puts each list behind the
    others; a worker heartbeats on meanwhile. A heartbeat that changes no blocks must not wait
    for its worker's list: its answer held back, the worker sends no next one, and the master
    drops it as silent (82 of 100 workers in bench/workers_scale.py's storm)."""
    config = ServerConfig()
    mounts = MountTable(None)
    parts = build_parts(config, mounts, Namespace(mounts, None, block_size=config.block_size), "token")
    info = pb.WorkerInfo(worker_id="w0", address="127.0.0.1:1", host="node-a")
    try:
        await parts.workers.register_worker(pb.RegisterWorkerRequest(worker=info, incarnation="r"))
        report = asyncio.ensure_future(parts.workers.register_worker(
            pb.RegisterWorkerRequest(worker=info, incarnation="r", blocks=_refs(20_000, "big"))))
        await asyncio.sleep(0)  # the list has started
        answer = await parts.workers.heartbeat(pb.HeartbeatRequest(worker_id="w0"))
        assert not answer.reregister
        assert len(parts.workers.blocks) < 20_000  # answered between the list's steps, not after all of it
        await report
        assert len(parts.workers.blocks) == 20_000
    finally:
        await parts.close()


async def test_a_worker_expired_while_it_registers_again_keeps_the_blocks_it_reported() -> None:
    config = ServerConfig()
    mounts = MountTable(None)
    parts = build_parts(config, mounts, Namespace(mounts, None, block_size=config.block_size), "token")
    worker = pb.WorkerInfo(worker_id="w0", address="127.0.0.1:1", host="node-a")
    try:
        await parts.workers.register_worker(pb.RegisterWorkerRequest(worker=worker, incarnation="r",
                                                                     blocks=_refs(10_000, "old")))
        # The expiry's drop (in steps) and the worker's new registration with a new list run
        # side by side: the new list is whole afterwards, the old one gone.
        parts.workers.membership._workers["w0"].last_heartbeat -= 3600  # silent for an hour
        expiry = asyncio.ensure_future(parts.workers.expire_workers())
        await asyncio.sleep(0)
        await parts.workers.register_worker(pb.RegisterWorkerRequest(worker=worker, incarnation="r2",
                                                                     blocks=_refs(5_000, "new")))
        await expiry
        assert len(parts.workers.blocks) == 5_000
    finally:
        await parts.close()


async def test_a_worker_waiting_for_its_registration_is_not_dropped_as_silent() -> None:
    """A worker sends no heartbeat until its registration is answered; a restarted master
    takes the full lists one at a time, so the last ones wait past the heartbeat timeout (2 of
    100 workers were dropped in bench/workers_scale.py's storm). Waiting there is not silence,
    and the heartbeats count from the answer."""
    config = ServerConfig()
    mounts = MountTable(None)
    parts = build_parts(config, mounts, Namespace(mounts, None, block_size=config.block_size), "token")
    first = pb.WorkerInfo(worker_id="w0", address="127.0.0.1:1", host="node-a")
    second = pb.WorkerInfo(worker_id="w1", address="127.0.0.1:2", host="node-b")
    try:
        ahead = asyncio.ensure_future(parts.workers.register_worker(
            pb.RegisterWorkerRequest(worker=first, incarnation="r", blocks=_refs(20_000, "a"))))
        await asyncio.sleep(0)  # w0's list is being taken in
        waiting = asyncio.ensure_future(parts.workers.register_worker(
            pb.RegisterWorkerRequest(worker=second, incarnation="r", blocks=_refs(10, "b"))))
        await asyncio.sleep(0)  # w1 waits behind it
        assert not waiting.done()
        parts.workers.membership._workers["w1"].last_heartbeat -= 3600  # as if it had waited an hour
        await parts.workers.expire_workers()
        await ahead
        await waiting
        await parts.workers.expire_workers()  # answered just now: its heartbeats count from here
        live = [w.worker_id for w in (await parts.workers.list_workers(pb.ListWorkersRequest())).workers]
        assert sorted(live) == ["w0", "w1"]
        assert len(parts.workers.blocks) == 20_010
    finally:
        await parts.close()


async def test_a_registered_worker_keeps_none_of_its_registrations_block_list() -> None:
    """What the master keeps of a worker's registration (its address, its stats) must not hold
    the request's block list: a part of a parsed request keeps the whole request's memory
    alive, ~1.4 MiB for 10,000 blocks, for as long as the worker is known (at 100 workers,
    ~150 MB more than the block index itself). Here 30 workers register with one list of the
    same 10,000 blocks (so the index grows little) parsed from the wire, as gRPC hands it over."""
    config = ServerConfig()
    mounts = MountTable(None)
    parts = build_parts(config, mounts, Namespace(mounts, None, block_size=config.block_size), "token")
    workers = 30
    try:
        wire = [pb.RegisterWorkerRequest(worker=pb.WorkerInfo(worker_id=f"w{n}", address=f"127.0.0.1:{n + 1}", host="h"),
                                         incarnation="r", blocks=_refs(10_000, "shared")).SerializeToString()
                for n in range(workers + 1)]
        await parts.workers.register_worker(pb.RegisterWorkerRequest.FromString(wire.pop()))  # the index's table sized
        before = _resident()
        for data in wire:
            await parts.workers.register_worker(pb.RegisterWorkerRequest.FromString(data))
        grown = _resident() - before
    finally:
        await parts.close()
    assert grown / workers < 600_000, f"{grown / workers:,.0f} bytes more a worker"


def _resident() -> int:
    gc.collect()
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
