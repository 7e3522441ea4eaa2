"""The chart's RBAC grants what the code calls. The operator's reconcile steps and the
webhook run against a recording stand-in of the API server (and the real gRPC master
servicer of the operator tests); every request they make becomes (verb, group, resource),
which the rendered Role or ClusterRole bound to the operator's account must allow. kopf's
own requests (watching, peering, events, discovery) are listed from its documentation. The
CSI node plugin's reads are recorded from cacheserver/csi/kube.py the same way."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

import pytest
from csiobjects import PathObjects

from strata.cacheserver.csi.kube import KubeResolver
from strata.contract import constants, csi
from strata.operator import constants as c
from strata.operator.handlers.admission import certificate_place, review
from strata.operator.reconcile.webhook import ensure_certificate
from strata.operator.kube import KINDS, Obj
from strata.operator.reconcile import ObjectState, reconcile_cluster, reconcile_mount, remove_mount
from strata.operator.reconcile.warmup import WarmState, check_gated_pods
from strata.operator.settings import WebhookSettings
from strata.operator.warmup import WARM_GATE, GatedPod
from tests.unit.chart.conftest import NAMESPACE, Render
from tests.unit.operator.conftest import (  # noqa: F401 - fixtures used by `world`
    FakeKube,
    World,
    cluster_body,
    master,
    mount_body,
    set_ready,
    world,
    worker_report,
)

Request = tuple[str, str, str]  # verb, API group, resource (plural, or plural/status)
# Where a request goes: the tenant namespace of the objects ("ns"), or the operator's own.
TENANT, SELF = "ns", "strata-system"


def group_of(api_version: str) -> str:
    return api_version.split("/")[0] if "/" in api_version else ""


class RecordingKube:
    """The KubeAPI the reconcile steps get: forwards to FakeKube, records each request as
    the API server authorizes it (an apply may create the object: patch and create), with
    the namespace and name it names."""

    def __init__(self, inner: FakeKube) -> None:
        self.inner = inner
        self.requests: set[Request] = set()
        self.placed: set[tuple[str, str, str, str, str]] = set()  # + namespace, name

    def _note(self, verbs: Iterable[str], api_version: str, kind: str, namespace: str, name: str,
              sub: str = "") -> None:
        resource = KINDS[kind].plural + (f"/{sub}" if sub else "")
        for verb in verbs:
            self.requests.add((verb, group_of(api_version), resource))
            self.placed.add((verb, group_of(api_version), resource, namespace, name))

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        self._note(["get"], api_version, kind, namespace, name)
        return await self.inner.get(api_version, kind, namespace, name)

    async def list(self, api_version: str, kind: str, namespace: str) -> list[Obj]:
        self._note(["list"], api_version, kind, namespace, "")
        return await self.inner.list(api_version, kind, namespace)

    async def apply(self, manifest: Obj, manager: str = c.FIELD_MANAGER) -> Obj:
        meta = manifest["metadata"]
        # An apply creates the object when it is new; a cluster-scoped one the operator only
        # changes (the webhook configuration is the installer's).
        verbs = ["patch", "create"] if meta.get("namespace") else ["patch"]
        self._note(verbs, manifest["apiVersion"], manifest["kind"], meta.get("namespace", ""), meta["name"])
        return await self.inner.apply(manifest, manager)

    async def create(self, manifest: Obj) -> Obj | None:
        meta = manifest["metadata"]
        self._note(["create"], manifest["apiVersion"], manifest["kind"], meta.get("namespace", ""), meta["name"])
        return await self.inner.create(manifest)

    async def apply_status(self, api_version: str, kind: str, namespace: str, name: str, status: Obj) -> None:
        self._note(["patch"], api_version, kind, namespace, name, "status")
        await self.inner.apply_status(api_version, kind, namespace, name, status)

    async def set_scheduling_gates(self, pod: Obj, gates: Sequence[Obj]) -> bool:
        self._note(["patch"], "v1", "Pod", pod["metadata"]["namespace"], pod["metadata"]["name"])
        return await self.inner.set_scheduling_gates(pod, gates)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


Placed = tuple[str, str, str, str, str]  # verb, group, resource, namespace ("" cluster-wide), name


@pytest.fixture
async def recorded(world: World) -> RecordingKube:
    """Everything one CacheCluster's and one Mount's life asks of the API server, from
    creation through scale-in to deletion."""
    kube = RecordingKube(world.kube)
    world.deps.kube = kube
    world.kube.put(cluster_body())
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    world.master.state.token = base64.b64decode(world.kube.obj("Secret", "demo-auth")["data"]["token"]).decode()
    set_ready(world, "demo-master", 1)
    await reconcile_cluster(world.deps, world.kube.obj("CacheCluster", "demo"))
    set_ready(world, "demo-worker", 2)
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
    # The warm-up gate: a held pod is checked (its Mount's data loaded) and released.
    pod["spec"]["volumes"][0]["csi"]["volumeAttributes"]["warmPercent"] = "100"
    pod["spec"]["schedulingGates"] = [{"name": WARM_GATE}]
    pod["metadata"]["resourceVersion"] = "1"
    held = world.kube.put({"apiVersion": "v1", "kind": "Pod", **pod})
    world.clock.now += timedelta(days=1)  # its timeout is up
    assert await check_gated_pods(world.deps, [GatedPod.of(held)], WarmState())
    deleting = world.kube.obj("Mount", "data")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    assert (await remove_mount(world.deps, deleting)).done
    gone = world.kube.obj("CacheCluster", "demo")
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    assert (await reconcile_cluster(world.deps, gone)).done
    # The webhook certificate: made at the first start, renewed when it is due.
    place = certificate_place(WebhookSettings(enabled=True, certificate="operator", secret="strata-webhook-tls",
                                              service="strata-webhook", configuration="strata-locality"), SELF)
    await ensure_certificate(kube, place, world.clock)
    world.clock.now += place.validity
    await ensure_certificate(kube, place, world.clock)
    return kube


@pytest.fixture
def operator_requests(recorded: RecordingKube) -> set[Request]:
    return recorded.requests


# kopf, as configured in operator/handlers/lifecycle.py: it watches CacheClusters and Mounts
# and patches their finalizers and annotations, posts Events (warnings), and keeps alive in
# its peering object; it scans CRDs (and, when not cluster-wide, namespaces); it lists and
# watches pods for the warm-up gate's index (operator/handlers/warmup.py) and the drain
# (operator/handlers/drain.py), which also watches nodes (cluster-scoped: NODES).
KOPF_REQUESTS: set[Request] = {
    (verb, c.GROUP, plural) for verb in ("list", "watch", "patch") for plural in (c.CACHE_CLUSTER_PLURAL, c.MOUNT_PLURAL)
} | {("create", "", "events"), ("list", "", "pods"), ("watch", "", "pods")}
NODES = {("list", "", "nodes"), ("watch", "", "nodes")}
PEERING_VERBS = ("list", "watch", "patch")  # kopf never GETs it (the API server's audit log shows)
DISCOVERY = {("list", "apiextensions.k8s.io", "customresourcedefinitions"),
             ("watch", "apiextensions.k8s.io", "customresourcedefinitions")}
NAMESPACE_DISCOVERY = {("list", "", "namespaces"), ("watch", "", "namespaces")}


def _matches(rule: Obj, verb: str, group: str, resource: str, name: str) -> bool:
    names = rule.get("resourceNames")
    # The API server never matches a create, list or watch against resourceNames.
    named = verb not in ("create", "list", "watch") and name
    return (verb in rule["verbs"] and group in rule.get("apiGroups", []) and resource in rule.get("resources", [])
            and (not names or bool(named and name in names)))


def allows(rules: list[Obj], request: Request, name: str = "") -> bool:
    return any(_matches(rule, *request, name) for rule in rules)


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


def rules_in(objs: list[Obj], account: str, namespace: str) -> list[Obj]:
    """What the account may do in `namespace`: its cluster-wide rules and that namespace's."""
    cluster_wide = bound_rules(objs, account, None)
    return cluster_wide + [r for r in bound_rules(objs, account, namespace) if r not in cluster_wide]


