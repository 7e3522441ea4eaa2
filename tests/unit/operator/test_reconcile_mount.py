"""Mount reconcile and delete against an in-memory API server and a real gRPC master servicer."""

from __future__ import annotations

import base64
from typing import Any

import grpc
import pytest

from strata.contract.proto import strata_pb2 as pb
from strata.operator.kube import KubeError
from strata.operator.reconcile import ObjectState, reconcile_mount, remove_mount
from tests.unit.operator.conftest import TOKEN, FakeKube, World, mount_body


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def ready_cluster(world: World) -> None:
    """A CacheCluster whose status says its master is ready, and its token Secret."""
    world.kube.put({"apiVersion": "strata.dev/v1alpha1", "kind": "CacheCluster",
                    "metadata": {"name": "demo"}, "spec": {}, "status": {"master": {"ready": True}}})
    world.kube.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "demo-auth"},
                    "data": {"token": b64(TOKEN)}})


def creds(world: World, **data: str) -> None:
    world.kube.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-creds"},
                    "data": {k: b64(v) for k, v in data.items()}})


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


async def reconcile(world: World, state: ObjectState, name: str = "data") -> Any:
    return await reconcile_mount(world.deps, world.kube.obj("Mount", name), state)


async def test_waits_for_its_cluster(world: World) -> None:
    world.kube.put(mount_body())
    state = ObjectState()
    out = await reconcile(world, state)
    assert not out.done and not out.stalled
    status = world.kube.obj("Mount", "data")["status"]
    assert status["phase"] == "Pending"
    assert condition(status, "Reconciling")["reason"] == "ClusterNotFound"
    assert "ns/demo" in condition(status, "Ready")["message"]
    world.kube.put({"apiVersion": "strata.dev/v1alpha1", "kind": "CacheCluster",
                    "metadata": {"name": "demo"}, "spec": {}, "status": {"master": {"ready": False}}})
    await reconcile(world, state)
    assert condition(world.kube.obj("Mount", "data")["status"], "Ready")["reason"] == "ClusterNotReady"
    assert world.master.state.calls == []


async def test_mounts_with_credentials_and_reports_the_cache(world: World) -> None:
    ready_cluster(world)
    creds(world, key="AKIA", secret="hunter2")
    world.kube.put(mount_body(credentials={"secretRef": {"name": "s3-creds"}},
                              options={"endpoint_url": "http://127.0.0.1:9"}, readOnly=True,
                              metadataSync={"interval": "5m"}, readType="CACHE_PROMOTE", pin=True, ttl="24h"))
    state = ObjectState()
    out = await reconcile(world, state)
    assert out.done, out.message
    (request,) = [r for name, r in world.master.state.calls if name == "Mount"]
    assert request.path == "/datasets/a" and request.source == "s3://bucket/a"
    assert dict(request.options.credentials) == {"key": "AKIA", "secret": "hunter2"}
    assert dict(request.options.options) == {"endpoint_url": "http://127.0.0.1:9"}
    assert request.options.metadata_sync_interval == 300
    assert request.options.read_type == pb.CACHE_PROMOTE
    assert request.options.write_type == pb.WRITE_TYPE_UNSPECIFIED
    assert request.options.pin and request.options.ttl_seconds == 86400
    assert request.replace and request.check
    status = world.kube.obj("Mount", "data")["status"]
    assert status["phase"] == "Mounted"
    assert condition(status, "Ready")["status"] == "True"
    assert status["lastSyncTime"] == "2026-01-01T12:00:00Z"
    assert "hunter2" not in repr(status)

    # The master caches some of it: the next timer run reports it, without remounting.
    world.master.state.mount_reports["/datasets/a"] = pb.MountReport(
        cached_bytes=3 << 30, ufs_total_bytes=12 << 30, ufs_files=1000,
        cached_bytes_by_host={"node-1": 1 << 30, "node-2": 2 << 30},
    )
    world.clock.advance(30)
    assert (await reconcile(world, state)).done
    assert world.master.state.count("Mount") == 1
    status = world.kube.obj("Mount", "data")["status"]
    assert status["ufs"] == {"totalBytes": "12Gi", "files": 1000}
    assert status["cache"] == {"cachedBytes": "3Gi", "cachedPercentage": 25.0,
                               "nodes": [{"node": "node-2", "bytes": "2Gi"}, {"node": "node-1", "bytes": "1Gi"}]}
    assert status["lastSyncTime"] == "2026-01-01T12:00:00Z"  # not remounted

    # Nothing changed: nothing is written.
    writes = len(world.kube.status_writes)
    world.clock.advance(30)
    await reconcile(world, state)
    assert len(world.kube.status_writes) == writes

    # Blocks of versions the store replaced are still cached: the share stays at most 100.
    world.master.state.mount_reports["/datasets/a"] = pb.MountReport(
        cached_bytes=13 << 30, ufs_total_bytes=12 << 30, ufs_files=1000)
    world.clock.advance(30)
    await reconcile(world, state)
    assert world.kube.obj("Mount", "data")["status"]["cache"]["cachedPercentage"] == 100.0


