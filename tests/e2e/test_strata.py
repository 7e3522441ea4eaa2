"""Strata end to end, as installed by its Helm chart: CacheCluster Ready, Mount
Mounted against an S3 store, a pod reading through a Strata volume, scaling,
self-healing, operator restarts, deletion, and bad credentials.

Skipped (with the reason) until charts/strata exists. Written against the
contract in shared/DESIGN.md, not against the operator's code.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import boto3  # type: ignore[import-untyped]
import pytest

from harness.chart import RELEASE, RELEASE_NS, install_command
from storeproxy import StoreProxy

from kit import (
    REPO,
    SERVER_IMAGE,
    Cluster,
    CommandError,
    condition,
    find_tool,
    load_fixture,
    make_namespace,
    pod_ready,
    python_pod,
    wait_until,
)

Obj = dict[str, Any]
READY_TIMEOUT = 300.0
# Namespaces with a CacheCluster and Mounts deleted at once (the delete is racy), and the bound for all.
NAMESPACE_DELETE_TRIES = 3
NAMESPACE_DELETE_TIMEOUT = 120.0
CHILD_KINDS = ("statefulset", "service", "configmap", "secret", "poddisruptionbudget", "persistentvolumeclaim")


# The operator's pace on this suite's cluster: a cluster's status follows its pods within 2 s
# (default 5) and a deleted child comes back within 10 s (default 30). The code paths are the
# same; the defaults are those of the unit tests (tests/unit/operator).
OPERATOR_PACE = ("--set", "operator.reconcileInterval=10",
                 "--set", "operator.extraEnv[0].name=STRATA_OPERATOR_RETRY_DELAY",
                 "--set-string", "operator.extraEnv[0].value=2")


def chart_args(cluster: Cluster) -> list[str]:
    """The values this suite installs the chart with: STRATA_E2E_HELM_ARGS, else the images
    the harness built; and the operator's pace."""
    extra = shlex.split(os.environ.get("STRATA_E2E_HELM_ARGS", ""))
    if not extra and cluster.harness:
        extra = list(cluster.harness.get("helm_args", []))
    return [*extra, *OPERATOR_PACE]


# -- fixtures ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def strata(cluster: Cluster, chart_dir: Path) -> Iterator[Cluster]:
    """The chart installed for this module (uninstalled afterwards)."""
    if find_tool("helm") is None:
        pytest.skip("helm is not built: run tests/e2e/tools/build.sh")
    cluster.run(*install_command(chart_args(cluster), chart_dir), timeout=120)
    try:
        # Not `helm --wait`: this wait names the pods that are not ready, and why.
        wait_until(lambda: _operator_pods(cluster) and all(pod_ready(p) for p in cluster.items("pods", RELEASE_NS)),
                   timeout=180, what=f"the pods of release {RELEASE} to be Ready",
                   diagnose=lambda: cluster.describe_pods(RELEASE_NS))
        yield cluster
    finally:
        cluster.run("helm", "uninstall", RELEASE, "-n", RELEASE_NS, "--wait", check=False, timeout=300)


@pytest.fixture(scope="module")
def s3(cluster: Cluster) -> Iterator[dict[str, str]]:
    """An S3 store (moto) that pods and this process both reach, with one IAM
    user whose key is valid: {endpoint, key, secret}. On the harness moto
    listens on the API server's address, which pods reach; elsewhere set STRATA_E2E_S3_ENDPOINT
    (plus STRATA_E2E_S3_KEY/SECRET) to a store the cluster reaches."""
    endpoint = os.environ.get("STRATA_E2E_S3_ENDPOINT")
    if endpoint:
        yield {"endpoint": endpoint, "key": os.environ.get("STRATA_E2E_S3_KEY", ""),
               "secret": os.environ.get("STRATA_E2E_S3_SECRET", "")}
        return
    if not cluster.harness:
        pytest.skip("no S3 store for the cluster: set STRATA_E2E_S3_ENDPOINT")
    host = urlparse(str(cluster.harness["server"])).hostname or "127.0.0.1"
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}  # then every request needs a valid key
    moto = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", host, "-p", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://{host}:{port}"
    try:
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
        wait_until(lambda: iam.create_user(UserName="e2e"), timeout=30, what="moto to answer")
        iam.put_user_policy(UserName="e2e", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="e2e")["AccessKey"]
        yield {"endpoint": endpoint, "key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
    finally:
        moto.terminate()
        moto.wait(timeout=10)


@pytest.fixture(scope="module")
def dataset(s3: dict[str, str]) -> dict[str, bytes]:
    """A bucket `e2e-data` with a few objects; returns {key: bytes}."""
    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1",
                          aws_access_key_id=s3["key"], aws_secret_access_key=s3["secret"])
    client.create_bucket(Bucket="e2e-data")
    files = {f"train/part-{i}.bin": hashlib.sha256(str(i).encode()).digest() * (1000 + 97 * i) for i in range(3)}
    files["README"] = b"strata e2e dataset\n"
    for key, body in files.items():
        client.put_object(Bucket="e2e-data", Key=key, Body=body)
    return files


# -- helpers -----------------------------------------------------------------------
def cache_cluster(workers: int = 2) -> Obj:
    (cc,) = load_fixture("strata", "cachecluster.yaml")
    cc["spec"]["worker"]["replicas"] = workers
    return cc


def s3_mount(s3: dict[str, str], name: str = "data", secret: str = "s3-creds", bucket: str = "e2e-data") -> list[Obj]:
    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret},
         "stringData": {"key": s3["key"], "secret": s3["secret"]}},
        {"apiVersion": "strata.dev/v1alpha1", "kind": "Mount", "metadata": {"name": name},
         "spec": {"cluster": "demo", "path": f"/{name}", "source": f"s3://{bucket}",
                  "options": {"endpoint_url": s3["endpoint"]}, "credentials": {"secretRef": {"name": secret}}}},
    ]


def wait_ready(cluster: Cluster, namespace: str, name: str = "demo") -> Obj:
    cluster.kubectl("wait", "--for=condition=Ready", f"cachecluster/{name}", "-n", namespace,
                    f"--timeout={int(READY_TIMEOUT)}s", check=False)
    return wait_until(
        lambda: (cc := cluster.get("cachecluster", name, namespace)) and cc.get("status", {}).get("phase") == "Ready" and cc,
        timeout=30, what=f"CacheCluster {name} phase Ready",
        diagnose=lambda: json.dumps(cluster.get("cachecluster", name, namespace).get("status"), indent=1)
        + "\n" + cluster.describe_pods(namespace),
    )


def children(cluster: Cluster, namespace: str, name: str = "demo") -> dict[str, Obj]:
    """The CacheCluster's children by "kind/name"."""
    out = {}
    for kind in CHILD_KINDS:
        for obj in cluster.items(kind, namespace, selector=f"app.kubernetes.io/instance={name}"):
            out[f"{kind}/{obj['metadata']['name']}"] = obj
    return out


def ready_cluster(cluster: Cluster, namespace: str, workers: int = 2) -> Obj:
    cluster.apply(cache_cluster(workers=workers), namespace)
    return wait_ready(cluster, namespace)


