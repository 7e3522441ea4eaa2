"""The chart's RBAC grants what the code calls. The operator's reconcile steps and the
webhook run against a recording stand-in of the API server (and the real gRPC master
servicer of the operator tests); every request they make becomes (verb, group, resource),
which the rendered Role or ClusterRole bound to the operator's account must allow. kopf's
own requests (watching, peering, events, discovery) are listed from its documentation. The
CSI node plugin's reads are recorded from cacheserver/csi/kube.py the same way."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

import pytest

from strata.cacheserver.csi import constants as csi
from strata.cacheserver.csi.kube import KubeResolver
from strata.operator import constants as c
from strata.operator.handlers.admission import review
from strata.operator.kube import PLURALS, Obj
from strata.operator.reconcile import ObjectState, reconcile_cluster, reconcile_mount, remove_mount
from tests.unit.chart.conftest import NAMESPACE, Render
from tests.unit.operator.conftest import (  # noqa: F401 - fixtures used by `world`
    FakeKube,
    World,
    cluster_body,
    master,
    mount_body,
    world,
    worker_report,
)

Request = tuple[str, str, str]  # verb, API group, resource (plural, or plural/status)


def group_of(api_version: str) -> str:
    return api_version.split("/")[0] if "/" in api_version else ""


class RecordingKube:
    """The KubeAPI the reconcile steps get: forwards to FakeKube, records each request as
    the API server authorizes it (an apply may create the object: patch and create)."""

    def __init__(self, inner: FakeKube) -> None:
        self.inner = inner
        self.requests: set[Request] = set()

    def _note(self, verbs: Iterable[str], api_version: str, kind: str, sub: str = "") -> None:
        resource = PLURALS[kind] + (f"/{sub}" if sub else "")
        self.requests.update((verb, group_of(api_version), resource) for verb in verbs)

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        self._note(["get"], api_version, kind)
        return await self.inner.get(api_version, kind, namespace, name)

    async def list(self, api_version: str, kind: str, namespace: str) -> list[Obj]:
        self._note(["list"], api_version, kind)
        return await self.inner.list(api_version, kind, namespace)

    async def apply(self, manifest: Obj) -> Obj:
        self._note(["patch", "create"], manifest["apiVersion"], manifest["kind"])
        return await self.inner.apply(manifest)

    async def apply_status(self, api_version: str, kind: str, namespace: str, name: str, status: Obj) -> None:
        self._note(["patch"], api_version, kind, "status")
        await self.inner.apply_status(api_version, kind, namespace, name, status)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture
async def operator_requests(world: World) -> set[Request]:
    """Everything one CacheCluster's and one Mount's life asks of the API server."""
    kube = RecordingKube(world.kube)
    world.deps.kube = kube
    world.kube.put(cluster_body())
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    world.master.state.token = base64.b64decode(world.kube.obj("Secret", "demo-auth")["data"]["token"]).decode()
    world.kube.obj("StatefulSet", "demo-master")["status"] = {"readyReplicas": 1}
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    world.kube.obj("StatefulSet", "demo-worker")["status"] = {"readyReplicas": 2}
    world.master.state.workers = [worker_report("demo-worker-0"), worker_report("demo-worker-1")]
    assert (await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))).done
    world.kube.obj("CacheCluster", "demo")["spec"] = {"worker": {"replicas": 1}}  # scale in
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))

    world.kube.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-creds"},
                    "data": {"key": b64("AKIA"), "secret": b64("hunter2")}})
    world.kube.put(mount_body(credentials={"secretRef": {"name": "s3-creds"}}, preload={"paths": ["/train"]}))
    assert (await reconcile_mount(world.deps, world.kube.obj("Mount", "data"), ObjectState())).done
    pod = {"metadata": {"namespace": "ns", "name": "reader"},
           "spec": {"volumes": [{"name": "d", "csi": {"driver": csi.DRIVER_NAME, "volumeAttributes": {"mount": "data"}}}]}}
    assert (await review(kube, pod, timeout=5)).affinity is not None
    deleting = world.kube.obj("Mount", "data")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    assert (await remove_mount(world.deps, deleting)).done
    return kube.requests


# kopf, as configured in operator/handlers/lifecycle.py: it watches CacheClusters and Mounts
# and patches their finalizers and annotations, posts Events (warnings), and keeps alive in
# its peering object.
KOPF_REQUESTS: set[Request] = {
    (verb, c.GROUP, plural) for verb in ("list", "watch", "patch") for plural in (c.CACHE_CLUSTER_PLURAL, c.MOUNT_PLURAL)
} | {("create", "", "events")}
PEERING_VERBS = ("get", "list", "watch", "patch")


def allows(rules: list[Obj], request: Request) -> bool:
    verb, group, resource = request
    return any(
        (verb in rule["verbs"] or "*" in rule["verbs"])
        and (group in rule.get("apiGroups", []) or "*" in rule.get("apiGroups", []))
        and (resource in rule.get("resources", []) or "*" in rule.get("resources", []))
        for rule in rules
    )


def bound_rules(objs: list[Obj], account: str, namespace: str | None) -> list[Obj]:
    """Rules the ServiceAccount `account` (in the release namespace) has in `namespace`
    (None: cluster-wide only, through ClusterRoleBindings)."""
    rules: list[Obj] = []
    by_name = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objs}
    for binding in objs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if binding["kind"] == "RoleBinding" and binding["metadata"]["namespace"] != namespace:
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account and s["namespace"] == NAMESPACE
                   for s in binding["subjects"]):
            continue
        ref = binding["roleRef"]
        role_ns = None if ref["kind"] == "ClusterRole" else binding["metadata"]["namespace"]
        rules.extend(by_name[(ref["kind"], role_ns, ref["name"])]["rules"])
    return rules


def missing(rules: list[Obj], requests: Iterable[Request]) -> list[Request]:
    return sorted(r for r in requests if not allows(rules, r))


async def test_the_recorded_requests_cover_every_kind_the_operator_touches(operator_requests: set[Request]) -> None:
    """A sanity check of the recording itself: it saw the calls this test relies on."""
    assert {("get", "", "secrets"), ("get", "apps", "statefulsets"), ("list", c.GROUP, "mounts"),
            ("patch", c.GROUP, "cacheclusters/status"), ("patch", c.GROUP, "mounts/status"),
            ("create", "policy", "poddisruptionbudgets"), ("get", c.GROUP, "cacheclusters")} <= operator_requests


async def test_cluster_wide_rbac_allows_what_the_operator_does(render: Render, operator_requests: set[Request]) -> None:
    objs = render()
    rules = bound_rules(objs, "strata-operator", None)
    needed = operator_requests | KOPF_REQUESTS | {(v, "kopf.dev", "clusterkopfpeerings") for v in PEERING_VERBS}
    needed |= {("list", "apiextensions.k8s.io", "customresourcedefinitions"),
               ("watch", "apiextensions.k8s.io", "customresourcedefinitions")}
    assert not missing(rules, needed)


async def test_namespaced_rbac_allows_it_in_each_watched_namespace(render: Render,
                                                                  operator_requests: set[Request]) -> None:
    objs = render({"operator.watchAllNamespaces": "false", "operator.watchNamespaces": "{team-a,team-b}"})
    cluster_rules = bound_rules(objs, "strata-operator", None)
    namespaced = operator_requests | KOPF_REQUESTS | {(v, "kopf.dev", "kopfpeerings") for v in PEERING_VERBS}
    for namespace in ("team-a", "team-b"):
        assert not missing(bound_rules(objs, "strata-operator", namespace), namespaced), namespace
    assert missing(bound_rules(objs, "strata-operator", "elsewhere"), namespaced) == sorted(namespaced)
    assert not missing(cluster_rules, {("list", "", "namespaces"), ("watch", "", "namespaces"),
                                       ("list", "apiextensions.k8s.io", "customresourcedefinitions")})
    # Nothing beyond discovery is granted cluster-wide.
    assert missing(cluster_rules, namespaced) == sorted(namespaced)


def test_rbac_grants_no_more_than_it_needs(render: Render) -> None:
    """No wildcards, no deletes, no pods, and write access only to what the operator applies."""
    for obj in render():
        for rule in obj.get("rules", []):
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
            assert not {"delete", "deletecollection", "update", "escalate", "bind", "impersonate"} & set(rule["verbs"])
            assert not {"pods", "nodes", "persistentvolumes"} & set(rule["resources"]), rule


class RecordingReader:
    def __init__(self, objects: dict[str, Obj]) -> None:
        self.objects = objects
        self.requests: set[Request] = set()

    def get(self, path: str) -> Obj | None:
        parts = path.strip("/").split("/")
        group = "" if parts[0] == "api" else parts[1]
        self.requests.add(("get", group, parts[-2]))
        return self.objects.get(path)


def test_csi_node_plugin_rbac_allows_its_reads(render: Render) -> None:
    group = f"/apis/{csi.API_GROUP_VERSION}/namespaces/team"
    reader = RecordingReader({
        f"{group}/mounts/data": {"spec": {"cluster": "demo", "path": "/data"}, "status": {"phase": "Mounted"}},
        f"{group}/cacheclusters/demo": {"status": {"master": {"endpoint": "demo-master-0:19998"}}},
        "/api/v1/namespaces/team/secrets/demo-auth": {"data": {"token": b64("admin"), "dataToken": b64("t0k3n")}},
    })
    source = KubeResolver(reader).resolve("team", "data", {})
    assert source.token == "t0k3n"
    assert reader.requests == {("get", c.GROUP, "mounts"), ("get", c.GROUP, "cacheclusters"), ("get", "", "secrets")}
    assert not missing(bound_rules(render(), "strata-csi-node", None), reader.requests)
    objs = render({"operator.watchAllNamespaces": "false", "operator.watchNamespaces": "{team}"})
    assert not missing(bound_rules(objs, "strata-csi-node", "team"), reader.requests)
    daemonset = next(o for o in render() if o["kind"] == "DaemonSet")
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == "strata-csi-node"


def test_rbac_off_renders_no_rbac(render: Render) -> None:
    kinds: set[Any] = {o["kind"] for o in render({"rbac.create": "false"})}
    assert not kinds & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
