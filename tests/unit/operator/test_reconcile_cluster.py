"""CacheCluster reconcile against an in-memory API server and a real gRPC master servicer."""

from __future__ import annotations

import base64
from typing import Any

import grpc

from strata.operator.drain import WorkerPod
from strata.operator.kube import KubeError
from strata.operator.reconcile import reconcile_cluster
from strata.operator.reconcile.cluster import tell_master_of_drain
from tests.unit.operator.conftest import World, cluster_body, set_ready, worker_report


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def bind_journal(world: World, storage_class: str = "standard") -> None:
    """The journal claim as the API server and the volume controller leave it: the default
    StorageClass named, bound."""
    claim = world.kube.obj("PersistentVolumeClaim", "demo-journal")
    claim["spec"]["storageClassName"] = storage_class
    claim["status"] = {"phase": "Bound"}


async def test_a_master_waiting_for_its_journal_claim_says_why(world: World) -> None:
    """No default StorageClass: the claim names none and stays Pending, and so does the
    master's pod; the cluster says so and what to do. Named later, the claim waits for its
    volume; bound, the cluster waits for the master pod as usual."""
    world.kube.put(cluster_body())
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    claim = world.kube.obj("PersistentVolumeClaim", "demo-journal")
    claim["metadata"]["namespace"] = "ns"
    claim["status"] = {"phase": "Pending"}
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert not out.done and not out.stalled
    status = world.kube.obj("CacheCluster", "demo")["status"]
    master = condition(status, "MasterReady")
    assert master["status"] == "False" and master["reason"] == "JournalClaimPending"
    assert "demo-journal is Pending: it names no StorageClass and the cluster has no default one" in master["message"]
    assert "spec.master.journal.volume.persistentVolumeClaim.storageClassName" in master["message"]
    assert condition(status, "Ready")["message"] == master["message"]
    assert status["phase"] == "Provisioning"

    world.kube.obj("CacheCluster", "demo")["spec"] = {
        "master": {"journal": {"volume": {"persistentVolumeClaim": {"storageClassName": "local"}}}}}
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert world.kube.obj("PersistentVolumeClaim", "demo-journal")["spec"]["storageClassName"] == "local"
    message = condition(world.kube.obj("CacheCluster", "demo")["status"], "MasterReady")["message"]
    assert "demo-journal (StorageClass local) is Pending" in message
    assert "kubectl describe pvc demo-journal -n ns" in message

    world.kube.obj("PersistentVolumeClaim", "demo-journal")["status"] = {"phase": "Lost"}
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    message = condition(world.kube.obj("CacheCluster", "demo")["status"], "MasterReady")["message"]
    assert "lost its volume (phase Lost)" in message and "kubectl delete pvc demo-journal -n ns" in message

    bind_journal(world, "local")
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert condition(world.kube.obj("CacheCluster", "demo")["status"], "MasterReady")["reason"] == "WaitingForMaster"


async def test_a_journal_off_a_claim_makes_none(world: World) -> None:
    world.kube.put(cluster_body(spec={"master": {"journal": {"volume": {"emptyDir": {}}}}}))
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert "PersistentVolumeClaim" not in world.kube.applied_kinds()
    status = world.kube.obj("CacheCluster", "demo")["status"]
    assert condition(status, "MasterReady")["reason"] == "WaitingForMaster"