# -- tests -----------------------------------------------------------------------------
@pytest.mark.smoke
def test_cachecluster_becomes_ready_with_its_children(strata: Cluster, namespace: str) -> None:
    cc = ready_cluster(strata, namespace)
    status = cc["status"]
    assert status["observedGeneration"] == cc["metadata"]["generation"]
    assert status["master"]["ready"] is True
    assert status["master"]["endpoint"].startswith(f"demo-master-0.demo-master.{namespace}.svc")
    assert status["workers"]["ready"] == status["workers"]["desired"] == 2
    for kind in ("Ready", "MasterReady", "WorkersReady"):
        assert (condition(cc, kind) or {}).get("status") == "True", kind
    names = set(children(strata, namespace))
    for expected in ("statefulset/demo-master", "statefulset/demo-worker", "service/demo-master",
                     "service/demo-worker", "configmap/demo-config", "secret/demo-auth",
                     "poddisruptionbudget/demo-worker", "persistentvolumeclaim/demo-journal"):
        assert expected in names, f"{expected} missing among {sorted(names)}"
    for obj in children(strata, namespace).values():
        owners = obj["metadata"].get("ownerReferences", [])
        assert any(o["kind"] == "CacheCluster" and o["name"] == "demo" and o.get("controller") for o in owners), obj["metadata"]["name"]
    row = strata.kubectl("get", "cacheclusters", "-n", namespace, "--no-headers").split()
    assert row[0] == "demo" and row[1] == "true" and row[2] == "2/2" and row[-2] == "Ready", row


@pytest.mark.smoke
def test_mount_is_mounted_and_shown(strata: Cluster, namespace: str, s3: dict[str, str], dataset: dict[str, bytes]) -> None:
    ready_cluster(strata, namespace)
    strata.apply(s3_mount(s3), namespace)
    wait_until(lambda: strata.get("mount", "data", namespace).get("status", {}).get("phase") == "Mounted",
               timeout=120, what="Mount data phase Mounted",
               diagnose=lambda: json.dumps(strata.get("mount", "data", namespace).get("status"), indent=1))
    m = strata.get("mount", "data", namespace)
    assert (condition(m, "Ready") or {}).get("status") == "True"
    row = strata.kubectl("get", "mounts.strata.dev", "-n", namespace, "--no-headers").split()
    assert row[:4] == ["data", "demo", "/data", "s3://e2e-data"], row
    assert "Mounted" in row
    shown = json.dumps(m)
    assert s3["secret"] not in shown, "credentials must never appear in the Mount"


