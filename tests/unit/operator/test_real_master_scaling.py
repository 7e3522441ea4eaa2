"""Scaling a CacheCluster in and out again against the real master service (in this
process, on 127.0.0.1), with workers registering as the real ones do: the master takes the
returning worker back into placement, and the cluster says Ready only once it has."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from strata.cacheserver.auth import Credentials
from strata.cacheserver.master.server import MasterHandle, start_master
from strata.contract.config import ServerConfig
from strata.contract.master import MasterClient
from strata.contract.proto import strata_pb2 as pb
from strata.operator.reconcile import Deps, reconcile_cluster
from tests.unit.operator.conftest import FakeKube, cluster_body, operator_at

TOKEN = "real-master-token"
CREDENTIALS = Credentials.from_admin(TOKEN)


@pytest.fixture
async def real_master(tmp_path: Path) -> AsyncIterator[MasterHandle]:
    # Heartbeats are sent by hand here: a long interval keeps the workers live meanwhile.
    config = ServerConfig.model_validate({"heartbeatInterval": 30})
    handle = await start_master(config, journal_dir=tmp_path / "journal", credentials=CREDENTIALS,
                                bind="127.0.0.1", port=0, http_port=0)
    yield handle
    await handle.stop(grace=0)


@pytest.fixture
async def deps(real_master: MasterHandle) -> AsyncIterator[Deps]:
    async with operator_at(f"127.0.0.1:{real_master.port}", TOKEN) as deps:
        yield deps


@pytest.fixture
async def workers(real_master: MasterHandle) -> AsyncIterator[MasterClient]:
    """The master as workers reach it (the internal token)."""
    client = MasterClient(f"127.0.0.1:{real_master.port}", CREDENTIALS.internal, timeout=5.0)
    yield client
    await client.close()


async def register(workers: MasterClient, ordinal: int, run: str, *, stopping: bool = False) -> None:
    name = f"demo-worker-{ordinal}"
    await workers.register_worker(pb.RegisterWorkerRequest(
        worker=pb.WorkerInfo(worker_id=name, host=f"node-{ordinal}", address=f"10.0.0.{ordinal}:29999"),
        incarnation=run, stopping=stopping))


def set_ready(kube: FakeKube, name: str, ready: int, pods: int | None = None) -> None:
    """The StatefulSet's status as its controller writes it: `ready` pods ready, all of the
    current revision, `pods` in all (more: pods of a scale-in still stopping)."""
    statefulset = kube.obj("StatefulSet", name)
    statefulset["status"] = {
        "observedGeneration": statefulset["metadata"].get("generation", 0), "readyReplicas": ready,
        "replicas": ready if pods is None else pods, "updatedReplicas": ready,
        "currentRevision": "r1", "updateRevision": "r1",
    }


async def scale(deps: Deps, replicas: int, generation: int) -> dict[str, Any]:
    assert isinstance(deps.kube, FakeKube)
    body = deps.kube.obj("CacheCluster", "demo")
    body["spec"] = {"worker": {"replicas": replicas}}
    body["metadata"]["generation"] = generation
    await reconcile_cluster(deps, body)
    status: dict[str, Any] = deps.kube.obj("CacheCluster", "demo")["status"]
    return status


async def reconciled(deps: Deps) -> dict[str, Any]:
    assert isinstance(deps.kube, FakeKube)
    await reconcile_cluster(deps, deps.kube.obj("CacheCluster", "demo"))
    status: dict[str, Any] = deps.kube.obj("CacheCluster", "demo")["status"]
    return status


async def decommissioning(real_master: MasterHandle) -> dict[str, bool]:
    members = real_master.parts.membership
    return {r.info.worker_id: r.decommissioning for r in members.live()}


def ready_condition(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Ready")


async def three_ready_workers(deps: Deps, workers: MasterClient) -> None:
    assert isinstance(deps.kube, FakeKube)
    deps.kube.put(cluster_body(spec={"worker": {"replicas": 3}}))
    await reconcile_cluster(deps, deps.kube.obj("CacheCluster", "demo"))
    set_ready(deps.kube, "demo-master", 1)
    await reconciled(deps)
    for ordinal in range(3):
        await register(workers, ordinal, f"run-{ordinal}-a")
    set_ready(deps.kube, "demo-worker", 3)
    assert (await reconciled(deps))["phase"] == "Ready"


async def test_scaled_in_and_out_again_the_returning_worker_is_placed_on_before_ready(
        deps: Deps, workers: MasterClient, real_master: MasterHandle) -> None:
    """3 -> 2 -> 3: the operator tells the master demo-worker-2 leaves, then that it is
    wanted again; the old run, still draining when the scale-out comes, stays out of
    placement; the new run is placed on; the cluster is Ready only once it is."""
    assert isinstance(deps.kube, FakeKube)
    await three_ready_workers(deps, workers)
    await scale(deps, 2, 2)
    assert deps.kube.obj("StatefulSet", "demo-worker")["spec"]["replicas"] == 2
    assert await decommissioning(real_master) == {"demo-worker-0": False, "demo-worker-1": False,
                                                  "demo-worker-2": True}
    await register(workers, 2, "run-2-a", stopping=True)  # its stop signal; the pod drains
    set_ready(deps.kube, "demo-worker", 2, pods=3)
    status = await scale(deps, 3, 3)  # scaled out again before the old pod is gone
    assert deps.kube.obj("StatefulSet", "demo-worker")["spec"]["replicas"] == 3
    assert status["phase"] != "Ready"
    assert await decommissioning(real_master) == {"demo-worker-0": False, "demo-worker-1": False,
                                                  "demo-worker-2": True}  # the draining run
    # The StatefulSet makes the new pod once the old one is gone; its run registers.
    set_ready(deps.kube, "demo-worker", 3)
    await register(workers, 2, "run-2-b")
    status = await reconciled(deps)
    assert await decommissioning(real_master) == {"demo-worker-0": False, "demo-worker-1": False,
                                                  "demo-worker-2": False}
    assert status["phase"] == "Ready", ready_condition(status)["message"]
    assert [r.info.worker_id for r in real_master.parts.membership.placement()] == [
        "demo-worker-0", "demo-worker-1", "demo-worker-2"]


async def test_a_cluster_is_not_ready_while_the_master_holds_a_counted_worker_decommissioned(
        deps: Deps, workers: MasterClient, real_master: MasterHandle) -> None:
    """The operator's word that the worker is wanted was lost (the StatefulSet is at 3 and
    the new pod registered before the operator told the master): the status says so and
    the reconcile tells the master; then it is Ready."""
    assert isinstance(deps.kube, FakeKube)
    await three_ready_workers(deps, workers)
    await scale(deps, 2, 2)
    set_ready(deps.kube, "demo-worker", 2)
    assert (await reconciled(deps))["phase"] == "Ready"
    body = deps.kube.obj("CacheCluster", "demo")
    body["spec"] = {"worker": {"replicas": 3}}
    body["metadata"]["generation"] = 3
    deps.kube.obj("StatefulSet", "demo-worker")["spec"]["replicas"] = 3  # grown, the master not told
    set_ready(deps.kube, "demo-worker", 3)
    await register(workers, 2, "run-2-b")
    assert (await decommissioning(real_master))["demo-worker-2"]
    status = await reconciled(deps)
    assert status["phase"] != "Ready"
    workers_ready = next(c for c in status["conditions"] if c["type"] == "WorkersReady")
    assert workers_ready["reason"] == "WorkersDecommissioned"
    assert "the master holds demo-worker-2 decommissioned" in workers_ready["message"]
    assert not (await decommissioning(real_master))["demo-worker-2"]  # told on the way
    assert (await reconciled(deps))["phase"] == "Ready"


async def test_a_master_restarted_during_the_scale_in_hears_again_who_leaves(
        deps: Deps, workers: MasterClient, real_master: MasterHandle, tmp_path: Path) -> None:
    """The master keeps membership in memory: while pods of a scale-in still stop, each
    reconcile names the leaving workers again."""
    assert isinstance(deps.kube, FakeKube)
    await three_ready_workers(deps, workers)
    await scale(deps, 2, 2)
    set_ready(deps.kube, "demo-worker", 2, pods=3)
    await real_master.stop(grace=0)
    again = await start_master(ServerConfig.model_validate({"heartbeatInterval": 30}), journal_dir=tmp_path / "journal",
                               credentials=CREDENTIALS, bind="127.0.0.1", port=real_master.port, http_port=0)
    try:
        for ordinal in range(2):  # each worker registers again with the new master
            await register(workers, ordinal, f"run-{ordinal}-a")
        await register(workers, 2, "run-2-a", stopping=True)
        assert not (await decommissioning(again))["demo-worker-2"]
        await reconciled(deps)
        assert await decommissioning(again) == {"demo-worker-0": False, "demo-worker-1": False,
                                                "demo-worker-2": True}
    finally:
        await again.stop(grace=0)