async def test_master_first_then_workers_then_ready(world: World) -> None:
    world.kube.put(cluster_body())
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert not out.done and not out.stalled
    # The operator's copy of the tokens and the CSI tokens first, then the master's children.
    assert world.kube.applied_kinds() == ["Secret", "Secret", "ConfigMap", "Secret", "Service",
                                          "PersistentVolumeClaim", "StatefulSet"]
    bind_journal(world)
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    status = world.kube.obj("CacheCluster", "demo")["status"]
    assert status["phase"] == "Provisioning"
    assert condition(status, "MasterReady")["reason"] == "WaitingForMaster"
    assert condition(status, "Reconciling")["status"] == "True"
    assert status["master"] == {"ready": False, "endpoint": "demo-master-0.demo-master.ns.svc:19998"}

    # The master pod becomes ready: the operator talks to it (with the Secret's token) and
    # applies the workers.
    token = base64.b64decode(world.kube.obj("Secret", "demo-auth")["data"]["token"]).decode()
    world.master.state.token = token
    set_ready(world, "demo-master", 1)
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert not out.done
    assert world.kube.applied_kinds()[14:] == ["Secret", "Secret", "ConfigMap", "Secret", "Service",
                                               "PersistentVolumeClaim", "StatefulSet",
                                               "Service", "StatefulSet", "PodDisruptionBudget"]
    assert world.masters.endpoints[-1] == "demo-master-0.demo-master.ns.svc:19998"
    status = world.kube.obj("CacheCluster", "demo")["status"]
    assert condition(status, "MasterReady")["status"] == "True"
    assert condition(status, "WorkersReady")["reason"] == "WaitingForWorkers"

    # Workers ready and registered with the master: Ready, with capacity from the Report.
    set_ready(world, "demo-worker", 2)
    world.master.state.workers = [worker_report("demo-worker-0"), worker_report("demo-worker-1")]
    world.master.state.hits, world.master.state.misses = 93, 7
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert out.done, out.message
    status = world.kube.obj("CacheCluster", "demo")["status"]
    assert status["phase"] == "Ready"
    assert condition(status, "Ready")["status"] == "True"
    assert condition(status, "Stalled")["status"] == "False"
    assert status["workers"] == {"desired": 2, "ready": 2, "registered": 2, "summary": "2/2",
                                 "selector": "app.kubernetes.io/name=strata,app.kubernetes.io/instance=demo,"
                                             "app.kubernetes.io/component=worker"}
    assert status["capacity"] == {"total": "2Gi", "used": "512Mi",
                                  "tiers": [{"medium": "MEM", "total": "2Gi", "used": "512Mi"}]}
    assert status["cache"] == {"hitRatio": 0.93, "cachedBytes": "512Mi"}
    assert status["observedGeneration"] == 1


async def ready_cluster(world: World, spec: dict[str, Any] | None = None, workers: int = 2) -> None:
    world.kube.put(cluster_body(spec=spec))
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    world.master.state.token = base64.b64decode(world.kube.obj("Secret", "demo-auth")["data"]["token"]).decode()
    set_ready(world, "demo-master", 1)
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    set_ready(world, "demo-worker", workers)
    world.master.state.workers = [worker_report(f"demo-worker-{i}") for i in range(workers)]
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert out.done, out.message


async def test_second_run_changes_nothing(world: World) -> None:
    await ready_cluster(world)
    writes = len(world.kube.status_writes)
    before = {k: v for k, v in world.kube.objects.items() if k[0] != "CacheCluster"}
    token = world.kube.obj("Secret", "demo-auth")["data"]["token"]
    world.clock.advance(60)
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert out.done
    assert len(world.kube.status_writes) == writes  # status unchanged: not written
    assert {k: v for k, v in world.kube.objects.items() if k[0] != "CacheCluster"} == before
    assert world.kube.obj("Secret", "demo-auth")["data"]["token"] == token  # token kept


async def test_a_secret_with_one_token_keeps_it_and_gets_the_data_and_internal_ones(world: World) -> None:
    """A cluster made when there was one token: that token stays the admin one (running
    clients keep working), and the data and internal tokens are added."""
    old = base64.b64encode(b"the-old-token").decode()
    world.kube.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "demo-auth", "namespace": "ns"},
                    "data": {"token": old}})
    world.kube.put(cluster_body())
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    data = world.kube.obj("Secret", "demo-auth")["data"]
    assert data["token"] == old
    tokens = {base64.b64decode(data[k]).decode() for k in ("token", "dataToken", "internalToken")}
    assert len(tokens) == 3 and all(len(t) >= 32 for t in tokens - {"the-old-token"})
    pod = world.kube.obj("StatefulSet", "demo-master")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["STRATA_TOKEN_FILE"] == "/etc/strata/auth/token"
    assert env["STRATA_DATA_TOKEN_FILE"] == "/etc/strata/auth/dataToken"
    assert env["STRATA_INTERNAL_TOKEN_FILE"] == "/etc/strata/auth/internalToken"


async def test_deleted_child_is_put_back(world: World) -> None:
    await ready_cluster(world)
    del world.kube.objects[("ConfigMap", "ns", "demo-config")]
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert "strata.yaml" in world.kube.obj("ConfigMap", "demo-config")["data"]


