"""Test parts for the operator: a real gRPC master servicer on 127.0.0.1 whose answers the
test sets, and an in-memory API server stand-in (there is no kube-apiserver in unit tests;
the e2e suite runs against a real one)."""

from __future__ import annotations

import asyncio
import base64
import copy
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import grpc.aio
import pytest

from strata.contract.errors import ANSWERED_KEY
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc
from strata.operator import constants as c
from strata.operator.kube import KubeError, Obj
from strata.contract.master import MasterClient
from strata.operator.master import Masters
from strata.operator.reconcile import Deps
from strata.operator.settings import OperatorSettings

TOKEN = "test-token"


@dataclass
class MasterState:
    """What the fake master holds and how it answers."""

    token: str = TOKEN
    mounts: dict[str, pb.MountInfo] = field(default_factory=dict)
    mount_error: tuple[grpc.StatusCode, str] | None = None
    decommission_error: tuple[grpc.StatusCode, str] | None = None
    workers: list[pb.WorkerReport] = field(default_factory=list)
    mount_reports: dict[str, pb.MountReport] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0
    calls: list[tuple[str, Any]] = field(default_factory=list)
    next_id: int = 1
    unmount_delay: float = 0.0  # seconds each Unmount takes
    # With a clock, a Load started now is timed by it, as a real master times its loads.
    load_clock: Callable[[], datetime] | None = None

    def count(self, method: str) -> int:
        return sum(1 for name, _ in self.calls if name == method)

    def set_load(self, path: str, **progress: Any) -> None:
        """The load of `path` as the master's Report shows it (in the mount holding it);
        with no fields, the master knows no load of it (e.g. it restarted)."""
        mount = next((m for m in self.mounts if path == m or path.startswith(m + "/")), path)
        report = self.mount_reports.setdefault(mount, pb.MountReport())
        others = [load for load in report.loads if load.path != path]
        del report.loads[:]
        report.loads.extend(others + ([pb.LoadProgress(path=path, **progress)] if progress else []))


class FakeMaster(pb_grpc.MasterServicer):  # type: ignore[misc]
    """Implements the calls the operator makes, with token checks and the real status codes."""

    def __init__(self, state: MasterState) -> None:
        self.state = state

    async def _check(self, context: grpc.aio.ServicerContext[Any, Any], method: str, request: Any) -> None:
        self.state.calls.append((method, request))
        metadata = dict(context.invocation_metadata() or ())
        if metadata.get("authorization") != f"Bearer {self.state.token}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong cluster token")

    async def Mount(self, request: pb.MountRequest, context: Any) -> pb.MountResponse:  # noqa: N802
        await self._check(context, "Mount", request)
        if self.state.mount_error:  # the master's own answer, marked as the real one marks it
            await context.abort(*self.state.mount_error, trailing_metadata=((ANSWERED_KEY, "1"),))
        existing = self.state.mounts.get(request.path)
        public = pb.MountOptions()
        public.CopyFrom(request.options)
        public.ClearField("credentials")
        same = existing is not None and existing.source == request.source and existing.options == public
        if existing is not None and same and existing.unusable:  # the same data, usable again
            existing = pb.MountInfo(path=request.path, source=request.source, options=public,
                                    mount_id=existing.mount_id)
            self.state.mounts[request.path] = existing
            return pb.MountResponse(mount=existing, changed=True)
        if existing is None or not same:
            existing = pb.MountInfo(path=request.path, source=request.source, options=public,
                                    mount_id=self.state.next_id)
            self.state.next_id += 1
            self.state.mounts[request.path] = existing
        return pb.MountResponse(mount=existing, changed=not same)

    async def Unmount(self, request: pb.UnmountRequest, context: Any) -> pb.UnmountResponse:  # noqa: N802
        await self._check(context, "Unmount", request)
        await asyncio.sleep(self.state.unmount_delay)
        if request.path not in self.state.mounts:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no mount at {request.path}")
        del self.state.mounts[request.path]
        return pb.UnmountResponse()

    async def Report(self, request: pb.ReportRequest, context: Any) -> pb.ReportResponse:  # noqa: N802
        await self._check(context, "Report", request)
        mounts = []
        for path, info in self.state.mounts.items():
            report = pb.MountReport()
            if path in self.state.mount_reports:
                report.CopyFrom(self.state.mount_reports[path])
            report.mount.CopyFrom(info)
            mounts.append(report)
        used = sum(t.used for w in self.state.workers if w.live for t in w.stats.tiers)
        capacity = sum(t.capacity for w in self.state.workers if w.live for t in w.stats.tiers)
        return pb.ReportResponse(workers=self.state.workers, mounts=mounts, capacity=capacity, used=used,
                                 hits=self.state.hits, misses=self.state.misses)

    async def DecommissionWorkers(self, request: pb.DecommissionWorkersRequest, context: Any) -> pb.DecommissionWorkersResponse:  # noqa: N802,E501
        await self._check(context, "DecommissionWorkers", request)
        if self.state.decommission_error:
            await context.abort(*self.state.decommission_error)
        return pb.DecommissionWorkersResponse()

    async def Load(self, request: pb.LoadRequest, context: Any) -> AsyncIterator[pb.LoadProgress]:  # noqa: N802
        await self._check(context, "Load", request)
        started = {"started_unix_ms": int(self.state.load_clock().timestamp() * 1000)} if self.state.load_clock else {}
        self.state.set_load(request.path, bytes_total=100, files_total=2, **started)
        yield pb.LoadProgress(bytes_loaded=0, bytes_total=100, files_total=2, **started)


