"""The master's parts work without gRPC: the composition root wires them, and a concern is
driven by calling it (here the workers' membership RPCs and the write leases they end)."""

from __future__ import annotations

import asyncio

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