def test_pod_reads_store_bytes_through_a_strata_volume(
    strata: Cluster, namespace: str, s3: dict[str, str], dataset: dict[str, bytes]
) -> None:
    if strata.get_or_none("csidriver", "csi.strata.dev") is None:
        pytest.skip("CSIDriver csi.strata.dev is not installed (the CSI plugin is issue 5)")
    ready_cluster(strata, namespace)
    strata.apply(s3_mount(s3), namespace)
    script = ("import hashlib, json, os\n"
              "out = {p: hashlib.sha256(open('/data/' + p, 'rb').read()).hexdigest() for p in %r}\n"
              "out['listing'] = sorted(os.listdir('/data/train'))\n"
              "open('/dev/termination-log', 'w').write(json.dumps(out))\n" % sorted(dataset))
    pod = python_pod("reader", script)
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data", "readOnly": True}]
    pod["spec"]["volumes"] = [{"name": "data", "csi": {"driver": "csi.strata.dev", "readOnly": True,
                                                      "volumeAttributes": {"mount": "data"}}}]
    strata.apply(pod, namespace)
    wait_until(lambda: strata.get("pod", "reader", namespace)["status"].get("phase") in ("Succeeded", "Failed"),
               timeout=180, what="the reader pod to finish", diagnose=lambda: strata.describe_pods(namespace))
    state = strata.get("pod", "reader", namespace)["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["exitCode"] == 0, state
    out = json.loads(state["message"])
    for key, body in dataset.items():
        assert out[key] == hashlib.sha256(body).hexdigest(), key
    assert out["listing"] == sorted(k.split("/")[1] for k in dataset if k.startswith("train/"))


def _reader_pod(name: str, paths: list[str], annotations: dict[str, str] | None = None) -> Obj:
    """A pod that reads `paths` through the `data` Mount and reports their sha256."""
    script = ("import hashlib, json\n"
              "out = {p: hashlib.sha256(open('/data/' + p, 'rb').read()).hexdigest() for p in %r}\n"
              "open('/dev/termination-log', 'w').write(json.dumps(out))\n" % sorted(paths))
    pod = python_pod(name, script)
    pod["metadata"]["annotations"] = annotations or {}
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data", "readOnly": True}]
    pod["spec"]["volumes"] = [{"name": "data", "csi": {"driver": "csi.strata.dev", "readOnly": True,
                                                      "volumeAttributes": {"mount": "data"}}}]
    return pod


def _finished(cluster: Cluster, namespace: str, name: str) -> Obj:
    wait_until(lambda: cluster.get("pod", name, namespace)["status"].get("phase") in ("Succeeded", "Failed"),
               timeout=180, what=f"pod {name} to finish", diagnose=lambda: cluster.describe_pods(namespace))
    pod = cluster.get("pod", name, namespace)
    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["exitCode"] == 0, state
    return pod


def test_a_pod_lands_on_a_node_holding_its_data(
    strata: Cluster, namespace: str, s3: dict[str, str], dataset: dict[str, bytes]
) -> None:
    ready_cluster(strata, namespace)
    strata.apply(s3_mount(s3), namespace)
    strata.apply(_reader_pod("warm-up", sorted(dataset)), namespace)
    _finished(strata, namespace, "warm-up")

    def data_nodes() -> set[str]:
        nodes = strata.get("mount", "data", namespace).get("status", {}).get("cache", {}).get("nodes") or []
        return {n["node"] for n in nodes if n.get("bytes")}

    holding = wait_until(data_nodes, timeout=120, what="Mount status to show the nodes holding the data")
    strata.apply(_reader_pod("near-data", sorted(dataset), {"strata.dev/locality": "required"}), namespace)
    pod = _finished(strata, namespace, "near-data")
    assert pod["spec"]["nodeName"] in holding, (pod["spec"]["nodeName"], holding)
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    allowed = {v for t in terms for e in t["matchExpressions"] if e["key"] == "kubernetes.io/hostname" for v in e["values"]}
    assert allowed and allowed <= holding
    # A pod with no Strata volume is never touched.
    plain = python_pod("plain", "print('hello')")
    strata.apply(plain, namespace)
    untouched = strata.get("pod", "plain", namespace)
    assert "affinity" not in untouched["spec"]
    assert "strata.dev/locality-applied" not in (untouched["metadata"].get("annotations") or {})


def _master_report(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """`strata report --json`, as a person would run it in the master's container."""
    out: dict[str, Any] = json.loads(cluster.kubectl("exec", "demo-master-0", "-n", namespace, "--", "strata",
                                                     "--master", "127.0.0.1:19998", "report", "--json"))
    return out


def _workers_in_report(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    return {w["worker"]["workerId"]: w for w in _master_report(cluster, namespace).get("workers", [])}


def _wait_workers(cluster: Cluster, namespace: str, replicas: int) -> None:
    """Wait until the cluster is Ready with `replicas` ready workers."""
    wait_until(
        lambda: (cc := cluster.get("cachecluster", "demo", namespace)["status"])
        and cc.get("workers", {}).get("ready") == replicas and cc.get("workers", {}).get("desired") == replicas
        and cc.get("phase") == "Ready",
        timeout=READY_TIMEOUT, what=f"{replicas} ready workers", diagnose=lambda: cluster.describe_pods(namespace))


@pytest.mark.disruptive
def test_scale_up_and_down(strata: Cluster, namespace: str) -> None:
    ready_cluster(strata, namespace)
    for replicas in (3, 1):
        strata.kubectl("scale", "cachecluster", "demo", "-n", namespace, f"--replicas={replicas}")
        _wait_workers(strata, namespace, replicas)
        sts = strata.get("statefulset", "demo-worker", namespace)
        assert sts["spec"]["replicas"] == replicas
        assert strata.kubectl("get", "cachecluster", "demo", "-n", namespace, "--no-headers").split()[2] == f"{replicas}/{replicas}"
        # Ready once a scale-in is done: no worker pod still terminating.
        selector = strata.get("cachecluster", "demo", namespace)["status"]["workers"]["selector"]
        assert len(strata.items("pods", namespace, selector=selector)) == replicas


@pytest.mark.disruptive
@pytest.mark.timeout(1200)
def test_scaled_in_and_out_again_every_worker_serves(strata: Cluster, namespace: str, s3: dict[str, str]) -> None:
    """3 -> 2 -> 3 workers: once the cluster says Ready again, the master knows all three
    live and none leaving, and the returning demo-worker-2 takes blocks and serves reads.
    Before: the master kept demo-worker-2 decommissioned for good (no block placed on it,
    no read sent to it) while the cluster said Ready."""
    files = {f"scale/part-{i:02}.bin": _big_file(1 << 20, f"scale{i}") for i in range(24)}
    _bucket(s3, "e2e-scale", files)
    ready_cluster(strata, namespace, workers=3)
    strata.apply(s3_mount(s3, bucket="e2e-scale"), namespace)
    for replicas in (2, 3):
        strata.kubectl("scale", "cachecluster", "demo", "-n", namespace, f"--replicas={replicas}")
        _wait_workers(strata, namespace, replicas)
    workers = _workers_in_report(strata, namespace)
    shown = {name: (w.get("live", False), w["worker"].get("decommissioning", False)) for name, w in workers.items()}
    assert shown == {f"demo-worker-{i}": (True, False) for i in range(3)}, shown
    # A reader next to the returning worker reads through it: its blocks go there, then are read there.
    node = strata.get("pod", "demo-worker-2", namespace)["spec"]["nodeName"]
    _read_all(strata, namespace, "first", files, node=node)
    _read_all(strata, namespace, "second", files, node=node)

    def returned() -> dict[str, Any] | None:
        stats = _workers_in_report(strata, namespace)["demo-worker-2"].get("stats", {})
        blocks = sum(int(t.get("blocks", 0)) for t in stats.get("tiers", []))
        served = int(stats.get("hits", 0)) + int(stats.get("shortCircuitReads", 0))
        return stats if blocks >= len(files) and served > 0 else None

    wait_until(returned, timeout=60, what="demo-worker-2 to hold the blocks read next to it and to serve them",
               diagnose=lambda: json.dumps(_workers_in_report(strata, namespace), indent=1))


def _rolled_out(cluster: Cluster, namespace: str) -> bool:
    for name in ("demo-master", "demo-worker"):
        sts = cluster.get("statefulset", name, namespace)
        status = sts.get("status", {})
        if not (status.get("observedGeneration", 0) >= sts["metadata"]["generation"]
                and status.get("currentRevision") == status.get("updateRevision")
                and status.get("updatedReplicas", 0) == status.get("replicas", 0) == sts["spec"]["replicas"]):
            return False
    return True


def test_ready_only_once_a_spec_edit_has_rolled_out(strata: Cluster, namespace: str) -> None:
    cc = ready_cluster(strata, namespace)
    strata.kubectl("patch", "cachecluster", "demo", "-n", namespace, "--type=merge",
                   "-p", json.dumps({"spec": {"tiers": [{"medium": "MEM", "quota": "48Mi"}]}}))
    generation = cc["metadata"]["generation"] + 1
    started = time.monotonic()
    deadline = started + READY_TIMEOUT
    while time.monotonic() < deadline:
        status = strata.get("cachecluster", "demo", namespace).get("status", {})
        if status.get("observedGeneration") == generation and status.get("phase") == "Ready":
            # Ready at the new generation: every pod is of the new spec (checked after the
            # status was read, so a rollout still under way shows).
            assert _rolled_out(strata, namespace), "Ready while the StatefulSets still roll out"
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"not Ready within {READY_TIMEOUT:.0f}s of the edit")
    print(f"\nReady {time.monotonic() - started:.1f}s after a tier quota edit")


@pytest.mark.disruptive
def test_deleted_child_comes_back(strata: Cluster, namespace: str) -> None:
    ready_cluster(strata, namespace)
    for kind, name in (("service", "demo-worker"), ("configmap", "demo-config")):
        old = strata.get(kind, name, namespace)["metadata"]["uid"]
        strata.kubectl("delete", kind, name, "-n", namespace, "--wait=true")
        wait_until(lambda: (o := strata.get_or_none(kind, name, namespace)) and o["metadata"]["uid"] != old,
                   timeout=120, what=f"{kind}/{name} to be re-created")
    wait_ready(strata, namespace)


def _operator_pods(cluster: Cluster) -> list[Obj]:
    return cluster.items("pods", RELEASE_NS, selector="app.kubernetes.io/component=operator")


def _restart_operator(cluster: Cluster) -> None:
    old = {p["metadata"]["uid"] for p in _operator_pods(cluster)}
    assert old, "no operator pod"
    cluster.kubectl("delete", "pod", "-n", RELEASE_NS, "-l", "app.kubernetes.io/component=operator",
                    "--wait=true", "--timeout=120s")
    wait_until(lambda: (pods := _operator_pods(cluster)) and len(pods) == len(old)
               and all(pod_ready(p) and p["metadata"]["uid"] not in old for p in pods),
               timeout=120, what="new operator pods to be Ready", diagnose=lambda: cluster.describe_pods(RELEASE_NS))


def _operator_log(cluster: Cluster) -> str:
    return "".join(cluster.kubectl("logs", "-n", RELEASE_NS, p["metadata"]["name"])
                   for p in _operator_pods(cluster))


@pytest.mark.disruptive
def test_operator_restart_changes_nothing(strata: Cluster, namespace: str) -> None:
    ready_cluster(strata, namespace)
    before = {k: o["metadata"]["resourceVersion"] for k, o in children(strata, namespace).items()}
    cc_before = strata.get("cachecluster", "demo", namespace)
    _restart_operator(strata)
    # The new operator resumes every CacheCluster at start; give it a window in
    # which any change it (wrongly) makes would show, checking all along.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = {k: o["metadata"]["resourceVersion"] for k, o in children(strata, namespace).items()}
        assert now == before, f"children changed after an operator restart: {set(now.items()) ^ set(before.items())}"
        time.sleep(1)
    cc = strata.get("cachecluster", "demo", namespace)
    assert cc["metadata"]["generation"] == cc_before["metadata"]["generation"]
    assert cc["status"]["phase"] == "Ready"


@pytest.mark.disruptive
def test_a_preload_succeeds_only_when_cached_and_restarts_keep_it_true(
    strata: Cluster, namespace: str, s3: dict[str, str], dataset: dict[str, bytes]
) -> None:
    """Cluster and preloaded Mount applied together, so the master is ready before the
    workers register (the old operator said Succeeded after loading nothing); an operator
    restart starts no second preload; a master restart (its loads forgotten) gets one."""
    secret, mount = s3_mount(s3)
    mount["spec"]["preload"] = {"onCreate": True}
    strata.apply([cache_cluster(), secret, mount], namespace)

    def preloaded() -> Obj | None:
        m = strata.get("mount", "data", namespace)
        return m if (m.get("status") or {}).get("preload", {}).get("phase") == "Succeeded" else None

    m = wait_until(preloaded, timeout=300, what="the preload to succeed",
                   diagnose=lambda: json.dumps(strata.get("mount", "data", namespace).get("status"), indent=1))
    preload = m["status"]["preload"]
    assert preload["bytesLoaded"] == preload["bytesTotal"] != "0", preload
    assert (condition(m, "Preloaded") or {}).get("status") == "True"
    wait_until(lambda: strata.get("mount", "data", namespace)["status"]["cache"].get("cachedPercentage") == 100,
               timeout=30, what="the cache to hold the whole mount")
    wait_ready(strata, namespace)

    _restart_operator(strata)
    before = strata.get("mount", "data", namespace)["metadata"]["resourceVersion"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert strata.get("mount", "data", namespace)["metadata"]["resourceVersion"] == before, \
            "the Mount changed after an operator restart"
        time.sleep(1)
    assert "started preload of /data" not in _operator_log(strata)

    strata.kubectl("delete", "pod", "demo-master-0", "-n", namespace, "--wait=true", "--timeout=120s")
    wait_until(lambda: "started preload of /data" in _operator_log(strata), timeout=180,
               what="the operator to preload again after the master restart")
    m = wait_until(preloaded, timeout=180, what="the preload to succeed again")
    assert m["status"]["preload"]["bytesLoaded"] == m["status"]["preload"]["bytesTotal"]


@pytest.mark.disruptive
def test_deleting_cachecluster_removes_all_children(strata: Cluster, namespace: str) -> None:
    ready_cluster(strata, namespace)
    assert children(strata, namespace)
    strata.kubectl("delete", "cachecluster", "demo", "-n", namespace, "--wait=true", "--timeout=180s")
    wait_until(lambda: not children(strata, namespace) and not strata.items("pods", namespace),
               timeout=180, what="all children and pods of demo to be gone",
               diagnose=lambda: ", ".join(children(strata, namespace)))


@pytest.mark.disruptive
def test_deleting_a_namespace_with_a_cluster_and_mounts_never_hangs(
    strata: Cluster, s3: dict[str, str], dataset: dict[str, bytes]
) -> None:
    """What a GitOps prune does: delete the namespace holding a CacheCluster and its Mounts.
    The operator's finalizers finish, whichever object goes first; the race is why it runs
    several times, in several namespaces deleted at once (one after the other took four
    times as long, for the same race)."""
    names = [f"prune-{attempt}-{uuid.uuid4().hex[:5]}" for attempt in range(NAMESPACE_DELETE_TRIES)]
    for name in names:
        make_namespace(strata, name)
        strata.apply(cache_cluster(), name)
    for name in names:
        wait_ready(strata, name)
        strata.apply(s3_mount(s3, name="data") + s3_mount(s3, name="more", secret="more-creds"), name)
    for name in names:
        for mount in ("data", "more"):
            wait_until(lambda: strata.get("mount", mount, name).get("status", {}).get("phase") == "Mounted",
                       timeout=120, what=f"Mount {mount} in {name} phase Mounted")
    started = time.monotonic()
    for name in names:
        strata.kubectl("delete", "namespace", name, "--wait=false")
    seconds = {}
    for name in names:
        wait_until(lambda: strata.get_or_none("namespace", name) is None, timeout=NAMESPACE_DELETE_TIMEOUT,
                   what=f"namespace {name} to be gone",
                   diagnose=lambda: strata.kubectl("get", "cacheclusters,mounts.strata.dev", "-n", name, "-o",
                                                   "yaml", check=False)[-3000:])
        seconds[name] = round(time.monotonic() - started, 1)
    print(f"\nnamespaces gone after (s): {seconds}")


def test_mount_with_bad_credentials_fails_with_a_reason(
    strata: Cluster, namespace: str, s3: dict[str, str], dataset: dict[str, bytes]
) -> None:
    ready_cluster(strata, namespace)
    bad = dict(s3, key="AKIAWRONGWRONGWRONG0", secret="not-the-secret")
    strata.apply(s3_mount(bad, name="bad", secret="bad-creds"), namespace)
    m = wait_until(lambda: (m := strata.get("mount", "bad", namespace)) and m.get("status", {}).get("phase") == "Failed" and m,
                   timeout=120, what="Mount bad phase Failed",
                   diagnose=lambda: json.dumps(strata.get("mount", "bad", namespace).get("status"), indent=1))
    stalled = condition(m, "Stalled")
    assert stalled and stalled["status"] == "True", m["status"]
    assert stalled.get("reason") and stalled.get("message"), stalled
    assert "not-the-secret" not in json.dumps(m), "the secret must not be echoed"
    # `kubectl describe` shows it too: a Warning Event with the same reason, posted once.
    events = wait_until(lambda: [e for e in strata.items("events", namespace)
                                 if e["involvedObject"].get("kind") == "Mount"
                                 and e["involvedObject"].get("name") == "bad" and e.get("type") == "Warning"],
                        timeout=30, what="a Warning Event on Mount bad")
    assert [e["reason"] for e in events] == [stalled["reason"]], events
    assert stalled["message"][:200] in events[0]["message"] and "not-the-secret" not in json.dumps(events)


def test_examples_run(strata: Cluster, namespace: str) -> None:
    examples = sorted((REPO / "manifests" / "examples").glob("*.yaml"))
    if not examples:
        pytest.skip("manifests/examples/ has no examples yet")
    for path in examples:
        try:
            strata.kubectl("apply", "-n", namespace, "-f", str(path))
        except CommandError as exc:
            pytest.fail(f"{path.name} was refused: {exc}")
    for cc in strata.items("cacheclusters.strata.dev", namespace):
        wait_ready(strata, namespace, cc["metadata"]["name"])


# csi-sanity checks the installed plugin's gRPC contract, with volumes backed by
# a real Mount. No spec is skipped by us: csi-sanity itself skips what the
# plugin does not advertise (snapshots, listing, capacity, expansion,
# controller publishing, staging).
def test_csi_sanity(strata: Cluster, namespace: str, s3: dict[str, str], dataset: dict[str, bytes]) -> None:
    sanity = find_tool("csi-sanity")
    if sanity is None:
        pytest.skip("csi-sanity is not built: run tests/e2e/tools/build.sh")
    if strata.get_or_none("csidriver", "csi.strata.dev") is None:
        pytest.skip("CSIDriver csi.strata.dev is not installed (the CSI plugin is issue 5)")
    if not strata.harness:
        pytest.skip("csi-sanity needs the plugin's socket on this machine (harness only)")
    name, node = next(iter(strata.harness["nodes"].items()))
    ready_cluster(strata, namespace)
    strata.apply(s3_mount(s3), namespace)
    wait_until(lambda: strata.get("mount", "data", namespace).get("status", {}).get("phase") == "Mounted",
               timeout=120, what="Mount data phase Mounted")
    parameters = Path(node["root"]) / "csi-sanity-parameters.yaml"
    parameters.write_text(json.dumps({"mount": "data", "namespace": namespace}))
    # csi-sanity runs in the node's mount namespace, where the plugin's socket and the pods
    # folder (which the plugin's container shares, Bidirectional) are where kubelet has them.
    # Its folders go into the plugin pod's own folder: kubelet removes any other folder in
    # pods/ that belongs to no pod of its own.
    plugin = next(p for p in strata.items("pods", RELEASE_NS, selector="app.kubernetes.io/component=csi-node")
                  if p["spec"]["nodeName"] == name)
    kubelet = Path("/var/lib/kubelet")
    socket = Path(node["kubelet_dir"]) / "plugins/csi.strata.dev/csi.sock"
    endpoint = kubelet / "plugins/csi.strata.dev/csi.sock"
    work = kubelet / "pods" / plugin["metadata"]["uid"] / f"csi-sanity-{namespace}"
    prefix = ["nsenter", f"--mount={node['mount_ns']}", "--"]
    (Path(node["kubelet_dir"]) / "pods" / plugin["metadata"]["uid"] / work.name).mkdir()  # the same folder, from here
    wait_until(socket.exists, timeout=120, what=f"the CSI node plugin socket {socket}")
    proc = subprocess.run(
        [*prefix, sanity, f"--csi.endpoint=unix://{endpoint}", f"--csi.mountdir={work / 'mnt'}",
         f"--csi.stagingdir={work / 'stage'}", f"--csi.testvolumeparameters={parameters}",
         "--ginkgo.no-color", "--ginkgo.v"],
        capture_output=True, text=True, timeout=600,
    )
    print("\n".join(line for line in proc.stdout.splitlines() if "Passed" in line or "Ran " in line))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


# -- what only real kubelets show: memory cgroups, node folders, drains, logs ---------------
def _bucket(s3: dict[str, str], bucket: str, files: dict[str, bytes]) -> None:
    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1",
                          aws_access_key_id=s3["key"], aws_secret_access_key=s3["secret"])
    client.create_bucket(Bucket=bucket)
    for key, body in files.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)


def _big_file(size: int, seed: str) -> bytes:
    block = hashlib.sha512(seed.encode()).digest() * 16384  # 1 MiB
    return b"".join(hashlib.sha256(block[:64] + bytes([i % 256])).digest() + block[32:] for i in range(size >> 20))


def _worker_pods(cluster: Cluster, namespace: str, name: str = "demo") -> list[Obj]:
    return cluster.items("pods", namespace, selector=f"app.kubernetes.io/instance={name},app.kubernetes.io/component=worker")


def _exec_python(cluster: Cluster, namespace: str, pod: str, code: str, container: str | None = None) -> str:
    args = ["exec", pod, "-n", namespace] + (["-c", container] if container else []) + ["--", "python3", "-c", code]
    return cluster.kubectl(*args)


def _worker_metrics_text(cluster: Cluster, namespace: str, pod: Obj) -> str:
    """The worker's /metrics page, read inside its container (as a person would)."""
    port = next(p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", []) if p.get("name") == "http")
    return _exec_python(cluster, namespace, pod["metadata"]["name"],
                        f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics').read().decode())")


def _worker_metrics(cluster: Cluster, namespace: str, pod: Obj) -> dict[str, float]:
    """The worker's Prometheus counters by name (of a labelled family, its last sample)."""
    text = _worker_metrics_text(cluster, namespace, pod)
    out = {}
    for line in text.splitlines():
        if line.startswith("strata_worker_") and " " in line:
            key, value = line.rsplit(" ", 1)
            out[key.split("{")[0].removesuffix("_total")] = float(value)
    return out


def _read_all(cluster: Cluster, namespace: str, name: str, files: dict[str, bytes], node: str | None = None) -> None:
    pod = _reader_pod(name, sorted(files), {"strata.dev/locality": "disabled"})
    if node:
        pod["spec"]["nodeName"] = node
    cluster.apply(pod, namespace)
    out = json.loads(_finished(cluster, namespace, name)["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
    for key, body in files.items():
        assert out[key] == hashlib.sha256(body).hexdigest(), key


def test_mem_tier_counts_against_the_worker_memory_limit(
    strata: Cluster, namespace: str, s3: dict[str, str]
) -> None:
    """The MEM tier is tmpfs charged to the worker container's memory cgroup: filling it to
    its quota shows in the container's memory use, and a limit above quota + the process
    is never exceeded (no OOM kill)."""
    files = {"big/a.bin": _big_file(48 << 20, "a"), "big/b.bin": _big_file(48 << 20, "b")}
    _bucket(s3, "e2e-mem", files)
    cc = cache_cluster(workers=1)
    cc["spec"]["tiers"] = [{"medium": "MEM", "quota": "64Mi"}]
    cc["spec"]["worker"]["resources"] = {"requests": {"memory": "384Mi"}, "limits": {"memory": "384Mi"}}
    strata.apply(cc, namespace)
    wait_ready(strata, namespace)
    strata.apply(s3_mount(s3, bucket="e2e-mem"), namespace)
    (worker,) = _worker_pods(strata, namespace)
    shmem = ("import re; s = open('/sys/fs/cgroup/memory/memory.stat').read(); "
             "print(int(re.search(r'^shmem (\\d+)$', s, re.M).group(1)))")
    before = int(_exec_python(strata, namespace, worker["metadata"]["name"], shmem))
    _read_all(strata, namespace, "reader", files)  # 96 MiB through a 64 MiB tier
    after = int(_exec_python(strata, namespace, worker["metadata"]["name"], shmem))
    assert after - before >= 32 << 20, f"the MEM tier's blocks should count as the container's memory ({before} -> {after})"
    assert after <= (64 << 20) + (8 << 20), f"the MEM tier holds at most its quota ({after} bytes of shmem)"
    (worker,) = _worker_pods(strata, namespace)
    status = worker["status"]["containerStatuses"][0]
    assert status["restartCount"] == 0 and "running" in status["state"], status


def test_restarted_worker_serves_its_ssd_blocks_without_store_reads(
    strata: Cluster, namespace: str, s3: dict[str, str]
) -> None:
    files = {f"ssd/part-{i}.bin": _big_file(4 << 20, f"ssd{i}") for i in range(3)}
    _bucket(s3, "e2e-ssd", files)
    node = sorted(n["metadata"]["name"] for n in strata.items("nodes"))[0]
    cc = cache_cluster(workers=1)
    # A node folder (hostPath): what the worker cached outlives its pod. /run/strata is a
    # folder of the node's own on the harness.
    cc["spec"]["tiers"] = [{"medium": "SSD", "quota": "256Mi", "volume": {"hostPath": {"path": "/run/strata/e2e-ssd"}}}]
    cc["spec"]["worker"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    strata.apply(cc, namespace)
    wait_ready(strata, namespace)
    strata.apply(s3_mount(s3, bucket="e2e-ssd"), namespace)
    _read_all(strata, namespace, "first", files)
    (worker,) = _worker_pods(strata, namespace)
    warm = _worker_metrics(strata, namespace, worker)
    assert warm.get("strata_worker_ufs_bytes_read", 0) >= sum(map(len, files.values())), warm
    strata.kubectl("delete", "pod", worker["metadata"]["name"], "-n", namespace, "--wait=true", "--timeout=120s")
    wait_until(lambda: (ws := _worker_pods(strata, namespace)) and ws[0]["metadata"]["uid"] != worker["metadata"]["uid"]
               and pod_ready(ws[0]), timeout=180, what="the worker pod to come back Ready",
               diagnose=lambda: strata.describe_pods(namespace))
    wait_ready(strata, namespace)
    _read_all(strata, namespace, "second", files)
    (again,) = _worker_pods(strata, namespace)
    metrics = _worker_metrics(strata, namespace, again)
    assert metrics.get("strata_worker_ufs_bytes_read", -1) == 0, f"the restarted worker read the store: {metrics}"
    assert metrics.get("strata_worker_cache_hits", 0) > 0, metrics


@pytest.mark.disruptive
@pytest.mark.timeout(900)
def test_a_rolling_update_keeps_the_disk_tier_by_default(strata: Cluster, namespace: str, s3: dict[str, str]) -> None:
    """An SSD tier with no volume is a node folder: after a rolling update of the worker (a
    spec edit), the new pod on the same node finds its blocks and the next full read takes
    nothing from the store. Before: the tier was an emptyDir and the new pod read it all
    again."""
    files = {f"kept/part-{i}.bin": _big_file(4 << 20, f"kept{i}") for i in range(3)}
    _bucket(s3, "e2e-kept", files)
    node = sorted(n["metadata"]["name"] for n in strata.items("nodes"))[-1]
    cc = cache_cluster(workers=1)
    cc["spec"]["tiers"] = [{"medium": "SSD", "quota": "256Mi"}]
    cc["spec"]["worker"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    strata.apply(cc, namespace)
    wait_ready(strata, namespace)
    strata.apply(s3_mount(s3, bucket="e2e-kept"), namespace)
    _read_all(strata, namespace, "first", files)
    (worker,) = _worker_pods(strata, namespace)
    assert _worker_metrics(strata, namespace, worker).get("strata_worker_ufs_bytes_read", 0) >= sum(map(len, files.values()))
    strata.kubectl("patch", "cachecluster", "demo", "-n", namespace, "--type=merge",
                   "-p", json.dumps({"spec": {"cachePolicy": {"readaheadBlocks": 1}}}))
    wait_until(lambda: (ws := _worker_pods(strata, namespace)) and ws[0]["metadata"]["uid"] != worker["metadata"]["uid"]
               and pod_ready(ws[0]), timeout=READY_TIMEOUT, what="the worker pod of the new spec to be Ready",
               diagnose=lambda: strata.describe_pods(namespace))
    wait_until(lambda: _rolled_out(strata, namespace), timeout=READY_TIMEOUT, what="the rolling update to end")
    wait_ready(strata, namespace)
    _read_all(strata, namespace, "second", files)
    (again,) = _worker_pods(strata, namespace)
    metrics = _worker_metrics(strata, namespace, again)
    assert metrics.get("strata_worker_ufs_bytes_read", -1) == 0, f"the updated worker read the store: {metrics}"
    assert metrics.get("strata_worker_cache_hits", 0) + metrics.get("strata_worker_short_circuit_reads", 0) > 0, metrics


def _steady_reader(name: str, dataset: dict[str, bytes], seconds: float) -> Obj:
    """A pod reading every file of the `data` Mount over and over for `seconds` (or until
    /tmp/stop exists), checking each against its sha256; /tmp/rounds counts its finished
    rounds, and it ends with {good, bad, errors}."""
    script = ("import hashlib, json, os, time\nwant = %r\ngood, bad, errors, rounds = 0, 0, [], 0\nend = time.time() + %r\n"
              "while time.time() < end and not os.path.exists('/tmp/stop'):\n    for p, h in want.items():\n"
              "        try:\n"
              "            ok = hashlib.sha256(open('/data/' + p, 'rb').read()).hexdigest() == h\n"
              "            good, bad = good + ok, bad + (not ok)\n"
              "        except OSError as exc:\n            errors.append(repr(exc)[:200])\n"
              "    rounds += 1\n    open('/tmp/rounds', 'w').write(str(rounds))\n"
              "    time.sleep(0.2)\n"
              "open('/dev/termination-log', 'w').write(json.dumps({'good': good, 'bad': bad, 'errors': errors[:5], "
              "'n_errors': len(errors)}))\n" % ({k: hashlib.sha256(v).hexdigest() for k, v in dataset.items()}, seconds))
    pod = _reader_pod(name, [], {"strata.dev/locality": "disabled"})
    pod["spec"]["containers"][0]["command"] = ["python3", "-c", script]
    return pod


def _steady_result(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    pod = _finished(cluster, namespace, name)
    out: dict[str, Any] = json.loads(pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
    assert out["bad"] == 0 and out["n_errors"] == 0, out
    assert out["good"] > 0, out
    return out


@pytest.mark.disruptive
def test_deleting_the_auth_secret_changes_nothing_running(
    strata: Cluster, namespace: str, s3: dict[str, str], dataset: dict[str, bytes]
) -> None:
    """The operator makes `demo-auth` again with the same tokens (it keeps a copy): no server
    restarts, and a pod reading through a volume goes on. The old operator minted new tokens,
    rolled the servers and every published volume failed its reads."""
    ready_cluster(strata, namespace)
    strata.apply(s3_mount(s3), namespace)
    wait_until(lambda: strata.get("mount", "data", namespace).get("status", {}).get("phase") == "Mounted",
               timeout=120, what="Mount data phase Mounted")
    strata.apply(_steady_reader("steady", dataset, seconds=300), namespace)
    strata.kubectl("wait", "--for=condition=Ready", "pod/steady", "-n", namespace, "--timeout=120s")
    before = strata.get("secret", "demo-auth", namespace)["data"]
    pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in strata.items("pods", namespace) if p["metadata"]["name"] != "steady"}
    started = time.monotonic()
    strata.kubectl("delete", "secret", "demo-auth", "-n", namespace)
    after = wait_until(lambda: (s := strata.get_or_none("secret", "demo-auth", namespace)) and s.get("data"),
                       timeout=120, what="the operator to make demo-auth again")
    print(f"demo-auth was back after {time.monotonic() - started:.1f}s")
    assert after == before
    time.sleep(20)  # long enough for a rollout to have started, had one been wanted
    assert _rolled_out(strata, namespace)
    now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in strata.items("pods", namespace) if p["metadata"]["name"] != "steady"}
    assert now == pods, "a server pod was replaced"
    strata.kubectl("exec", "steady", "-n", namespace, "--", "touch", "/tmp/stop")
    _steady_result(strata, namespace, "steady")


def drain_node(cluster: Cluster, namespace: str, node: str, moved: list[str]) -> None:
    """`kubectl drain` of `node`; returns once the pods `moved` (of `namespace`) run again on
    another node, Ready. The caller uncordons the node."""
    cluster.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=180s")
    wait_until(lambda: all((p := cluster.get_or_none("pod", n, namespace)) and pod_ready(p)
                           and p["spec"]["nodeName"] != node for n in moved),
               timeout=240, what=f"pods {moved} to run again on another node",
               diagnose=lambda: cluster.describe_pods(namespace))


def test_drained_node_moves_pods_and_readers_keep_reading(
    strata: Cluster, namespace: str, s3: dict[str, str], dataset: dict[str, bytes]
) -> None:
    ready_cluster(strata, namespace)
    strata.apply(s3_mount(s3), namespace)
    master = strata.get("pod", "demo-master-0", namespace)["spec"]["nodeName"]
    workers = _worker_pods(strata, namespace)
    candidates = sorted({w["spec"]["nodeName"] for w in workers} - {master})
    if not candidates:
        pytest.skip(f"both workers run on the master's node {master}")
    drained = candidates[0]
    readers = sorted(n["metadata"]["name"] for n in strata.items("nodes") if n["metadata"]["name"] != drained)
    pod = _steady_reader("steady", dataset, seconds=600)  # stopped once the drain is over
    pod["spec"]["nodeName"] = readers[0]
    strata.apply(pod, namespace)
    strata.kubectl("wait", "--for=condition=Ready", "pod/steady", "-n", namespace, "--timeout=120s")
    moved = [w["metadata"]["name"] for w in workers if w["spec"]["nodeName"] == drained]
    try:
        drain_node(strata, namespace, drained, moved)
        wait_ready(strata, namespace)
        # The reader goes on reading with its workers on other nodes: a few more rounds, then stop.
        done = _rounds(strata, namespace, "steady")
        wait_until(lambda: _rounds(strata, namespace, "steady") >= done + 3, timeout=120,
                   what="the reader to finish three more rounds after the drain")
        strata.kubectl("exec", "steady", "-n", namespace, "--", "touch", "/tmp/stop")
    finally:
        strata.kubectl("uncordon", drained, check=False)
    _steady_result(strata, namespace, "steady")


def _payload(seed: str, size: int) -> bytes:
    """Bytes a pod makes the same way (the function's source is sent along)."""
    out, i = bytearray(), 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}-{i}".encode()).digest()
        i += 1
    return bytes(out[:size])


def _writer_pod(name: str, namespace: str, files: dict[str, tuple[str, int, str]]) -> Obj:
    """A pod that writes files into the namespace with the strata CLI and the cluster's data
    token ({namespace path: (seed, size, write type)}), as an application with the data
    token does."""
    script = (inspect.getsource(_payload) + "import hashlib, subprocess\n"
              f"for path, (seed, size, write_type) in {files!r}.items():\n"
              "    open('/tmp/f', 'wb').write(_payload(seed, size))\n"
              "    subprocess.run(['strata', 'fs', 'put', '--write-type', write_type, '/tmp/f', path], check=True)\n")
    master = f"demo-master-0.demo-master.{namespace}.svc:19998"
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "main", "image": SERVER_IMAGE, "command": ["python3", "-c", script],
                "env": [{"name": "STRATA_MASTER", "value": master},
                        {"name": "STRATA_DATA_TOKEN_FILE", "value": "/auth/dataToken"}],
                "volumeMounts": [{"name": "auth", "mountPath": "/auth", "readOnly": True}],
            }],
            "volumes": [{"name": "auth", "secret": {"secretName": "demo-auth", "items": [
                {"key": "dataToken", "path": "dataToken"}]}}],
        },
    }


def _live_workers(cluster: Cluster, namespace: str) -> int:
    """Workers the master hears from now (its metric, read inside its container): a status
    written before a restart may still say Ready."""
    text = _exec_python(cluster, namespace, "demo-master-0", "import urllib.request; print(urllib.request.urlopen("
                        "'http://127.0.0.1:19999/metrics').read().decode())")
    return next((int(float(line.split()[-1])) for line in text.splitlines()
                 if line.startswith("strata_master_workers_live ")), 0)


def _pending_uploads(cluster: Cluster, namespace: str) -> int:
    return int(((cluster.get("mount", "data", namespace).get("status") or {}).get("pendingUploads") or {})
               .get("count", -1))


@pytest.mark.disruptive
@pytest.mark.timeout(1200)
def test_acknowledged_writes_outlive_a_replaced_master_and_a_restarted_worker(
    strata: Cluster, namespace: str, s3: dict[str, str]
) -> None:
    """A MUST_CACHE file and an ASYNC_THROUGH file written while the store is down (a proxy
    in front of it refuses), so neither is in the store: the master pod is deleted and comes
    back on its journal (a claim of the default StorageClass) and both files read back
    whole; the worker's container restarts and its staged copy (on a volume) is still
    uploaded once the store is back. Before: the master came back on an empty emptyDir
    journal and forgot both files, the upload got NotFound and was dropped; a restarted
    container lost the staged copy."""
    _bucket(s3, "e2e-durable", {})
    store = urlparse(s3["endpoint"])
    proxy = StoreProxy(target_port=int(store.port or 80), target_host=str(store.hostname), host=str(store.hostname))
    try:
        ready_cluster(strata, namespace, workers=1)
        claim = strata.get("persistentvolumeclaim", "demo-journal", namespace)
        assert claim["status"]["phase"] == "Bound" and claim["metadata"]["ownerReferences"][0]["kind"] == "CacheCluster"
        secret, mount = s3_mount({**s3, "endpoint": proxy.endpoint_url}, bucket="e2e-durable")
        mount["spec"]["readOnly"] = False
        strata.apply([secret, mount], namespace)
        wait_until(lambda: strata.get("mount", "data", namespace).get("status", {}).get("phase") == "Mounted",
                   timeout=120, what="Mount data phase Mounted")
        files = {"/data/must.bin": ("must", (2 << 20) + 333, "MUST_CACHE"),
                 "/data/async.bin": ("async", (3 << 20) + 77, "ASYNC_THROUGH")}
        expected = {path.removeprefix("/data/"): _payload(seed, size) for path, (seed, size, _) in files.items()}
        client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1",
                              aws_access_key_id=s3["key"], aws_secret_access_key=s3["secret"])

        def stored() -> list[str]:
            return [o["Key"] for o in client.list_objects_v2(Bucket="e2e-durable").get("Contents", [])]

        with proxy.refusing():
            strata.apply(_writer_pod("writer", namespace, files), namespace)
            wait_until(lambda: strata.get("pod", "writer", namespace)["status"].get("phase") in ("Succeeded", "Failed"),
                       timeout=180, what="the writer pod to finish", diagnose=lambda: strata.describe_pods(namespace))
            assert strata.get("pod", "writer", namespace)["status"]["phase"] == "Succeeded", \
                strata.kubectl("logs", "writer", "-n", namespace, check=False)
            wait_until(lambda: _pending_uploads(strata, namespace) == 1, timeout=120,
                       what="the Mount to show the ASYNC_THROUGH upload pending")

            old = strata.get("pod", "demo-master-0", namespace)["metadata"]["uid"]
            strata.kubectl("delete", "pod", "demo-master-0", "-n", namespace, "--wait=true", "--timeout=120s")
            wait_until(lambda: (p := strata.get_or_none("pod", "demo-master-0", namespace)) and pod_ready(p)
                       and p["metadata"]["uid"] != old, timeout=240, what="the master pod to come back Ready",
                       diagnose=lambda: strata.describe_pods(namespace))
            wait_until(lambda: _live_workers(strata, namespace) == 1, timeout=120,
                       what="the worker to register with the new master")
            wait_ready(strata, namespace)
            _read_all(strata, namespace, "after-master", expected)

            worker = _worker_pods(strata, namespace)[0]["metadata"]["name"]
            _exec_python(strata, namespace, worker, "import os, signal; os.kill(1, signal.SIGTERM)")
            wait_until(lambda: (p := strata.get("pod", worker, namespace)) and pod_ready(p)
                       and p["status"]["containerStatuses"][0]["restartCount"] >= 1, timeout=240,
                       what=f"the container of {worker} to restart and be Ready",
                       diagnose=lambda: strata.describe_pods(namespace))
            wait_until(lambda: _pending_uploads(strata, namespace) == 1, timeout=120,
                       what="the restarted worker to report the upload pending again")
            assert stored() == [], "nothing can be in the store while it is down"
        wait_until(lambda: "async.bin" in stored(), timeout=240, what="the ASYNC_THROUGH file to land in the store",
                   diagnose=lambda: json.dumps(strata.get("mount", "data", namespace).get("status"), indent=1))
        assert client.get_object(Bucket="e2e-durable", Key="async.bin")["Body"].read() == expected["async.bin"]
        wait_until(lambda: _pending_uploads(strata, namespace) == 0, timeout=120, what="no upload pending")
        assert "must.bin" not in stored()  # MUST_CACHE stays in the cache only
        wait_until(lambda: _live_workers(strata, namespace) == 1, timeout=120,
                   what="the restarted worker to be registered")
        _read_all(strata, namespace, "after-worker", expected)
    finally:
        proxy.stop()


def _rounds(cluster: Cluster, namespace: str, name: str) -> int:
    """How many rounds the steady reader `name` has finished (0 before its first)."""
    out = cluster.kubectl("exec", name, "-n", namespace, "--", "cat", "/tmp/rounds", check=False)
    return int(out) if out.strip().isdigit() else 0


def test_every_component_log_is_readable(strata: Cluster, namespace: str, s3: dict[str, str], dataset: dict[str, bytes]) -> None:
    """`kubectl logs` of the operator, master, workers, CSI plugin and registrar: lines a
    person can follow, each JSON or plain text."""
    ready_cluster(strata, namespace)
    strata.apply(s3_mount(s3), namespace)
    _read_all(strata, namespace, "reader", dataset)
    pods = strata.items("pods", RELEASE_NS) + [p for p in strata.items("pods", namespace) if p["metadata"]["name"] != "reader"]
    seen = set()
    for pod in pods:
        for c in pod["spec"]["containers"]:
            text = strata.kubectl("logs", pod["metadata"]["name"], "-n", pod["metadata"]["namespace"], "-c", c["name"])
            where = f"{pod['metadata']['name']}/{c['name']}"
            lines = [line for line in text.splitlines() if line.strip()]
            assert lines, f"{where} logged nothing"
            for line in lines:
                if line.lstrip().startswith("{"):
                    json.loads(line)  # a JSON line must parse
                else:
                    assert line.isprintable(), f"{where}: unreadable line {line!r}"
            seen.add(pod["metadata"]["labels"].get("app.kubernetes.io/component", "?"))
    assert {"operator", "master", "worker", "csi-node"} <= seen, seen


# Keep this test last in the module: it uninstalls the release and deletes the CRDs (the next
# module's install brings both back).
@pytest.mark.disruptive
def test_the_documented_uninstall_ends(
    strata: Cluster, namespace: str, s3: dict[str, str], dataset: dict[str, bytes], chart_dir: Path
) -> None:
    """`helm uninstall`, then `kubectl delete -f charts/strata/crds/`, with a CacheCluster and
    a Mount in place: before, both waited forever on the operator's finalizer, with master
    and workers still running."""
    ready_cluster(strata, namespace)
    strata.apply(s3_mount(s3), namespace)
    wait_until(lambda: strata.get("mount", "data", namespace).get("status", {}).get("phase") == "Mounted",
               timeout=120, what="Mount data phase Mounted")
    started = time.monotonic()
    strata.run("helm", "uninstall", RELEASE, "-n", RELEASE_NS, timeout=300)
    uninstalled = time.monotonic() - started
    assert not strata.items("mounts") and not strata.items("cacheclusters")
    wait_until(lambda: not children(strata, namespace) and not strata.items("pods", namespace),
               timeout=120, what="master and workers to be gone", diagnose=lambda: ", ".join(children(strata, namespace)))
    started = time.monotonic()
    strata.kubectl("delete", "-f", str(chart_dir / "crds"), "--timeout=120s")
    print(f"helm uninstall took {uninstalled:.1f}s, deleting the CRDs {time.monotonic() - started:.1f}s")
    assert not [c for c in strata.items("crd") if c["spec"]["group"] == "strata.dev"]
    # The release's own pods end too (the next module installs it again and audits its
    # account from its start: an operator still stopping would be refused by then).
    wait_until(lambda: not strata.items("pods", RELEASE_NS), timeout=120, what=f"the pods of {RELEASE} to end",
               diagnose=lambda: strata.describe_pods(RELEASE_NS))
