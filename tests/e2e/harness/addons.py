"""What the kubelet cluster installs through the API once its nodes are up: CoreDNS (a
Deployment of the locally built image behind the Service kube-dns), and the StorageClass
`standard` with a pool of hostPath PersistentVolumes, a few per node, for PVCs and generic
ephemeral volumes (no provisioner runs: WaitForFirstConsumer binds a claim to a free
volume on the node its pod is scheduled to)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

Obj = dict[str, Any]
COREDNS_IMAGE = "localhost/coredns:e2e"
STORAGE_CLASS = "standard"
VOLUME_SIZE = "1Gi"

# Only cluster names resolve: no forward plugin, so nothing asks a name server outside.
COREFILE = """\
.:53 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    cache 5
}
"""


def coredns(service_ip: str) -> list[Obj]:
    labels = {"k8s-app": "kube-dns"}
    meta = {"namespace": "kube-system", "labels": labels}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", **meta}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "strata-e2e:coredns"},
         "rules": [
             {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
             {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "strata-e2e:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "strata-e2e:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "coredns", **meta},
         "data": {"Corefile": COREFILE}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "coredns", **meta},
         "spec": {
             "replicas": 1,
             "selector": {"matchLabels": labels},
             "template": {
                 "metadata": {"labels": labels},
                 "spec": {
                     "serviceAccountName": "coredns",
                     "dnsPolicy": "Default",
                     "priorityClassName": "system-cluster-critical",
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{
                         "name": "coredns",
                         "image": COREDNS_IMAGE,
                         "imagePullPolicy": "Never",
                         "args": ["-conf", "/etc/coredns/Corefile"],
                         "ports": [{"containerPort": 53, "protocol": "UDP", "name": "dns"},
                                   {"containerPort": 53, "protocol": "TCP", "name": "dns-tcp"}],
                         "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
                         "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10},
                         "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
                         "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
                     }],
                     "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                 },
             },
         }},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kube-dns", **meta},
         "spec": {"selector": labels, "clusterIP": service_ip,
                  "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                            {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53}]}},
    ]


# Volumes per node. Every CacheCluster's master keeps its journal on a claim of the default
# class, and a released volume is not used again (Retain): enough for a whole session's
# clusters (about 30) on any node, plus the tests' own claims.
VOLUMES_PER_NODE = 16


def storage(nodes: list[str], folder: Path, per_node: int = VOLUMES_PER_NODE) -> list[Obj]:
    """The default StorageClass and `per_node` hostPath volumes on each node, under folder
    (a host path: nodes see the host's folders). Each volume's folder is writable by every
    user, as the local-path provisioner (kind's default class) makes them: hostPath volumes
    do not take a pod's fsGroup, and the servers run as a user of their own."""
    objs: list[Obj] = [{
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "kubernetes.io/no-provisioner",
        "reclaimPolicy": "Retain",
        "volumeBindingMode": "WaitForFirstConsumer",
    }]
    for node in nodes:
        for i in range(per_node):
            name = f"{node}-pv-{i}"
            path = folder / name
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)
            objs.append({
                "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": VOLUME_SIZE},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": STORAGE_CLASS,
                    "hostPath": {"path": str(path), "type": "Directory"},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
                },
            })
    return objs