async def test_lost_worker_degrades_then_recovers(world: World) -> None:
    await ready_cluster(world)
    ready_since = condition(world.kube.obj("CacheCluster", "demo")["status"], "Ready")["lastTransitionTime"]
    world.clock.advance(30)
    set_ready(world, "demo-worker", 1)
    world.master.state.workers[1].live = False
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert not out.done
    status = world.kube.obj("CacheCluster", "demo")["status"]
    assert status["phase"] == "Degraded"
    ready = condition(status, "Ready")
    assert ready["status"] == "False" and ready["lastTransitionTime"] != ready_since
    assert status["capacity"]["total"] == "1Gi"  # only live workers count
    world.clock.advance(30)
    set_ready(world, "demo-worker", 2)
    world.master.state.workers[1].live = True
    assert (await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))).done


async def test_scale_in_decommissions_before_shrinking(world: World) -> None:
    await ready_cluster(world, workers=3, spec={"worker": {"replicas": 3}})
    body = world.kube.obj("CacheCluster", "demo")
    body["spec"] = {"worker": {"replicas": 1}}
    body["metadata"]["generation"] = 2
    await reconcile_cluster(world.deps, body)
    (decommission,) = [req for name, req in world.master.state.calls if name == "DecommissionWorkers"]
    assert list(decommission.worker_ids) == ["demo-worker-1", "demo-worker-2"]
    assert world.kube.obj("StatefulSet", "demo-worker")["spec"]["replicas"] == 1


async def test_scale_in_waits_while_the_master_cannot_be_told(world: World) -> None:
    await ready_cluster(world, workers=3, spec={"worker": {"replicas": 3}})
    world.master.state.decommission_error = (grpc.StatusCode.INTERNAL, "journal is read-only")
    body = world.kube.obj("CacheCluster", "demo")
    body["spec"] = {"worker": {"replicas": 2}}
    body["metadata"]["generation"] = 2
    out = await reconcile_cluster(world.deps, body)
    assert not out.done and not out.stalled
    assert world.kube.obj("StatefulSet", "demo-worker")["spec"]["replicas"] == 3
    reconciling = condition(world.kube.obj("CacheCluster", "demo")["status"], "Reconciling")
    assert reconciling["reason"] == "DecommissionFailed"
    assert "demo-worker-2" in reconciling["message"]


async def test_scale_out_decommissions_nothing_and_names_the_workers_wanted(world: World) -> None:
    await ready_cluster(world)
    body = world.kube.obj("CacheCluster", "demo")
    body["spec"] = {"worker": {"replicas": 4}}
    await reconcile_cluster(world.deps, body)
    (told,) = [req for name, req in world.master.state.calls if name == "DecommissionWorkers"]
    assert list(told.worker_ids) == []
    assert list(told.serving) == [f"demo-worker-{i}" for i in range(4)]
    assert world.kube.obj("StatefulSet", "demo-worker")["spec"]["replicas"] == 4


async def test_a_draining_worker_is_told_to_leave_and_serves_again_once_its_pod_runs_elsewhere(world: World) -> None:
    """`kubectl drain` of demo-worker-1's node: the operator tells the master at once that the
    worker leaves (so its stop hands its blocks off), the cluster's reconcile keeps telling
    it (never that it serves) and stays Ready; once its next pod runs on another node the
    name serves again."""
    await ready_cluster(world, workers=3, spec={"worker": {"replicas": 3}})
    drains = world.deps.drains
    for i, node in enumerate(("node-1", "node-2", "node-3")):
        drains.pod_changed(WorkerPod(f"uid-{i}", "ns", "demo", f"demo-worker-{i}", node, disrupted=False))
    world.master.state.calls.clear()
    assert drains.node_changed("node-2", True) == [("ns", "demo")]
    await tell_master_of_drain(world.deps, "ns", "demo")
    (told,) = [req for name, req in world.master.state.calls if name == "DecommissionWorkers"]
    assert (list(told.worker_ids), list(told.serving)) == (["demo-worker-1"], [])

    world.master.state.workers[1].worker.decommissioning = True
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert out.done, out.message  # a drain is no fault of the cluster's
    told = [req for name, req in world.master.state.calls if name == "DecommissionWorkers"][-1]
    assert list(told.worker_ids) == ["demo-worker-1"]
    assert list(told.serving) == ["demo-worker-0", "demo-worker-2"]
    assert world.kube.obj("StatefulSet", "demo-worker")["spec"]["replicas"] == 3

    drains.pod_gone("uid-1")
    drains.pod_changed(WorkerPod("uid-1b", "ns", "demo", "demo-worker-1", "node-3", disrupted=False))
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    told = [req for name, req in world.master.state.calls if name == "DecommissionWorkers"][-1]
    assert list(told.worker_ids) == []
    assert list(told.serving) == ["demo-worker-0", "demo-worker-1", "demo-worker-2"]


