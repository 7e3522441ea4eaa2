"""The cluster itself works: scheduling, pods of the server image running and
Ready, Service and pod DNS names across nodes, in-cluster API access, env and
volumes from the downward API, ConfigMaps and Secrets, restarts and deletion.

These hold on any conformant cluster; on the harness they check its kubelets, kube-proxy
and CoreDNS.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from kit import Cluster, python_pod, pod_ready, wait_until

pytestmark = pytest.mark.smoke

# Serves "<hostname> <path>" on port 8080.
HTTP_SERVER = textwrap.dedent(
    """
    import http.server, socket
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"{socket.gethostname()} {self.path}".encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a): pass
    http.server.ThreadingHTTPServer(("", 8080), H).serve_forever()
    """
)

# Fetches each URL in argv-like list URLS and writes the answers as JSON to the
# termination message (read back from the pod status, so no `kubectl logs`).
FETCH = textwrap.dedent(
    """
    import json, sys, time, urllib.request
    URLS = {urls!r}
    out = {{}}
    for url in URLS:
        deadline = time.time() + 30
        while True:
            try:
                out[url] = urllib.request.urlopen(url, timeout=3).read().decode()
                break
            except Exception as exc:
                if time.time() > deadline:
                    out[url] = "ERROR " + repr(exc)
                    break
                time.sleep(0.3)
    open("/dev/termination-log", "w").write(json.dumps(out))
    sys.exit(0 if all(not v.startswith("ERROR") for v in out.values()) else 1)
    """
)


def anti_affinity(app: str) -> dict[str, object]:
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"}]}}


def web_deployment(name: str, replicas: int = 1) -> dict[str, object]:
    pod = python_pod(name, HTTP_SERVER, labels={"app": name}, restart="Always", ports=[8080])
    pod["spec"]["containers"][0]["readinessProbe"] = {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]}},
    }


def service(name: str, *, app: str | None = None, headless: bool = False, port: int = 80) -> dict[str, object]:
    spec: dict[str, object] = {"selector": {"app": app or name}, "ports": [{"name": "http", "port": port, "targetPort": 8080}]}
    if headless:
        spec["clusterIP"] = "None"
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}


def run_to_completion(cluster: Cluster, namespace: str, pod: dict[str, Any], timeout: float = 90) -> dict[str, object]:
    """Create a restartPolicy=Never pod and return its terminated state."""
    cluster.apply(pod, namespace)
    name = pod["metadata"]["name"]

    def finished() -> dict[str, object] | None:
        p = cluster.get("pod", name, namespace)
        if p["status"].get("phase") in ("Succeeded", "Failed"):
            return dict(p["status"]["containerStatuses"][0]["state"]["terminated"])
        return None

    return wait_until(finished, timeout=timeout, what=f"pod {name} to finish",
                      diagnose=lambda: cluster.describe_pods(namespace))


def test_nodes_are_ready_with_zones(cluster: Cluster) -> None:
    nodes = cluster.items("nodes")
    ready = [n for n in nodes if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])]
    assert ready, f"no Ready node among {[n['metadata']['name'] for n in nodes]}"
    if cluster.harness:
        assert len(ready) == len(cluster.harness["nodes"])
        zones = {n["metadata"]["labels"].get("topology.kubernetes.io/zone") for n in ready}
        assert len(zones) >= 2, f"nodes should span zones, got {zones}"


def test_deployment_pod_is_scheduled_run_and_ready(cluster: Cluster, namespace: str) -> None:
    cluster.apply(web_deployment("web"), namespace)
    cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=90s")
    (pod,) = cluster.items("pods", namespace, selector="app=web")
    assert pod["spec"]["nodeName"], "the scheduler bound the pod to a node"
    assert pod_ready(pod)
    status = pod["status"]["containerStatuses"][0]
    assert status["ready"] is True and status["restartCount"] == 0 and "running" in status["state"]
    assert pod["status"]["podIP"]


def test_pod_reaches_service_and_pod_names_on_another_node(cluster: Cluster, namespace: str) -> None:
    cluster.apply([web_deployment("web"), service("web"), service("web-headless", app="web", headless=True)], namespace)
    cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=90s")
    (server,) = cluster.items("pods", namespace, selector="app=web")
    urls = [
        f"http://web.{namespace}.svc/a",  # ClusterIP, port 80 -> 8080
        f"http://web.{namespace}.svc.cluster.local/b",
        "http://web/c",  # short name in the pod's own namespace
        f"http://web-headless.{namespace}.svc:8080/d",  # headless: the pod IP
    ]
    client = python_pod("client", FETCH.format(urls=urls), labels={"role": "client"}, affinity=anti_affinity("web"))
    state = run_to_completion(cluster, namespace, client)
    answers = json.loads(str(state.get("message", "{}")))
    client_pod = cluster.get("pod", "client", namespace)
    assert client_pod["spec"]["nodeName"] != server["spec"]["nodeName"], "anti-affinity put them on different nodes"
    assert state["exitCode"] == 0, answers
    for url in urls:
        assert answers[url] == f"{server['metadata']['name']} /{url.rsplit('/', 1)[1]}", answers


def test_statefulset_pods_have_stable_dns_names(cluster: Cluster, namespace: str) -> None:
    pod = python_pod("x", HTTP_SERVER, labels={"app": "db"}, restart="Always", ports=[8080], readiness_port=8080)
    sts = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
        "spec": {"serviceName": "db", "replicas": 2, "selector": {"matchLabels": {"app": "db"}},
                 "template": {"metadata": {"labels": {"app": "db"}}, "spec": pod["spec"]}},
    }
    cluster.apply([service("db", headless=True), sts], namespace)
    cluster.kubectl("rollout", "status", "statefulset/db", "-n", namespace, "--timeout=120s")
    urls = [f"http://db-0.db.{namespace}.svc.cluster.local:8080/x", f"http://db-1.db.{namespace}.svc:8080/y",
            "http://db-0.db:8080/z"]
    state = run_to_completion(cluster, namespace, python_pod("client", FETCH.format(urls=urls)))
    answers = json.loads(str(state.get("message", "{}")))
    assert state["exitCode"] == 0, answers
    assert answers[urls[0]] == "db-0 /x" and answers[urls[1]] == "db-1 /y" and answers[urls[2]] == "db-0 /z"


IN_CLUSTER = textwrap.dedent(
    """
    import json, os, ssl, urllib.request
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    ns = open(f"{sa}/namespace").read()
    ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    req = urllib.request.Request(f"https://{host}:{port}/api/v1/namespaces/{ns}/pods/{os.environ['POD_NAME']}",
                                 headers={"Authorization": "Bearer " + open(f"{sa}/token").read()})
    pod = json.load(urllib.request.urlopen(req, context=ctx, timeout=10))
    out = {
        "api_pod_uid": pod["metadata"]["uid"],
        "env": {k: os.environ.get(k) for k in ("POD_NAME", "POD_NS", "NODE", "POD_IP", "PASSWORD", "MODE", "GREETING")},
        "config": open("/etc/app/settings.ini").read(),
        "secret_file": open("/etc/creds/password").read(),
        "labels": open("/etc/podinfo/labels").read(),
        "scratch_writable": os.access("/scratch", os.W_OK),
    }
    open("/dev/termination-log", "w").write(json.dumps(out))
    """
)


def test_pod_env_volumes_and_in_cluster_api(cluster: Cluster, namespace: str) -> None:
    cluster.apply([
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app"},
         "data": {"settings.ini": "[main]\nx = 1\n", "mode": "fast"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"}, "stringData": {"password": "s3cret"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "read-pods"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "read-pods"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-pods"},
         "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}]},
    ], namespace)
    pod = python_pod("probe", IN_CLUSTER, labels={"tier": "e2e"})
    c = pod["spec"]["containers"][0]
    c["env"] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "mode"}}},
        {"name": "GREETING", "value": "hello $(POD_NAME)"},
    ]
    c["volumeMounts"] = [
        {"name": "config", "mountPath": "/etc/app"},
        {"name": "creds", "mountPath": "/etc/creds", "readOnly": True},
        {"name": "podinfo", "mountPath": "/etc/podinfo"},
        {"name": "scratch", "mountPath": "/scratch"},
    ]
    pod["spec"]["volumes"] = [
        {"name": "config", "configMap": {"name": "app", "items": [{"key": "settings.ini", "path": "settings.ini"}]}},
        {"name": "creds", "secret": {"secretName": "creds"}},
        {"name": "podinfo", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
        {"name": "scratch", "emptyDir": {}},
    ]
    state = run_to_completion(cluster, namespace, pod)
    assert state["exitCode"] == 0, state
    out = json.loads(str(state["message"]))
    live = cluster.get("pod", "probe", namespace)
    assert out["api_pod_uid"] == live["metadata"]["uid"], "in-cluster config reached the API as the pod's SA"
    assert out["env"] == {
        "POD_NAME": "probe", "POD_NS": namespace, "NODE": live["spec"]["nodeName"], "POD_IP": live["status"]["podIP"],
        "PASSWORD": "s3cret", "MODE": "fast", "GREETING": "hello probe",
    }
    assert out["config"] == "[main]\nx = 1\n" and out["secret_file"] == "s3cret"
    assert 'tier="e2e"' in out["labels"] and out["scratch_writable"] is True


def test_crashing_container_is_restarted_and_deleted_pod_replaced(cluster: Cluster, namespace: str) -> None:
    crash = python_pod("crash", "import sys; sys.exit(3)", restart="Always")
    cluster.apply(crash, namespace)

    def restarted() -> bool:
        st = cluster.get("pod", "crash", namespace)["status"].get("containerStatuses", [{}])[0]
        last = st.get("lastState", {}).get("terminated", {})
        return bool(st.get("restartCount", 0) >= 1 and last.get("exitCode") == 3)

    wait_until(restarted, timeout=60, what="the crashing container to be restarted",
               diagnose=lambda: cluster.describe_pods(namespace))

    cluster.apply(web_deployment("web"), namespace)
    cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=90s")
    (old,) = cluster.items("pods", namespace, selector="app=web")
    cluster.kubectl("delete", "pod", old["metadata"]["name"], "-n", namespace, "--wait=true", "--timeout=60s")

    def replaced() -> bool:
        pods = cluster.items("pods", namespace, selector="app=web")
        return len(pods) == 1 and pods[0]["metadata"]["uid"] != old["metadata"]["uid"] and pod_ready(pods[0])

    wait_until(replaced, timeout=90, what="the ReplicaSet to replace the deleted pod",
               diagnose=lambda: cluster.describe_pods(namespace))


VOLUME_CHECK = textwrap.dedent(
    """
    import json, os
    for d in ("/claim", "/host"):
        with open(f"{d}/written-by-pod", "w") as f:
            f.write("ok")
    out = {d: sorted(os.listdir(d)) for d in ("/claim", "/host")}
    open("/dev/termination-log", "w").write(json.dumps(out))
    """
)


def test_generic_ephemeral_and_host_path_volumes(cluster: Cluster, namespace: str) -> None:
    pod = python_pod("vols", VOLUME_CHECK)
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "claim", "mountPath": "/claim"},
                                                    {"name": "host", "mountPath": "/host"}]
    pod["spec"]["volumes"] = [
        {"name": "claim", "ephemeral": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}}}}},
        {"name": "host", "hostPath": {"path": f"/tmp/strata-e2e-{namespace}", "type": "DirectoryOrCreate"}},
    ]
    state = run_to_completion(cluster, namespace, pod, timeout=120)
    assert state["exitCode"] == 0, state
    assert json.loads(str(state["message"])) == {"/claim": ["written-by-pod"], "/host": ["written-by-pod"]}
    pvc = cluster.get("pvc", "vols-claim", namespace)
    assert pvc["status"]["phase"] == "Bound", "the claim of the ephemeral volume was provisioned and bound"