async def test_changed_secret_or_source_remounts(world: World) -> None:
    ready_cluster(world)
    creds(world, key="a", secret="b")
    world.kube.put(mount_body(credentials={"secretRef": {"name": "s3-creds"}}))
    state = ObjectState()
    await reconcile(world, state)
    creds(world, key="a", secret="rotated")
    await reconcile(world, state)
    assert world.master.state.count("Mount") == 2
    last = [r for n, r in world.master.state.calls if n == "Mount"][-1]
    assert last.options.credentials["secret"] == "rotated"
    world.kube.obj("Mount", "data")["spec"]["source"] = "s3://other/a"
    await reconcile(world, state)
    assert world.master.state.mounts["/datasets/a"].source == "s3://other/a"


async def test_restarted_master_gets_the_mount_back(world: World) -> None:
    ready_cluster(world)
    world.kube.put(mount_body())
    state = ObjectState()
    await reconcile(world, state)
    world.master.state.mounts.clear()  # a new master with an empty journal
    await reconcile(world, state)
    assert "/datasets/a" in world.master.state.mounts
    assert world.master.state.count("Mount") == 2


async def test_a_mount_the_master_cannot_use_is_mounted_again_with_its_id(world: World) -> None:
    # A master started with another cluster key cannot open the mount's sealed credentials:
    # it keeps the mount (and its unpersisted files), unusable, until it is mounted again.
    ready_cluster(world)
    world.kube.put(mount_body())
    state = ObjectState()
    await reconcile(world, state)
    mount = world.master.state.mounts["/datasets/a"]
    mount.unusable = "mount /datasets/a cannot be used: its credentials cannot be opened"
    await reconcile(world, state)
    assert world.master.state.count("Mount") == 2
    again = world.master.state.mounts["/datasets/a"]
    assert not again.unusable and again.mount_id == mount.mount_id


async def test_restarted_operator_does_not_remount_needlessly(world: World) -> None:
    ready_cluster(world)
    world.kube.put(mount_body())
    await reconcile(world, ObjectState())
    mount_id = world.master.state.mounts["/datasets/a"].mount_id
    await reconcile(world, ObjectState())  # empty memory: one idempotent Mount call
    assert world.master.state.mounts["/datasets/a"].mount_id == mount_id