@dataclass
class RunningMaster:
    state: MasterState
    address: str
    server: grpc.aio.Server

    async def stop(self) -> None:
        await self.server.stop(grace=None)


async def start_master(state: MasterState, port: int = 0) -> RunningMaster:
    server = grpc.aio.server()
    pb_grpc.add_MasterServicer_to_server(FakeMaster(state), server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return RunningMaster(state, f"127.0.0.1:{bound}", server)


@pytest.fixture
async def master() -> AsyncIterator[RunningMaster]:
    running = await start_master(MasterState())
    yield running
    await running.stop()


class LocalMasters(Masters):
    """Masters that dial the test's master for any endpoint (the cluster DNS names the
    operator computes do not resolve in a unit test); everything else is the real pool."""

    def __init__(self, address: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.address = address
        self.endpoints: list[str] = []

    def client(self, endpoint: str, token: str) -> MasterClient:
        self.endpoints.append(endpoint)
        return super().client(self.address, token)


class FakeKube:
    """An in-memory API server: get/list/apply/apply_status on plain dicts. Apply replaces
    the object's fields but keeps its status, as server-side apply of a spec does."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.applied: list[Obj] = []
        self.status_writes: list[tuple[str, str, Obj]] = []
        self.refuse: dict[str, KubeError] = {}
        self.data_owners: dict[tuple[str, str, str], dict[str, dict[str, str]]] = {}

    def put(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        meta.setdefault("namespace", "ns")
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        self.objects[(obj["kind"], meta["namespace"], meta["name"])] = obj
        return obj

    def obj(self, kind: str, name: str, namespace: str = "ns") -> Obj:
        return self.objects[(kind, namespace, name)]

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def list(self, api_version: str, kind: str, namespace: str) -> list[Obj]:
        return [copy.deepcopy(o) for (k, ns, _), o in self.objects.items() if k == kind and ns == namespace]

    async def apply(self, manifest: Obj, manager: str = c.FIELD_MANAGER) -> Obj:
        if manifest["kind"] in self.refuse:
            raise self.refuse[manifest["kind"]]
        self.applied.append(copy.deepcopy(manifest))
        key = (manifest["kind"], manifest["metadata"].get("namespace", ""), manifest["metadata"]["name"])
        stored = copy.deepcopy(manifest)
        if key in self.objects and "status" in self.objects[key]:
            stored["status"] = self.objects[key]["status"]
        # Server-side apply: each manager owns the data keys it applied; others' stay.
        owned = self.data_owners.setdefault(key, {})
        owned[manager] = dict(manifest.get("data") or {})
        if manifest["kind"] == "Secret":
            stored["data"] = {k: v for data in owned.values() for k, v in data.items()}
        self.objects[key] = stored
        return copy.deepcopy(stored)

    async def create(self, manifest: Obj) -> Obj | None:
        key = (manifest["kind"], manifest["metadata"].get("namespace", ""), manifest["metadata"]["name"])
        if key in self.objects:
            return None
        self.objects[key] = copy.deepcopy(manifest)
        return copy.deepcopy(manifest)

    async def apply_status(self, api_version: str, kind: str, namespace: str, name: str, status: Obj) -> None:
        self.status_writes.append((kind, name, copy.deepcopy(status)))
        self.objects[(kind, namespace, name)]["status"] = copy.deepcopy(status)

    async def set_scheduling_gates(self, pod: Obj, gates: Sequence[Obj]) -> bool:
        stored = self.objects.get(("Pod", pod["metadata"]["namespace"], pod["metadata"]["name"]))
        if stored is None or stored["metadata"].get("resourceVersion") != pod["metadata"].get("resourceVersion"):
            return False
        stored["spec"]["schedulingGates"] = copy.deepcopy(list(gates))
        return True

    def applied_kinds(self) -> list[str]:
        return [m["kind"] for m in self.applied]


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class World:
    kube: FakeKube
    master: RunningMaster
    masters: LocalMasters
    clock: Clock
    deps: Deps


@pytest.fixture
async def world(master: RunningMaster) -> AsyncIterator[World]:
    settings = OperatorSettings(server_image="strata-server:test", rpc_timeout=2.0, report_ttl=0,
                                unmount_timeout=30.0, namespace="strata-system", csi_tokens_secret="strata-csi-tokens",
                                kept_tokens_secret="strata-cluster-tokens")
    masters = LocalMasters(master.address, timeout=settings.rpc_timeout, report_ttl=settings.report_ttl)
    kube, clock = FakeKube(), Clock()
    yield World(kube, master, masters, clock, Deps(kube=kube, masters=masters, settings=settings, clock=clock))
    await masters.close()


@asynccontextmanager
async def operator_at(address: str, token: str) -> AsyncIterator[Deps]:
    """The operator's parts against the (real) master at `address`, on an in-memory API
    server holding the Secret of cluster demo with its admin `token`."""
    settings = OperatorSettings(server_image="strata-server:test", rpc_timeout=5.0, report_ttl=0, unmount_timeout=0)
    masters = LocalMasters(address, timeout=5.0, report_ttl=0)
    kube = FakeKube()
    kube.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "demo-auth"},
              "data": {"token": base64.b64encode(token.encode()).decode()}})
    try:
        yield Deps(kube=kube, masters=masters, settings=settings, clock=Clock())
    finally:
        await masters.close()


def set_ready(world: World, name: str, ready: int, *, revision: str = "r1", updated: int | None = None,
              pods: int | None = None) -> None:
    """The StatefulSet's status as its controller writes it: `ready` pods ready, all of the
    current revision (unless `revision`/`updated` say a rollout is under way), `pods` in all."""
    statefulset = world.kube.obj("StatefulSet", name)
    statefulset["status"] = {
        "observedGeneration": statefulset["metadata"].get("generation", 0), "readyReplicas": ready,
        "replicas": ready if pods is None else pods, "updatedReplicas": ready if updated is None else updated,
        "currentRevision": "r1", "updateRevision": revision,
    }


def cluster_body(name: str = "demo", spec: dict[str, Any] | None = None, generation: int = 1) -> Obj:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.CACHE_CLUSTER_KIND,
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": generation},
        "spec": spec if spec is not None else {},
    }


def mount_body(name: str = "data", generation: int = 1, **spec: Any) -> Obj:
    full = {"cluster": "demo", "path": "/datasets/a", "source": "s3://bucket/a", **spec}
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.MOUNT_KIND,
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": generation},
        "spec": full,
    }


def worker_report(worker_id: str, *, live: bool = True, host: str = "node-1",
                  tiers: tuple[tuple[str, int, int], ...] = (("MEM", 1 << 30, 1 << 28),)) -> pb.WorkerReport:
    return pb.WorkerReport(
        worker=pb.WorkerInfo(worker_id=worker_id, host=host),
        stats=pb.WorkerStats(tiers=[pb.TierStats(medium=m, capacity=cap, used=used) for m, cap, used in tiers]),
        live=live,
    )


@pytest.fixture
def clock() -> Iterator[Clock]:
    yield Clock()
