"""Pieces every server pod shares: config and token volume, environment, probes, Services,
and the StatefulSet frame around one server container."""

from __future__ import annotations

from typing import Any

from strata.contract.constants import ENV_DATA_TOKEN_FILE, ENV_INTERNAL_TOKEN_FILE, ENV_TOKEN_FILE
from strata.operator import constants as c
from strata.operator.builders.common import (
    Manifest,
    auth_name,
    config_name,
    labels,
    metadata,
    selector_labels,
)
from strata.operator.builders.config import config_hash
from strata.operator.models import Cluster, ClusterTokens, PodSettings
from strata.operator.settings import OperatorSettings

CONFIG_VOLUME = "config"
# A pod's own folder under a shared host path, so two pods (or two clusters) on one node never
# mix their files, and a restarted pod finds its own again.
HOST_SUBPATH = "$(STRATA_POD_NAMESPACE)/$(STRATA_POD_NAME)"

# Downward API: the worker uses its pod name as worker id, the node name for locality and
# the pod IP as its address; the master logs them.
_FIELD_ENV = (
    ("STRATA_POD_NAME", "metadata.name"),
    ("STRATA_POD_NAMESPACE", "metadata.namespace"),
    ("STRATA_NODE_NAME", "spec.nodeName"),
    ("STRATA_POD_IP", "status.podIP"),
)


# Each server reads every token: it accepts all three roles and talks to its peers as internal.
_TOKEN_FILES = (
    (ENV_TOKEN_FILE, c.TOKEN_KEY),
    (ENV_DATA_TOKEN_FILE, c.DATA_TOKEN_KEY),
    (ENV_INTERNAL_TOKEN_FILE, c.INTERNAL_TOKEN_KEY),
)


def server_env() -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": name, "value": f"{c.AUTH_DIR}/{key}"} for name, key in _TOKEN_FILES
    ]
    env.extend(
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}} for name, path in _FIELD_ENV
    )
    return env


def host_path_permissions(volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """An init container handing the mounted folders of hostPath volumes (they come up owned
    by root) to the server user; None when no mount is of a hostPath."""
    hosts = {v["name"] for v in volumes if "hostPath" in v}
    mounted = [m for m in mounts if m["name"] in hosts]
    if not mounted:
        return None
    return [
        {
            "name": "volume-permissions",
            "command": ["chown", f"{c.SERVER_UID}:{c.SERVER_UID}", *(m["mountPath"] for m in mounted)],
            "securityContext": {"runAsUser": 0, "runAsNonRoot": False},
            # subPathExpr of the mounts reads the pod name and namespace from here.
            "env": server_env(),
            "volumeMounts": mounted,
        }
    ]


def config_volume(cluster: str) -> dict[str, Any]:
    """One projected volume at /etc/strata: strata.yaml from the ConfigMap and the tokens in
    auth/ from the Secret (a Secret mounted inside a ConfigMap mount would need a writable parent)."""
    return {
        "name": CONFIG_VOLUME,
        "projected": {
            "sources": [
                {
                    "configMap": {
                        "name": config_name(cluster),
                        "items": [{"key": c.CONFIG_FILE, "path": c.CONFIG_FILE}],
                    }
                },
                {
                    "secret": {
                        "name": auth_name(cluster),
                        "items": [{"key": key, "path": f"auth/{key}", "mode": 0o400} for _, key in _TOKEN_FILES],
                    }
                },
            ]
        },
    }


def config_mount() -> dict[str, Any]:
    return {"name": CONFIG_VOLUME, "mountPath": c.CONFIG_DIR, "readOnly": True}


def http_probes(port_name: str) -> dict[str, Any]:
    """Readiness answers fast; liveness gives a busy server a minute before a restart."""
    def check(period: int, failures: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": "/healthz", "port": port_name},
            "periodSeconds": period,
            "failureThreshold": failures,
        }

    return {
        "readinessProbe": check(5, 3),
        "livenessProbe": check(10, 6),
        "startupProbe": check(2, 60),
    }


def ports(**by_name: int) -> list[dict[str, Any]]:
    """Container ports, e.g. ports(rpc=19998, http=19999)."""
    return [{"name": name, "containerPort": port, "protocol": "TCP"} for name, port in by_name.items()]


def headless_service(cluster: Cluster, name: str, component: str, **by_name: int) -> Manifest:
    """Headless Service giving each pod a stable DNS name. Not-ready pods are published too:
    workers must find a starting master, and the master's readiness waits on nothing else."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(cluster, name, component),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(cluster.ref.name, component),
            "ports": [
                {"name": port_name, "port": port, "targetPort": port_name, "protocol": "TCP"}
                for port_name, port in by_name.items()
            ],
        },
    }


def scrape_annotations(container: dict[str, Any]) -> dict[str, str]:
    """`prometheus.io/*` annotations naming the container's HTTP port (named `http`), where
    /metrics is, for a Prometheus that finds pods by their annotations."""
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "http")
    return {c.SCRAPE_ANNOTATION: "true", c.SCRAPE_PORT_ANNOTATION: str(port), c.SCRAPE_PATH_ANNOTATION: c.METRICS_PATH}


def server_statefulset(
    cluster: Cluster,
    settings: OperatorSettings,
    *,
    name: str,
    component: str,
    pod: PodSettings,
    container: dict[str, Any],
    volumes: list[dict[str, Any]],
    affinity: dict[str, Any],
    tokens: ClusterTokens,
    extra_spec: dict[str, Any] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
) -> Manifest:
    """A StatefulSet running one server container with the shared config, env and probes."""
    image = cluster.spec.image or settings.server_image
    full_container = {
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        **container,
        "env": [*server_env(), *container.get("env", [])],
        "resources": pod.resources,
    }
    full_container["volumeMounts"] = [config_mount(), *container.get("volumeMounts", [])]
    pod_spec: dict[str, Any] = {
        "enableServiceLinks": False,
        # The image's non-root user; fsGroup makes emptyDir and PVC volumes writable for it.
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": c.SERVER_UID,
            "runAsGroup": c.SERVER_UID,
            "fsGroup": c.SERVER_UID,
        },
        "containers": [full_container],
        "volumes": [config_volume(cluster.ref.name), *volumes],
    }
    if init_containers:
        pod_spec["initContainers"] = [
            {"image": image, "imagePullPolicy": settings.image_pull_policy, **init} for init in init_containers
        ]
    if pod.node_selector:
        pod_spec["nodeSelector"] = pod.node_selector
    if pod.tolerations:
        pod_spec["tolerations"] = list(pod.tolerations)
    if affinity:
        pod_spec["affinity"] = affinity
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(cluster, name, component),
        "spec": {
            "serviceName": name,
            "replicas": pod.replicas,
            "selector": {"matchLabels": selector_labels(cluster.ref.name, component)},
            **(extra_spec or {}),
            "template": {
                "metadata": {
                    "labels": labels(cluster.ref.name, component),
                    "annotations": {
                        c.CONFIG_HASH_ANNOTATION: config_hash(cluster, settings, tokens),
                        **scrape_annotations(container),
                    },
                },
                "spec": pod_spec,
            },
        },
    }