async def test_a_drain_the_master_cannot_be_told_of_is_only_logged(world: World) -> None:
    await ready_cluster(world)
    world.deps.drains.pod_changed(WorkerPod("uid-0", "ns", "demo", "demo-worker-0", "node-1", disrupted=True))
    world.master.state.decommission_error = (grpc.StatusCode.UNAVAILABLE, "restarting")
    await tell_master_of_drain(world.deps, "ns", "demo")  # no exception: the reconcile tells it again
    await tell_master_of_drain(world.deps, "ns", "absent")  # no such cluster: nothing to tell


async def test_invalid_spec_stalls_without_applying(world: World) -> None:
    # The CRD refuses this; an object stored under an older CRD version could still hold it.
    world.kube.put(cluster_body(spec={"tiers": [{"medium": "SSD", "quota": "1Gi"}, {"medium": "MEM", "quota": "1Gi"}]}))
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert out.stalled
    assert world.kube.applied == []
    status = world.kube.obj("CacheCluster", "demo")["status"]
    assert status["phase"] == "Pending"
    stalled = condition(status, "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "InvalidSpec"
    assert "fastest first" in stalled["message"]


async def test_refused_apply_stalls(world: World) -> None:
    world.kube.refuse["StatefulSet"] = KubeError(422, 'StatefulSet "demo-master" is invalid: spec.template: bad')
    world.kube.put(cluster_body())
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert out.stalled
    stalled = condition(world.kube.obj("CacheCluster", "demo")["status"], "Stalled")
    assert stalled["reason"] == "ApplyFailed" and "spec.template: bad" in stalled["message"]


async def test_unreachable_master_is_reported(world: World) -> None:
    await ready_cluster(world)
    await world.master.stop()
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert not out.done
    status = world.kube.obj("CacheCluster", "demo")["status"]
    master = condition(status, "MasterReady")
    assert master["reason"] == "MasterUnreachable"
    assert "demo-master-0.demo-master.ns.svc:19998" in master["message"]
    assert status["master"]["ready"] is False
    assert "capacity" not in status  # no stale numbers when the master cannot be asked


async def test_terminating(world: World) -> None:
    await ready_cluster(world)
    body = world.kube.obj("CacheCluster", "demo")
    body["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    out = await reconcile_cluster(world.deps, body)
    assert out.done
    assert world.kube.obj("CacheCluster", "demo")["status"]["phase"] == "Terminating"
    assert "ns.demo" not in world.kube.obj("Secret", "strata-csi-tokens", "strata-system").get("data", {})


async def test_the_data_token_is_shared_with_the_csi_plugin_and_no_other_token(world: World) -> None:
    """The node plugin reads one Secret in the operator's namespace: each cluster's data
    token under its own key, kept when other clusters come and go."""
    world.kube.put(cluster_body())
    world.kube.put(cluster_body(name="other"))
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "other"))
    auth = world.kube.obj("Secret", "demo-auth")["data"]
    shared = world.kube.obj("Secret", "strata-csi-tokens", "strata-system")["data"]
    assert sorted(shared) == ["ns.demo", "ns.other"]
    assert shared["ns.demo"] == auth["dataToken"]
    assert auth["token"] not in shared.values() and auth["internalToken"] not in shared.values()
    gone = world.kube.obj("CacheCluster", "other")
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    await reconcile_cluster(world.deps, gone)
    assert sorted(world.kube.obj("Secret", "strata-csi-tokens", "strata-system")["data"]) == ["ns.demo"]


