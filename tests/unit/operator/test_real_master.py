"""The Mount reconcile and the master client against the real master service (in this
process, on 127.0.0.1) with file:// stores: the contract the operator relies on."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from strata.cacheserver.auth import Credentials
from strata.cacheserver.master.server import MasterHandle, start_master
from strata.cacheserver.namespace.mounts import MountOptions
from strata.contract.config import ServerConfig
from strata.contract.master import MasterClient
from strata.operator.reconcile import Deps, ObjectState, reconcile_cluster, reconcile_mount, remove_mount
from tests.unit.operator.conftest import FakeKube, LocalMasters, cluster_body, mount_body, operator_at

TOKEN = "real-master-token"


@pytest.fixture
async def real_master(tmp_path: Path) -> AsyncIterator[MasterHandle]:
    config = ServerConfig.model_validate({"blockSize": "1Mi", "heartbeatInterval": 0.2,
                                          "localSources": {"allowedRoots": [str(tmp_path)]}})
    handle = await start_master(config, journal_dir=tmp_path / "journal", credentials=Credentials.from_admin(TOKEN),
                                bind="127.0.0.1",
                                port=0, http_port=0)
    yield handle
    await handle.stop(grace=0)


@pytest.fixture
async def deps(real_master: MasterHandle) -> AsyncIterator[Deps]:
    async with operator_at(f"127.0.0.1:{real_master.port}", TOKEN) as deps:
        assert isinstance(deps.kube, FakeKube)
        deps.kube.put({"apiVersion": "strata.dev/v1alpha1", "kind": "CacheCluster", "metadata": {"name": "demo"},
                       "spec": {}, "status": {"master": {"ready": True}}})
        yield deps


def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    (root / "train").mkdir(parents=True)
    (root / "train" / "a.bin").write_bytes(b"x" * 3000)
    (root / "b.bin").write_bytes(b"y" * 1000)
    return root


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


async def test_mount_report_and_unmount(deps: Deps, tmp_path: Path) -> None:
    kube = deps.kube
    assert isinstance(kube, FakeKube)
    kube.put(mount_body(source=f"file://{store(tmp_path)}", path="/data/x"))
    state = ObjectState()
    out = await reconcile_mount(deps, kube.obj("Mount", "data"), state)
    assert out.done, out.message
    mount_id = state.mount_id
    # The master totals the store in the background: wait for it, then status shows it.
    deadline = time.monotonic() + 10
    while True:
        await reconcile_mount(deps, kube.obj("Mount", "data"), state)
        status = kube.obj("Mount", "data")["status"]
        if "ufs" in status or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert status["ufs"] == {"totalBytes": "3.9Ki", "files": 2}
    assert status["cache"]["cachedBytes"] == "0" and status["cache"]["cachedPercentage"] == 0.0
    assert state.mount_id == mount_id  # the same mount: no remount, the cache is kept

    body = kube.obj("Mount", "data")
    body["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    assert (await remove_mount(deps, body)).done
    assert isinstance(deps.masters, LocalMasters)
    async with MasterClient(deps.masters.address, TOKEN, timeout=5) as client:
        assert [m.mount.path for m in (await client.report()).mounts] == []
    assert (await remove_mount(deps, body)).done  # already gone: NotFound is fine


async def test_missing_source_fails_with_a_reason(deps: Deps, tmp_path: Path) -> None:
    kube = deps.kube
    assert isinstance(kube, FakeKube)
    kube.put(mount_body(source=f"file://{tmp_path}/no-such-dir"))
    out = await reconcile_mount(deps, kube.obj("Mount", "data"), ObjectState())
    assert out.stalled
    stalled = cond(kube.obj("Mount", "data")["status"], "Stalled")
    assert stalled["reason"] == "SourceNotFound", stalled
    assert "no-such-dir" in stalled["message"]


async def test_a_file_source_outside_the_allowed_roots_fails_with_what_to_change(deps: Deps) -> None:
    kube = deps.kube
    assert isinstance(kube, FakeKube)
    kube.put(mount_body(source="file:///etc"))
    out = await reconcile_mount(deps, kube.obj("Mount", "data"), ObjectState())
    assert out.stalled
    stalled = cond(kube.obj("Mount", "data")["status"], "Stalled")
    assert stalled["reason"] == "SourceNotAllowed", stalled
    assert "spec.localSources.allowedRoots" in stalled["message"]


async def test_missing_preload_path_does_not_fail_the_mount(deps: Deps, tmp_path: Path) -> None:
    kube = deps.kube
    assert isinstance(kube, FakeKube)
    kube.put(mount_body(source=f"file://{store(tmp_path)}", preload={"paths": ["/nope"]}))
    out = await reconcile_mount(deps, kube.obj("Mount", "data"), ObjectState())
    assert out.done, out.message
    status = kube.obj("Mount", "data")["status"]
    assert status["phase"] == "Mounted"
    assert status["preload"] == {"phase": "Failed"}
    preloaded = cond(status, "Preloaded")
    assert preloaded["reason"] == "PreloadFailed"
    assert "/datasets/a/nope" in preloaded["message"]


async def test_cluster_status_from_a_real_report(deps: Deps) -> None:
    kube = deps.kube
    assert isinstance(kube, FakeKube)
    del kube.objects[("CacheCluster", "ns", "demo")]
    kube.put(cluster_body())
    await reconcile_cluster(deps, kube.obj("CacheCluster", "demo"))  # keeps the existing token Secret
    kube.obj("StatefulSet", "demo-master")["status"] = {"readyReplicas": 1, "replicas": 1, "updatedReplicas": 1}
    await reconcile_cluster(deps, kube.obj("CacheCluster", "demo"))
    status = kube.obj("CacheCluster", "demo")["status"]
    assert cond(status, "MasterReady")["status"] == "True"
    assert status["workers"]["registered"] == 0
    assert status["capacity"] == {"total": "0", "used": "0", "tiers": []}
    assert cond(status, "WorkersReady")["reason"] == "WaitingForWorkers"


async def test_the_journal_on_disk_holds_no_store_credential(real_master: MasterHandle, tmp_path: Path) -> None:
    """The master's mount table survives a restart with its credentials, which the files on
    its volume never hold in the clear (they are sealed with the cluster's key)."""
    credentials = {"key": "AKIAJOURNALKEY", "secret": "journal-s3cret-value"}
    real_master.parts.mounts.add("/s3", "s3://bucket/x", MountOptions(
        options={"endpoint_url": "http://127.0.0.1:1"}, credentials=credentials))
    journal = tmp_path / "journal"
    on_disk = b"".join(p.read_bytes() for p in journal.rglob("*") if p.is_file())
    assert b"mounts" in on_disk  # the table was saved there
    for value in credentials.values():
        assert value.encode() not in on_disk and base64.b64encode(value.encode()) not in on_disk
    await real_master.stop(grace=0)

    config = ServerConfig.model_validate({"blockSize": "1Mi", "localSources": {"allowedRoots": [str(tmp_path)]}})
    again = await start_master(config, journal_dir=journal, credentials=Credentials.from_admin(TOKEN),
                               bind="127.0.0.1", port=0, http_port=0)
    try:
        mount = again.parts.mounts.get("/s3")
        assert mount is not None and dict(mount.options.credentials) == credentials
    finally:
        await again.stop(grace=0)
    # Another cluster's key opens nothing: the mount stays, unusable, until its owner mounts
    # it again (its written files kept), with its sealed credentials saved again as they were.
    other = await start_master(config, journal_dir=journal, credentials=Credentials.from_admin("another-token"),
                               bind="127.0.0.1", port=0, http_port=0)
    try:
        kept = other.parts.mounts.get("/s3")
        assert kept is not None and not kept.options.credentials and "cannot be opened" in kept.unusable
        other.parts.mounts.add("/other", "s3://bucket/y")  # a save of the table
    finally:
        await other.stop(grace=0)
    again = await start_master(config, journal_dir=journal, credentials=Credentials.from_admin(TOKEN),
                               bind="127.0.0.1", port=0, http_port=0)
    try:
        mount = again.parts.mounts.get("/s3")
        assert mount is not None and dict(mount.options.credentials) == credentials and not mount.unusable
    finally:
        await again.stop(grace=0)
