"""The CRDs on a real API server: every CEL rule refuses a bad object with its
message, defaults are filled in, printer columns, short names, category and
the scale subresource work. No operator needed."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from kit import REPO, Cluster, CommandError, find_tool
from strata.cacheserver.csi.kube import check_grant
from strata.contract.errors import PermissionDenied
from strata.operator.constants import MountPhase, Reason
from strata.operator.status import MountObservation, Problem, mount_status

pytestmark = pytest.mark.smoke

CRD_DIR = REPO / "crds"
Obj = dict[str, Any]


def crd_files() -> list[Path]:
    return sorted(p for p in CRD_DIR.glob("*.yaml") if "strata.dev" in p.name)


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> list[Obj]:
    files = crd_files()
    if not files:
        pytest.skip("crds/*.strata.dev.yaml do not exist yet")
    for path in sorted(CRD_DIR.glob("*.yaml")):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    docs = [yaml.safe_load(p.read_text()) for p in files]
    for doc in docs:
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{doc['metadata']['name']}", "--timeout=60s")
    return docs


def cache_cluster(name: str = "demo", **spec: Any) -> Obj:
    return {"apiVersion": "strata.dev/v1alpha1", "kind": "CacheCluster", "metadata": {"name": name}, "spec": spec}


def mount(name: str = "data", **spec: Any) -> Obj:
    base = {"cluster": "demo", "path": "/datasets/a", "source": "s3://bucket/a"}
    base.update(spec)
    return {"apiVersion": "strata.dev/v1alpha1", "kind": "Mount", "metadata": {"name": name}, "spec": base}


@dataclass(frozen=True)
class Case:
    """An object that breaks exactly one rule: the rule whose CEL expression
    contains `rule` and whose message starts with `says`."""

    id: str
    rule: str
    says: str
    obj: Obj
    update: Obj | None = None  # transition rules: create obj, then merge-patch this

    def covers(self, rule: Obj) -> bool:
        return self.rule in rule["rule"] and normalise(rule["message"]).startswith(self.says)

    def message(self, docs: list[Obj]) -> str:
        for rule in all_rules(docs):
            if self.covers(rule):
                return normalise(rule["message"])
        raise AssertionError(f"case {self.id}: no CEL rule {self.rule!r} saying {self.says!r}: was the rule changed?")


CASES = [
    Case("name-too-long", "size(self.metadata.name) <= 45", "metadata.name must be at most 45", cache_cluster("a" * 46)),
    Case("block-size-zero", "!self.matches('^0+", "blockSize must be greater than 0", cache_cluster(blockSize="0Mi")),
    Case("tier-medium-twice", "exists_one", "tiers: at most one tier", cache_cluster(tiers=[{"medium": "MEM", "quota": "1Gi"}, {"medium": "MEM", "quota": "2Gi"}])),
    Case("mem-not-first", "self[0].medium == 'MEM'", "tiers: list them fastest first", cache_cluster(tiers=[{"medium": "SSD", "quota": "1Gi"}, {"medium": "MEM", "quota": "1Gi"}])),
    Case("hdd-not-last", "self[size(self) - 1].medium == 'HDD'", "tiers: list them fastest first", cache_cluster(tiers=[{"medium": "HDD", "quota": "1Gi"}, {"medium": "SSD", "quota": "1Gi"}])),
    Case("mem-with-volume", "self.medium != 'MEM' || !has(self.volume)", "a MEM tier is always",
         cache_cluster(tiers=[{"medium": "MEM", "quota": "1Gi", "volume": {"hostPath": {"path": "/mnt/x"}}}])),
    Case("tier-quota-zero", "!self.matches('^0+", "tier quota must be greater than 0", cache_cluster(tiers=[{"medium": "MEM", "quota": "0Gi"}])),
    Case("volume-both", "(has(self.hostPath) ? 1 : 0) + (has(self.ephemeral) ? 1 : 0)", "tier volume: set exactly one",
         cache_cluster(tiers=[{"medium": "SSD", "quota": "1Gi", "volume": {"hostPath": {"path": "/mnt/x"}, "ephemeral": {}}}])),
    Case("volume-neither", "(has(self.hostPath) ? 1 : 0) + (has(self.ephemeral) ? 1 : 0)", "tier volume: set exactly one",
         cache_cluster(tiers=[{"medium": "SSD", "quota": "1Gi", "volume": {}}])),
    Case("journal-volume-neither", "(has(self.persistentVolumeClaim) ? 1 : 0)", "journal volume: set exactly one",
         cache_cluster(master={"journal": {"volume": {}}})),
    Case("journal-volume-two", "(has(self.persistentVolumeClaim) ? 1 : 0)", "journal volume: set exactly one",
         cache_cluster(master={"journal": {"volume": {"emptyDir": {}, "persistentVolumeClaim": {}}}})),
    Case("journal-size-zero", "!self.matches('^0+", "journal size must be greater than 0",
         cache_cluster(master={"journal": {"volume": {"persistentVolumeClaim": {"size": "0Gi"}}}})),
    Case("journal-fixed", "!has(oldSelf.journal)", "spec.master.journal: once set",
         cache_cluster(master={"journal": {"volume": {"emptyDir": {}}}}),
         update={"spec": {"master": {"journal": {"volume": {"emptyDir": None, "hostPath": {"path": "/var/lib/j"}}}}}}),
    Case("watermarks-crossed", "self.lowWatermark < self.highWatermark", "cachePolicy.lowWatermark must be below",
         cache_cluster(cachePolicy={"lowWatermark": 0.9, "highWatermark": 0.5})),
    Case("path-dotdot", "self.startsWith('/')", "spec.path must be an absolute", mount(path="/datasets/../etc")),
    Case("path-trailing-slash", "self.startsWith('/')", "spec.path must be an absolute", mount(path="/datasets/a/")),
    Case("path-root", "self.startsWith('/')", "spec.path must be an absolute", mount(path="/")),
    Case("source-scheme", "self.matches('^(s3|", "spec.source must be a URL", mount(source="ftp://host/x")),
    Case("preload-escapes", "(^|/)[.][.](/|$)')", "preload paths must stay inside", mount(preload={"paths": ["/train", "../other"]})),
    Case("cluster-immutable", "self == oldSelf", "spec.cluster cannot be changed", mount(), update={"spec": {"cluster": "other"}}),
    Case("path-immutable", "self == oldSelf", "spec.path cannot be changed", mount(), update={"spec": {"path": "/datasets/b"}}),
]


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def all_rules(docs: list[Obj]) -> Iterator[Obj]:
    def walk(node: Any) -> Iterator[Obj]:
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations", []):
                yield rule
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)

    for doc in docs:
        yield from walk(doc)


def test_every_cel_rule_has_a_case() -> None:
    docs = [yaml.safe_load(p.read_text()) for p in crd_files()]
    if not docs:
        pytest.skip("crds/*.strata.dev.yaml do not exist yet")
    missing = [r["message"] for r in all_rules(docs) if not any(c.covers(r) for c in CASES)]
    assert not missing, f"CEL rules without an e2e case in test_crds.CASES: {missing}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cel_rule_refuses_invalid_object(cluster: Cluster, crds: list[Obj], namespace: str, case: Case) -> None:
    expected = case.message(crds)
    obj = case.obj
    if case.update is not None:
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(obj))
    with pytest.raises(CommandError) as refused:
        if case.update is None:
            cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(obj))
        else:
            cluster.kubectl("patch", obj["kind"].lower(), obj["metadata"]["name"], "-n", namespace,
                            "--type=merge", "-p", json.dumps(case.update))
    error = normalise(refused.value.stderr)
    assert "is invalid" in error and expected in error, f"expected {expected!r} in: {error}"


def test_valid_objects_get_defaults(cluster: Cluster, crds: list[Obj], namespace: str) -> None:
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(cache_cluster()))
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(mount()))
    cc = cluster.get("cachecluster", "demo", namespace)["spec"]
    assert cc["image"] == "" and cc["blockSize"] == "16Mi"
    assert cc["master"]["replicas"] == 1 and cc["worker"]["replicas"] == 2
    assert cc["tiers"] == [{"medium": "MEM", "quota": "1Gi"}]
    assert cc["cachePolicy"] == {"eviction": "LRU", "readType": "CACHE", "writeType": "CACHE_THROUGH",
                                 "readaheadBlocks": 2, "highWatermark": 0.95, "lowWatermark": 0.8}
    assert cc["shortCircuit"] is True and cc["locality"] == "Preferred"
    m = cluster.get("mount", "data", namespace)["spec"]
    assert m["readOnly"] is True and m["metadataSync"] == {"interval": "30s"}
    assert m["options"] == {} and m["pin"] is False and m["ttl"] == ""
    assert m["preload"] == {"onCreate": False, "paths": []}


def _operator_running(cluster: Cluster) -> bool:
    return bool(cluster.items("pods", selector="app.kubernetes.io/component=operator"))


def test_printer_columns_short_names_and_scale(cluster: Cluster, crds: list[Obj], namespace: str) -> None:
    if _operator_running(cluster):
        pytest.skip("an operator is running and would overwrite the hand-written status; test_strata checks columns")
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(cache_cluster()))
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(mount()))
    status = {"status": {"phase": "Ready", "master": {"ready": True}, "workers": {"summary": "2/2"},
                         "capacity": {"total": "2Gi", "used": "1Gi"}, "cache": {"hitRatio": 0.93}}}
    cluster.kubectl("patch", "cachecluster", "demo", "-n", namespace, "--subresource=status", "--type=merge",
                    "-p", json.dumps(status))
    cluster.kubectl("patch", "mount", "data", "-n", namespace, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": {"phase": "Mounted", "cache": {"cachedBytes": "40Mi"}}}))

    table = cluster.kubectl("get", "cacheclusters", "-n", namespace).splitlines()
    assert table[0].split() == ["NAME", "MASTER", "WORKERS", "CAPACITY", "USED", "HIT", "RATIO", "PHASE", "AGE"]
    assert table[1].split()[:7] == ["demo", "true", "2/2", "2Gi", "1Gi", "0.93", "Ready"]
    table = cluster.kubectl("get", "mounts.strata.dev", "-n", namespace).splitlines()
    assert table[0].split() == ["NAME", "CLUSTER", "PATH", "SOURCE", "CACHED", "PHASE", "AGE"]
    assert table[1].split()[:6] == ["data", "demo", "/datasets/a", "s3://bucket/a", "40Mi", "Mounted"]

    names = {crd["spec"]["names"]["kind"]: crd["spec"]["names"] for crd in crds}
    for kind, names_ in names.items():
        for short in names_.get("shortNames", []):
            assert cluster.kubectl("get", short, "-n", namespace, "-o", "name").strip(), f"short name {short} of {kind}"
    listed = cluster.kubectl("get", "strata", "-n", namespace, "-o", "name").split()
    assert sorted(listed) == ["cachecluster.strata.dev/demo", "mount.strata.dev/data"]

    cluster.kubectl("scale", "cachecluster", "demo", "-n", namespace, "--replicas=4")
    assert cluster.get("cachecluster", "demo", namespace)["spec"]["worker"]["replicas"] == 4


def _example(kind: str, name: str) -> Obj:
    for path in sorted((REPO / "manifests" / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == kind and doc["metadata"]["name"] == name:
                return dict(doc)
    raise AssertionError(f"manifests/examples/ has no {kind} {name}")


def test_the_grant_a_refused_namespace_is_told_to_make_works_as_written(
    cluster: Cluster, crds: list[Obj], namespace: str
) -> None:
    """The CSI plugin refuses a pod of another namespace and names the `kubectl patch` that
    grants it; that command, run as written by a shell, works on the example Mount (which has
    no spec.allowedNamespaces) and again on the Mount it changed (which then has one)."""
    cluster.apply(_example("Mount", "imagenet"), namespace)
    kubectl = find_tool("kubectl")
    assert kubectl is not None
    env = {**cluster.env(), "PATH": f"{Path(kubectl).parent}:{os.environ.get('PATH', '')}"}
    for guest, granted in (("guest-a", ["guest-a"]), ("guest-b", ["guest-a", "guest-b"])):
        spec = cluster.get("mounts.strata.dev", "imagenet", namespace)["spec"]
        with pytest.raises(PermissionDenied) as refused:
            check_grant(namespace, "imagenet", spec, guest)
        found = re.search(r"\((kubectl patch .*)\)$", str(refused.value))
        assert found, str(refused.value)
        proc = subprocess.run(["bash", "-c", found.group(1)], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{found.group(1)}\n{proc.stderr}"
        spec = cluster.get("mounts.strata.dev", "imagenet", namespace)["spec"]
        assert spec["allowedNamespaces"] == granted
        check_grant(namespace, "imagenet", spec, guest)


def _kstatus(cluster: Cluster, kind: str, name: str, namespace: str) -> str:
    """What kstatus (the library Argo CD and Flux compute health with) says of the object."""
    tool = find_tool("kstatus")
    assert tool is not None, "kstatus is not built: run tests/e2e/tools/build.sh kstatus"
    obj = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json")
    proc = subprocess.run([tool], input=obj, capture_output=True, text=True, timeout=60, check=True)
    answer: Obj = json.loads(proc.stdout)
    return f"{answer['status']}: {answer['message']}"


def test_a_new_object_reads_in_progress_until_the_operator_observes_it(
    cluster: Cluster, crds: list[Obj], namespace: str
) -> None:
    """From `kubectl apply` to the operator's first status write, a CacheCluster or Mount is
    InProgress to kstatus, not Current: a GitOps sync polling right after the apply does not
    report it healthy. The operator's status then decides."""
    if _operator_running(cluster):
        pytest.skip("an operator is running and would write status before this test reads it")
    cluster.apply([cache_cluster(), mount()], namespace)
    for kind, name in (("cacheclusters.strata.dev", "demo"), ("mounts.strata.dev", "data")):
        said = _kstatus(cluster, kind, name, namespace)
        assert said.startswith("InProgress:"), f"{kind} {name}: {said}"

    # The operator's first write: a Mount still waiting is InProgress, a mounted one Current.
    waiting = MountObservation(1, MountPhase.PENDING, Problem(Reason.CLUSTER_NOT_READY, "waiting for demo"))
    mounted = MountObservation(1, MountPhase.MOUNTED)
    for observation, kstatus in ((waiting, "InProgress:"), (mounted, "Current:")):
        status = mount_status(observation, {}, datetime.now(UTC))
        cluster.kubectl("patch", "mounts.strata.dev", "data", "-n", namespace, "--subresource=status",
                        "--type=merge", "-p", json.dumps({"status": status}))
        said = _kstatus(cluster, "mounts.strata.dev", "data", namespace)
        assert said.startswith(kstatus), f"{observation.phase}: {said}"