async def test_a_deleted_auth_secret_comes_back_unchanged(world: World) -> None:
    """Deleting `<cluster>-auth` used to mint new tokens: the servers rolled, the master could
    not open its journal's credentials, and every running pod's volume (which holds the old
    data token) failed its reads."""
    world.kube.put(cluster_body())
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    before = dict(world.kube.obj("Secret", "demo-auth")["data"])
    master = world.kube.obj("StatefulSet", "demo-master")["spec"]["template"]
    kept = world.kube.obj("Secret", "strata-cluster-tokens", "strata-system")["data"]
    assert sorted(kept) == ["ns.demo.dataToken", "ns.demo.internalToken", "ns.demo.token"]
    del world.kube.objects[("Secret", "ns", "demo-auth")]
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert world.kube.obj("Secret", "demo-auth")["data"] == before
    assert world.kube.obj("StatefulSet", "demo-master")["spec"]["template"] == master  # nothing rolls
    gone = world.kube.obj("CacheCluster", "demo")
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    await reconcile_cluster(world.deps, gone)
    assert not world.kube.obj("Secret", "strata-cluster-tokens", "strata-system").get("data")


async def test_a_namespace_that_grants_no_secrets_says_how_to_grant_them(world: World) -> None:
    world.deps.settings = world.deps.settings.model_copy(update={"tenant_role": "strata-tenant",
                                                                "service_account": "strata-operator"})
    world.kube.refuse["Secret"] = KubeError(403, 'secrets "demo-auth" is forbidden: User "system:serviceaccount:'
                                                 'strata-system:strata-operator" cannot patch resource "secrets"')
    world.kube.put(cluster_body())
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert out.stalled
    message = condition(world.kube.obj("CacheCluster", "demo")["status"], "Stalled")["message"]
    assert ("kubectl create rolebinding strata-operator -n ns --clusterrole=strata-tenant "
            "--serviceaccount=strata-system:strata-operator") in message


async def test_events_tell_of_ready_and_scaling_once(world: World) -> None:
    await ready_cluster(world)
    # ready_cluster ran the reconciles that made it Ready; the last one told of it.
    world.kube.obj("CacheCluster", "demo")["spec"] = {"worker": {"replicas": 3}}
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert ("Normal", "Scaled") in [(n.type, n.reason) for n in out.notes]
    assert "from 2 to 3" in next(n.message for n in out.notes if n.reason == "Scaled")
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert not [n for n in out.notes if n.reason == "Scaled"]


async def test_an_invalid_spec_is_told_as_a_warning(world: World) -> None:
    world.kube.put(cluster_body(spec={"worker": {"replicas": -1}}))
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert [(n.type, n.reason) for n in out.notes] == [("Warning", "InvalidSpec")]


async def test_not_ready_while_pods_roll_out_or_leave(world: World) -> None:
    """Ready means every pod is of its StatefulSet's current spec: not during a rolling update
    (e.g. after a tier quota edit), nor while pods of a scale-in still terminate."""
    world.kube.put(cluster_body())
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    world.master.state.token = base64.b64decode(world.kube.obj("Secret", "demo-auth")["data"]["token"]).decode()
    set_ready(world, "demo-master", 1)
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    world.master.state.workers = [worker_report("demo-worker-0"), worker_report("demo-worker-1")]
    set_ready(world, "demo-worker", 2)
    assert (await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))).done

    # A rolling update: both pods ready and registered, one of them still of the old revision.
    set_ready(world, "demo-worker", 2, revision="r2", updated=1)
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    status = world.kube.obj("CacheCluster", "demo")["status"]
    assert not out.done and status["phase"] != "Ready"
    assert condition(status, "Ready")["reason"] == "RollingOut"
    assert "demo-worker: 1/2 pods are of the current revision" in condition(status, "Reconciling")["message"]

    # A pod of a scale-in still terminating.
    set_ready(world, "demo-worker", 2, pods=3)
    assert not (await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))).done
    assert "1 pod(s) of a scale-in still terminating" in condition(
        world.kube.obj("CacheCluster", "demo")["status"], "Ready")["message"]

    set_ready(world, "demo-worker", 2)
    out = await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    assert out.done
    assert ("Normal", "RolledOut") in [(n.type, n.reason) for n in out.notes]  # told once, when it is over
    assert not (await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))).notes
