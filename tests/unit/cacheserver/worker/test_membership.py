"""Membership: what a worker tells the master when it registers and on each heartbeat."""

from __future__ import annotations

import pytest

from strata.cacheserver.common.blockrefs import key_of
from strata.cacheserver.settings import ServerEnvironment
from strata.cacheserver.worker.membership import WorkerIdentity, identity_from_env
from strata.contract.errors import Unreachable
from strata.contract.proto import strata_pb2 as pb

from .conftest import BLOCK, Cluster, ref_for


async def holders(cluster: Cluster, path: str) -> list[list[str]]:
    located = await cluster.admin.GetBlockLocations(pb.GetBlockLocationsRequest(path=path), timeout=30)
    return [sorted(b.worker_ids) for b in located.blocks]


async def test_registration_advertises_the_endpoints_and_the_blocks_found_on_disk(cluster: Cluster) -> None:
    await cluster.mount()
    cluster.put("m/a", b"a" * (2 * BLOCK))
    first = await cluster.worker("w1")
    info = await cluster.status("/m/a")
    await first.reads.cache_blocks([ref_for(info, 0), ref_for(info, 1)])
    await first.close()
    # The same folder again: the blocks found there are reported with the registration.
    again = await cluster.worker("w1")
    assert len(list(again.store.blocks())) == 2
    assert await holders(cluster, "/m/a") == [["w1"], ["w1"]]
    [listed] = (await cluster.admin.ListWorkers(pb.ListWorkersRequest(), timeout=30)).workers
    assert (listed.worker_id, listed.host, listed.address, listed.data_port) == ("w1", "host-w1", "127.0.0.1:1", 1)


async def test_heartbeats_carry_blocks_added_and_removed(cluster: Cluster) -> None:
    await cluster.mount()
    cluster.put("m/b", b"b" * (2 * BLOCK))
    parts = await cluster.worker()
    info = await cluster.status("/m/b")
    await parts.reads.cache_blocks([ref_for(info, 0), ref_for(info, 1)])
    await parts.membership.heartbeat_once()
    assert await holders(cluster, "/m/b") == [["w1"], ["w1"]]
    parts.store.free(lambda key: key == key_of(ref_for(info, 1)))
    await parts.membership.heartbeat_once()
    assert await holders(cluster, "/m/b") == [["w1"], []]
    stats = (await cluster.admin.Report(pb.ReportRequest(), timeout=30)).workers[0].stats
    assert stats.misses == 2 and stats.cached_bytes_by_mount == {info.mount_id: BLOCK}


async def test_a_failed_heartbeat_keeps_its_deltas_for_the_next(cluster: Cluster) -> None:
    await cluster.mount()
    cluster.put("m/c", b"c" * BLOCK)
    parts = await cluster.worker()
    info = await cluster.status("/m/c")
    await parts.reads.cache_blocks([ref_for(info, 0)])
    await cluster.master.server.stop(0)  # the master goes away
    with pytest.raises(Unreachable):
        await parts.membership.heartbeat_once()
    assert [ref.path for ref in parts.membership.reports.added.values()] == ["/m/c"]


def test_a_worker_names_itself_from_its_environment() -> None:
    pod = ServerEnvironment(node_name="node-3", hostname="ignored", pod_ip="10.1.2.3", pod_name="demo-worker-0")
    assert identity_from_env(29999, pod) == WorkerIdentity("demo-worker-0", "node-3", "10.1.2.3")
    local = ServerEnvironment(hostname="laptop", advertise_host="0.0.0.0", pod_ip="10.9.9.9")
    assert identity_from_env(30999, local) == WorkerIdentity("laptop:30999", "laptop", "0.0.0.0")


async def decommissioned(cluster: Cluster) -> dict[str, bool]:
    listed = (await cluster.admin.ListWorkers(pb.ListWorkersRequest(), timeout=30)).workers
    return {w.worker_id: w.decommissioning for w in listed}


async def test_a_worker_scaled_in_and_back_serves_again_once_its_draining_run_is_replaced(cluster: Cluster) -> None:
    """What the operator and a StatefulSet do on 3 -> 2 -> 3, through the real master: the
    leaving run tells the master it stops at its stop signal, so the master keeps it out
    of placement even when the operator wants the name back before it is gone; the new run
    of the same name is in service at once."""
    await cluster.mount()
    await cluster.worker("w0")
    leaving = await cluster.worker("w1")
    await cluster.admin.DecommissionWorkers(pb.DecommissionWorkersRequest(worker_ids=["w1"]), timeout=30)
    await leaving.membership.stop(timeout=5)
    assert await decommissioned(cluster) == {"w0": False, "w1": True}
    await cluster.admin.DecommissionWorkers(pb.DecommissionWorkersRequest(serving=["w0", "w1"]), timeout=30)
    await leaving.membership.heartbeat_once()  # it still drains
    assert await decommissioned(cluster) == {"w0": False, "w1": True}
    await leaving.close()
    back = await cluster.worker("w1")
    assert back.membership.incarnation != leaving.membership.incarnation
    assert await decommissioned(cluster) == {"w0": False, "w1": False}
    await back.membership.heartbeat_once()
    assert await decommissioned(cluster) == {"w0": False, "w1": False}