@pytest.mark.parametrize(
    ("code", "reason", "hint"),
    [
        (grpc.StatusCode.NOT_FOUND, "SourceNotFound", "Check the bucket"),
        (grpc.StatusCode.PERMISSION_DENIED, "AccessDenied", "Secret s3-creds"),
        (grpc.StatusCode.INVALID_ARGUMENT, "InvalidMount", "Fix spec.path"),
        (grpc.StatusCode.ALREADY_EXISTS, "PathConflict", "Choose a spec.path"),
        (grpc.StatusCode.INTERNAL, "MountFailed", "boom"),
    ],
)
async def test_store_errors_fail_with_an_actionable_reason(
    world: World, code: grpc.StatusCode, reason: str, hint: str
) -> None:
    ready_cluster(world)
    creds(world, key="a", secret="b")
    world.kube.put(mount_body(credentials={"secretRef": {"name": "s3-creds"}}))
    world.master.state.mount_error = (code, "boom")
    out = await reconcile(world, ObjectState())
    assert out.stalled
    status = world.kube.obj("Mount", "data")["status"]
    assert status["phase"] == "Failed"
    stalled = condition(status, "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == reason
    assert hint in stalled["message"] and "boom" in stalled["message"]
    assert "lastSyncTime" not in status


async def test_fixed_bucket_recovers(world: World) -> None:
    ready_cluster(world)
    world.kube.put(mount_body())
    state = ObjectState()
    world.master.state.mount_error = (grpc.StatusCode.NOT_FOUND, "NoSuchBucket")
    await reconcile(world, state)
    world.master.state.mount_error = None
    assert (await reconcile(world, state)).done
    assert world.kube.obj("Mount", "data")["status"]["phase"] == "Mounted"


async def test_missing_credentials_secret_fails(world: World) -> None:
    ready_cluster(world)
    world.kube.put(mount_body(credentials={"secretRef": {"name": "nope"}}))
    out = await reconcile(world, ObjectState())
    assert out.stalled
    stalled = condition(world.kube.obj("Mount", "data")["status"], "Stalled")
    assert stalled["reason"] == "CredentialsSecretNotFound" and "ns/nope" in stalled["message"]
    assert world.master.state.count("Mount") == 0


async def test_wrong_token_is_named(world: World) -> None:
    ready_cluster(world)
    world.master.state.token = "another"
    world.kube.put(mount_body())
    await reconcile(world, ObjectState())
    assert condition(world.kube.obj("Mount", "data")["status"], "Stalled")["reason"] == "TokenRejected"


async def test_unreachable_master_keeps_it_pending(world: World) -> None:
    ready_cluster(world)
    world.kube.put(mount_body())
    await world.master.stop()
    out = await reconcile(world, ObjectState())
    assert not out.done and not out.stalled
    status = world.kube.obj("Mount", "data")["status"]
    assert status["phase"] == "Pending"
    assert condition(status, "Reconciling")["reason"] == "MasterUnreachable"


async def test_a_store_that_does_not_answer_is_named_then_failed_and_still_retried(world: World) -> None:
    ready_cluster(world)
    world.kube.put(mount_body())
    state = ObjectState()
    world.master.state.mount_error = (grpc.StatusCode.UNAVAILABLE, "store s3://bucket/a did not answer within 30s")
    out = await reconcile(world, state)
    assert not out.done and not out.stalled  # a hiccup, for now
    status = world.kube.obj("Mount", "data")["status"]
    assert status["phase"] == "Pending"
    reconciling = condition(status, "Reconciling")
    assert reconciling["reason"] == "StoreUnreachable" and "s3://bucket/a" in reconciling["message"]
    world.clock.advance(world.deps.settings.store_patience + 1)
    out = await reconcile(world, state)
    assert out.stalled  # tried again at the regular interval, not given up
    status = world.kube.obj("Mount", "data")["status"]
    assert status["phase"] == "Failed"
    stalled = condition(status, "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "StoreUnreachable"
    assert "No answer for" in stalled["message"]
    world.master.state.mount_error = None
    assert (await reconcile(world, state)).done
    assert world.kube.obj("Mount", "data")["status"]["phase"] == "Mounted"
    assert state.store_away_since is None


async def test_overlapping_mount_of_the_same_cluster_fails(world: World) -> None:
    ready_cluster(world)
    world.kube.put(mount_body("first"))
    second = mount_body("second", path="/datasets/a/sub")
    second["metadata"]["creationTimestamp"] = "2026-01-02T00:00:00Z"
    world.kube.put(second)
    assert (await reconcile(world, ObjectState(), "first")).done
    out = await reconcile(world, ObjectState(), "second")
    assert out.stalled
    stalled = condition(world.kube.obj("Mount", "second")["status"], "Stalled")
    assert stalled["reason"] == "PathConflict" and "Mount first" in stalled["message"]
    # Deleting the loser leaves the winner's mount alone.
    world.kube.obj("Mount", "second")["spec"]["path"] = "/datasets/a"
    world.kube.obj("Mount", "second")["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    assert (await remove_mount(world.deps, world.kube.obj("Mount", "second"))).done
    assert "/datasets/a" in world.master.state.mounts


async def test_preload_starts_once_and_succeeds_only_when_the_cache_holds_it(world: World) -> None:
    ready_cluster(world)
    world.kube.put(mount_body(preload={"paths": ["/train", "val"]}))
    state = ObjectState()
    await reconcile(world, state)
    loads = [r.path for n, r in world.master.state.calls if n == "Load"]
    assert loads == ["/datasets/a/train", "/datasets/a/val"]
    master = world.master.state
    master.set_load("/datasets/a/train", bytes_loaded=50 << 20, bytes_total=100 << 20, files_loaded=1, files_total=2)
    master.set_load("/datasets/a/val", bytes_total=100 << 20, files_total=2)
    await reconcile(world, state)
    status = world.kube.obj("Mount", "data")["status"]
    assert status["preload"] == {"phase": "Running", "bytesLoaded": "50Mi", "bytesTotal": "200Mi"}
    assert condition(status, "Preloaded")["status"] == "False"
    for path in ("/datasets/a/train", "/datasets/a/val"):
        master.set_load(path, bytes_loaded=100 << 20, bytes_total=100 << 20, files_loaded=2, files_total=2,
                        done=True, bytes_cached=100 << 20)
    await reconcile(world, state)
    status = world.kube.obj("Mount", "data")["status"]
    assert status["preload"]["phase"] == "Succeeded"
    assert condition(status, "Preloaded")["status"] == "True"
    assert master.count("Load") == 2
    await reconcile(world, ObjectState())  # a restarted operator sees the loads whole and redoes nothing
    assert master.count("Load") == 2


async def test_a_load_that_loaded_nothing_is_not_success_and_is_tried_again(world: World) -> None:
    """The master was ready before any worker registered: the load ended with an error."""
    ready_cluster(world)
    world.kube.put(mount_body(preload={"onCreate": True}))
    state = ObjectState()
    await reconcile(world, state)
    master = world.master.state
    master.set_load("/datasets/a", bytes_total=3 << 20, files_total=1, done=True,
                    error="cannot load /datasets/a/x: no live workers")
    out = await reconcile(world, state)
    status = world.kube.obj("Mount", "data")["status"]
    assert status["preload"]["phase"] == "Failed"
    preloaded = condition(status, "Preloaded")
    assert preloaded["reason"] == "PreloadFailed" and "no live workers" in preloaded["message"]
    assert ("Warning", "PreloadFailed") in [(n.type, n.reason) for n in out.notes]
    assert master.count("Load") == 2  # tried again at once, then backs off
    master.set_load("/datasets/a", bytes_total=3 << 20, files_total=1, done=True,
                    error="cannot load /datasets/a/x: no live workers")
    await reconcile(world, state)
    assert master.count("Load") == 2
    assert "Trying again at" in condition(world.kube.obj("Mount", "data")["status"], "Preloaded")["message"]
    world.clock.advance(world.deps.settings.reconcile_interval)
    await reconcile(world, state)
    assert master.count("Load") == 3
    master.set_load("/datasets/a", bytes_loaded=3 << 20, bytes_total=3 << 20, files_loaded=1, files_total=1,
                    done=True, bytes_cached=3 << 20)
    await reconcile(world, state)
    assert world.kube.obj("Mount", "data")["status"]["preload"]["phase"] == "Succeeded"


async def test_a_preload_the_cache_lost_is_loaded_again(world: World) -> None:
    ready_cluster(world)
    world.kube.put(mount_body(preload={"onCreate": True}))
    state = ObjectState()
    await reconcile(world, state)
    master = world.master.state
    master.set_load("/datasets/a", bytes_loaded=4 << 20, bytes_total=4 << 20, files_loaded=1, files_total=1,
                    done=True, bytes_cached=4 << 20)
    await reconcile(world, state)
    assert world.kube.obj("Mount", "data")["status"]["preload"]["phase"] == "Succeeded"
    master.set_load("/datasets/a", bytes_loaded=4 << 20, bytes_total=4 << 20, files_loaded=1, files_total=1,
                    done=True, bytes_cached=1 << 20)  # a worker with 3Mi of it went away
    out = await reconcile(world, state)
    assert master.count("Load") == 2
    preloaded = condition(world.kube.obj("Mount", "data")["status"], "Preloaded")
    assert preloaded["reason"] == "PreloadIncomplete" and "1Mi of the 4Mi" in preloaded["message"]
    assert [n.reason for n in out.notes] == ["PreloadIncomplete"]


async def test_a_preload_a_rolling_update_takes_bytes_of_is_loaded_again_only_once_every_worker_is_back(
        world: World) -> None:
    """While a worker is away for a rolling update, the preload's bytes it holds are missing;
    loading them from the store then fetches its share again, which the worker brings back
    on its disk tier. Before: loaded again at once. A master restarted in the same update
    (it has no load) gets the preload once the workers have rolled out."""
    ready_cluster(world)
    world.kube.put({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "demo-worker", "generation": 2},
                    "spec": {"replicas": 3},
                    "status": {"observedGeneration": 2, "replicas": 3, "readyReplicas": 3, "updatedReplicas": 3,
                               "currentRevision": "r1", "updateRevision": "r1"}})
    world.kube.put(mount_body(preload={"onCreate": True}))
    state = ObjectState()
    await reconcile(world, state)
    master = world.master.state
    assert master.count("Load") == 1
    world.kube.obj("StatefulSet", "demo-worker")["status"].update(
        readyReplicas=2, updatedReplicas=1, updateRevision="r2")  # a rolling update under way
    master.set_load("/datasets/a", bytes_loaded=3 << 20, bytes_total=3 << 20, files_loaded=1, files_total=1,
                    done=True, bytes_cached=2 << 20)  # the worker being replaced holds 1Mi of it
    await reconcile(world, state)
    assert master.count("Load") == 1
    preloaded = condition(world.kube.obj("Mount", "data")["status"], "Preloaded")
    assert preloaded["reason"] == "PreloadIncomplete" and "once the workers of demo have rolled out" in preloaded["message"]
    master.set_load("/datasets/a")  # the master restarted too: it knows no load
    await reconcile(world, state)
    assert master.count("Load") == 1
    world.kube.obj("StatefulSet", "demo-worker")["status"].update(
        readyReplicas=3, updatedReplicas=3, currentRevision="r2")  # rolled out
    await reconcile(world, state)
    assert master.count("Load") == 2


async def test_a_restarted_master_gets_the_preload_again(world: World) -> None:
    """A master restart keeps the mount (journal) but not its loads: the old operator never
    preloaded again until it restarted itself."""
    ready_cluster(world)
    world.kube.put(mount_body(preload={"onCreate": True}))
    state = ObjectState()
    await reconcile(world, state)
    master = world.master.state
    master.set_load("/datasets/a", bytes_loaded=4, bytes_total=4, files_loaded=1, files_total=1, done=True,
                    bytes_cached=4)
    await reconcile(world, state)
    master.set_load("/datasets/a")  # the master restarted: no load known
    await reconcile(world, state)
    assert master.count("Load") == 2


async def test_an_operator_restart_changes_nothing_already_true(world: World) -> None:
    ready_cluster(world)
    world.kube.put(mount_body())
    await reconcile(world, ObjectState())
    before = world.kube.obj("Mount", "data")["status"]
    writes = len(world.kube.status_writes)
    world.clock.advance(600)
    await reconcile(world, ObjectState())  # a new operator: it asks the master, which changes nothing
    assert world.kube.obj("Mount", "data")["status"] == before
    assert len(world.kube.status_writes) == writes


async def test_delete_unmounts_and_frees(world: World) -> None:
    ready_cluster(world)
    world.kube.put(mount_body())
    await reconcile(world, ObjectState())
    body = world.kube.obj("Mount", "data")
    body["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    out = await remove_mount(world.deps, body)
    assert out.done
    (request,) = [r for n, r in world.master.state.calls if n == "Unmount"]
    assert request.path == "/datasets/a" and request.free
    assert world.master.state.mounts == {}
    assert world.kube.obj("Mount", "data")["status"]["phase"] == "Unmounting"


async def test_delete_when_the_cluster_is_gone_does_not_hang(world: World) -> None:
    world.kube.put(mount_body())
    body = world.kube.obj("Mount", "data")
    body["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    assert (await remove_mount(world.deps, body)).done


async def test_delete_with_an_unreachable_master_gives_up_in_time(world: World) -> None:
    ready_cluster(world)
    world.kube.put(mount_body())
    await reconcile(world, ObjectState())
    await world.master.stop()
    body = world.kube.obj("Mount", "data")
    body["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    out = await remove_mount(world.deps, body)
    assert not out.done  # retry while within unmount_timeout (30 s here)
    world.clock.advance(31)
    out = await remove_mount(world.deps, body)
    assert out.done and "gave up" in out.message


async def test_delete_after_the_namespace_took_its_grant_away_gives_up_in_time(world: World) -> None:
    """A namespace being deleted removes its RoleBindings too: the operator may then no
    longer read the cluster's token Secret; the Mount's finalizer must still finish."""
    ready_cluster(world)
    world.kube.put(mount_body())
    await reconcile(world, ObjectState())
    forbidden = KubeError(403, 'secrets "demo-auth" is forbidden: User "system:serviceaccount:strata-system:'
                               'strata-operator" cannot get resource "secrets"')

    async def refused_get(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        if kind == "Secret":
            raise forbidden
        return await FakeKube.get(world.kube, api_version, kind, namespace, name)

    world.kube.get = refused_get  # type: ignore[method-assign]
    body = world.kube.obj("Mount", "data")
    body["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    out = await remove_mount(world.deps, body)
    assert not out.done and "token Secret cannot be read" in out.message
    world.clock.advance(31)
    out = await remove_mount(world.deps, body)
    assert out.done and "gave up" in out.message


async def test_events_tell_of_mounting_failing_and_preloading_once(world: World) -> None:
    ready_cluster(world)
    world.kube.put(mount_body(credentials={"secretRef": {"name": "missing"}}))
    out = await reconcile(world, ObjectState())
    assert [(n.type, n.reason) for n in out.notes] == [("Warning", "CredentialsSecretNotFound")]
    assert "missing" in out.notes[0].message
    assert not (await reconcile(world, ObjectState())).notes  # the same story: no second Event
    world.kube.obj("Mount", "data")["spec"].pop("credentials")
    out = await reconcile(world, ObjectState())
    assert [(n.type, n.reason) for n in out.notes] == [("Normal", "Mounted")]