def granted(objs: list[Obj], account: str) -> set[tuple[str, str, str, str]]:
    """Every (verb, group, resource, resourceName or "") any binding gives the account."""
    namespaces = {o["metadata"].get("namespace") for o in objs if o["kind"] == "RoleBinding"} | {None}
    out = set()
    for namespace in namespaces:
        for rule in bound_rules(objs, account, namespace):
            for verb in rule["verbs"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        out |= {(verb, group, resource, name) for name in rule.get("resourceNames") or [""]}
    return out


def missing(rules: list[Obj], requests: Iterable[Request]) -> list[Request]:
    return sorted(r for r in requests if not allows(rules, r))


def unallowed(objs: list[Obj], account: str, placed: Iterable[Placed]) -> list[Placed]:
    """The recorded requests the rendered RBAC would refuse, each in its own namespace."""
    return sorted(p for p in placed if not allows(rules_in(objs, account, p[3]), p[:3], p[4]))


def unused(objs: list[Obj], account: str, placed: Iterable[Placed], also: set[Request]) -> list[tuple[str, ...]]:
    """Grants no recorded request needs: each (verb, group, resource) must be used, and each
    resourceName by a request for that name."""
    used = {p[:3] for p in placed} | also
    used_names = {(*p[:3], p[4]) for p in placed}
    return sorted(g for g in granted(objs, account)
                  if g[:3] not in used or (g[3] and g not in used_names))


async def test_the_recorded_requests_cover_every_kind_the_operator_touches(operator_requests: set[Request]) -> None:
    """A sanity check of the recording itself: it saw the calls this test relies on."""
    assert {("get", "", "secrets"), ("get", "apps", "statefulsets"), ("list", c.GROUP, "mounts"),
            ("patch", c.GROUP, "cacheclusters/status"), ("patch", c.GROUP, "mounts/status"),
            ("create", "policy", "poddisruptionbudgets"), ("get", c.GROUP, "cacheclusters")} <= operator_requests


async def test_cluster_wide_rbac_is_exactly_what_the_operator_does(render: Render, recorded: RecordingKube) -> None:
    """Every request is allowed where it goes (Secrets in a namespace that granted them, the
    CSI tokens Secret at home), and every grant is used by some request."""
    objs = render({"rbac.tenantNamespaces": f"{{{TENANT}}}"})
    kopf = KOPF_REQUESTS | {(v, "kopf.dev", "clusterkopfpeerings") for v in PEERING_VERBS} | DISCOVERY | NODES
    assert not unallowed(objs, "strata-operator", recorded.placed)
    assert not missing(bound_rules(objs, "strata-operator", None), kopf)
    assert not unused(objs, "strata-operator", recorded.placed, kopf)
    # A namespace that granted nothing: no Secret there, in any way.
    elsewhere = rules_in(objs, "strata-operator", "elsewhere")
    assert not [v for v in ("get", "list", "watch", "create", "patch") if allows(elsewhere, (v, "", "secrets"), "x")]


async def test_namespaced_rbac_is_exactly_it_in_each_watched_namespace(render: Render, recorded: RecordingKube) -> None:
    objs = render({"operator.watchAllNamespaces": "false", "operator.watchNamespaces": f"{{{TENANT},team-b}}"})
    cluster_rules = bound_rules(objs, "strata-operator", None)
    kopf = KOPF_REQUESTS | {(v, "kopf.dev", "kopfpeerings") for v in PEERING_VERBS}
    for namespace in (TENANT, "team-b"):
        assert not missing(bound_rules(objs, "strata-operator", namespace), kopf), namespace
    assert not unallowed(objs, "strata-operator", recorded.placed)
    assert not unused(objs, "strata-operator", recorded.placed, kopf | DISCOVERY | NAMESPACE_DISCOVERY | NODES)
    namespaced = recorded.requests | kopf
    assert missing(bound_rules(objs, "strata-operator", "elsewhere"), namespaced) == sorted(namespaced)
    assert not missing(cluster_rules, NAMESPACE_DISCOVERY | DISCOVERY | NODES)
    # Nothing beyond discovery and the nodes is granted cluster-wide.
    assert missing(cluster_rules, namespaced) == sorted(namespaced)


def _uninstall_hook(obj: Obj) -> bool:
    return obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "uninstall"


def test_rbac_grants_no_more_than_it_needs(render: Render) -> None:
    """No wildcards, no deletes, nodes only read (the drain), pods only as the warm-up gate
    needs them, and write access only to what the operator applies (the uninstall hook's
    delete is checked below)."""
    for obj in render():
        if _uninstall_hook(obj):
            continue
        for rule in obj.get("rules", []):
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
            assert not {"delete", "deletecollection", "update", "escalate", "bind", "impersonate"} & set(rule["verbs"])
            assert "persistentvolumes" not in rule["resources"], rule
            if "nodes" in rule["resources"]:
                assert rule["resources"] == ["nodes"] and rule["verbs"] == ["list", "watch"], rule
            if "pods" in rule["resources"]:
                assert rule["resources"] == ["pods"] and rule["verbs"] == ["get", "list", "watch", "patch"], rule


class RecordingReader(PathObjects):
    @property
    def placed(self) -> set[Placed]:
        found: set[Placed] = set()
        for path in self.read:
            parts = path.strip("/").split("/")
            found.add(("get", "" if parts[0] == "api" else parts[1], parts[-2], parts[-3], parts[-1]))
        return found


def test_csi_node_plugin_rbac_is_exactly_its_reads(render: Render) -> None:
    group = f"/apis/{constants.API_VERSION}/namespaces/team"
    reader = RecordingReader({
        f"{group}/mounts/data": {"spec": {"cluster": "demo", "path": "/data"}, "status": {"phase": "Mounted"}},
        f"{group}/cacheclusters/demo": {"status": {"master": {"endpoint": "demo-master-0:19998"}}},
        f"/api/v1/namespaces/{NAMESPACE}/secrets/strata-csi-tokens": {"data": {"team.demo": b64("t0k3n")}},
    })
    daemonset = next(o for o in render() if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "strata-csi-node")
    args = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
    tokens = next(a.split("=", 1)[1] for a in args if a.startswith("--tokens-secret="))
    source = KubeResolver(reader, tokens).resolve("team", "data", {}, "team")
    assert source.token == "t0k3n"
    assert {p[:3] for p in reader.placed} == {("get", c.GROUP, "mounts"), ("get", c.GROUP, "cacheclusters"),
                                              ("get", "", "secrets")}
    for objs in (render(), render({"operator.watchAllNamespaces": "false", "operator.watchNamespaces": "{team}"})):
        assert not unallowed(objs, "strata-csi-node", reader.placed)
        assert not unused(objs, "strata-csi-node", reader.placed, set())
        for namespace in ("team", "elsewhere", NAMESPACE):
            assert not allows(rules_in(objs, "strata-csi-node", namespace), ("get", "", "secrets"), "demo-auth")
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == "strata-csi-node"


def test_without_csi_and_own_certificate_the_operator_keeps_only_its_token_copy_at_home(render: Render) -> None:
    objs = render({"csi.enabled": "false", "webhook.certificate.mode": "certManager"})
    (home,) = [o for o in objs if o["kind"] == "Role" and o["metadata"]["namespace"] == NAMESPACE]
    assert home["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["strata-cluster-tokens"], "verbs": ["get", "patch"]}]
    only_webhook = rules_in(render({"csi.enabled": "false"}), "strata-operator", NAMESPACE)
    assert allows(only_webhook, ("create", "", "secrets")) and not allows(only_webhook, ("patch", "", "secrets"),
                                                                          "strata-csi-tokens")


@pytest.mark.parametrize("values", [{}, {"operator.watchAllNamespaces": "false",
                                         "operator.watchNamespaces": "{team-a,team-b}"}])
def test_only_the_uninstall_hook_may_delete_and_only_while_helm_uninstalls(render: Render, values: dict[str, str]) -> None:
    """`strata-operator uninstall` lists, deletes and takes the finalizer off (patch) Mounts and
    CacheClusters where the operator works, nothing else; its account and grants exist only
    while `helm uninstall` runs (pre-delete hook objects, removed once the Job succeeded)."""
    hook = [o for o in render(values) if _uninstall_hook(o)]
    for obj in hook:
        annotations = obj["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete", obj["metadata"]["name"]
        assert "hook-succeeded" in annotations["helm.sh/hook-delete-policy"]
    roles = [o for o in hook if o["kind"] in ("Role", "ClusterRole")]
    assert [o["metadata"].get("namespace") for o in roles] == (["team-a", "team-b"] if values else [None])
    for role in roles:
        assert role["rules"] == [{"apiGroups": [c.GROUP], "resources": ["cacheclusters", "mounts"],
                                  "verbs": ["list", "delete", "patch"]}]
    bindings = [o for o in hook if o["kind"].endswith("Binding")]
    assert {s["name"] for b in bindings for s in b["subjects"]} == {"strata-uninstall"}
    (job,) = [o for o in hook if o["kind"] == "Job"]
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "strata-uninstall"


def test_rbac_off_renders_no_rbac(render: Render) -> None:
    kinds: set[Any] = {o["kind"] for o in render({"rbac.create": "false"})}
    assert not kinds & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
