"""Workers: a StatefulSet with one volume per tier, its headless Service and a PDB."""

from __future__ import annotations

from typing import Any

from strata.operator import constants as c
from strata.operator.builders.common import (
    Manifest,
    format_quantity,
    metadata,
    selector_labels,
    worker_name,
)
from strata.operator.builders.config import tier_dir
from strata.operator.builders.pods import headless_service, http_probes, ports, server_env, server_statefulset
from strata.operator.models import Cluster, ClusterTokens, TierSpec
from strata.operator.settings import OperatorSettings

SHORT_CIRCUIT_VOLUME = "short-circuit"
# Each worker keeps its own folder under a shared host path, so two workers (or two
# clusters) on one node never mix block files, and a restarted worker finds its own again.
_HOST_SUBPATH = "$(STRATA_POD_NAMESPACE)/$(STRATA_POD_NAME)"


def tier_volume_name(tier: TierSpec) -> str:
    return f"tier-{tier.medium.lower()}"


def tier_volume(tier: TierSpec) -> dict[str, Any]:
    """MEM: emptyDir in memory; SSD/HDD: the given hostPath or generic ephemeral volume,
    else a disk-backed emptyDir. Sizes equal the tier quota."""
    name = tier_volume_name(tier)
    quota = format_quantity(tier.quota)
    if tier.medium == "MEM":
        return {"name": name, "emptyDir": {"medium": "Memory", "sizeLimit": quota}}
    volume = tier.volume
    if volume is not None and volume.host_path is not None:
        return {"name": name, "hostPath": {"path": volume.host_path.path, "type": "DirectoryOrCreate"}}
    if volume is not None and volume.ephemeral is not None:
        claim: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": quota}},
        }
        if volume.ephemeral.storage_class_name is not None:
            claim["storageClassName"] = volume.ephemeral.storage_class_name
        return {"name": name, "ephemeral": {"volumeClaimTemplate": {"spec": claim}}}
    return {"name": name, "emptyDir": {"sizeLimit": quota}}


def tier_mount(tier: TierSpec) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": tier_volume_name(tier), "mountPath": tier_dir(tier)}
    if tier.volume is not None and tier.volume.host_path is not None:
        mount["subPathExpr"] = _HOST_SUBPATH
    return mount


def short_circuit_host_path(cluster: Cluster) -> str:
    """Node folder with the workers' domain sockets, for client pods and the CSI plugin."""
    return f"{c.SHORT_CIRCUIT_HOST_ROOT}/{cluster.ref.namespace}/{cluster.ref.name}"


def worker_affinity(cluster: Cluster) -> dict[str, Any]:
    """The user's affinity, plus a preference to spread workers over nodes unless the user
    set their own pod anti-affinity."""
    affinity = dict(cluster.spec.worker.affinity)
    if "podAntiAffinity" not in affinity:
        affinity["podAntiAffinity"] = {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {
                            "matchLabels": selector_labels(cluster.ref.name, c.COMPONENT_WORKER)
                        },
                    },
                }
            ]
        }
    return affinity


def build_worker_service(cluster: Cluster) -> Manifest:
    return headless_service(
        cluster, worker_name(cluster.ref.name), c.COMPONENT_WORKER,
        rpc=c.WORKER_RPC_PORT, http=c.WORKER_HTTP_PORT, data=c.WORKER_DATA_PORT,
    )


def build_worker_statefulset(cluster: Cluster, settings: OperatorSettings, tokens: ClusterTokens) -> Manifest:
    spec = cluster.spec
    volumes = [tier_volume(t) for t in spec.tiers]
    mounts = [tier_mount(t) for t in spec.tiers]
    if spec.short_circuit:
        volumes.append(
            {
                "name": SHORT_CIRCUIT_VOLUME,
                "hostPath": {"path": short_circuit_host_path(cluster), "type": "DirectoryOrCreate"},
            }
        )
        mounts.append({"name": SHORT_CIRCUIT_VOLUME, "mountPath": c.SHORT_CIRCUIT_DIR})
    # Readers on the node (client pods, the CSI plugin) see the socket folder at its host path.
    env = [{"name": "STRATA_SHORT_CIRCUIT_DIR", "value": short_circuit_host_path(cluster)}] if spec.short_circuit else []
    # Folders from the node (hostPath) come up owned by root: hand them to the server user.
    host_dirs = [m["mountPath"] for m in mounts if _is_host_path(m["name"], volumes)]
    init_containers = [
        {
            "name": "volume-permissions",
            "command": ["chown", f"{c.SERVER_UID}:{c.SERVER_UID}", *host_dirs],
            "securityContext": {"runAsUser": 0, "runAsNonRoot": False},
            # subPathExpr of the tier mounts reads the pod name and namespace from here.
            "env": server_env(),
            "volumeMounts": [m for m in mounts if m["mountPath"] in host_dirs],
        }
    ] if host_dirs else None
    container = {
        "name": c.COMPONENT_WORKER,
        "args": ["worker", "--config", f"{c.CONFIG_DIR}/{c.CONFIG_FILE}", "--data-dir", c.DATA_DIR],
        "ports": ports(rpc=c.WORKER_RPC_PORT, http=c.WORKER_HTTP_PORT, data=c.WORKER_DATA_PORT),
        "volumeMounts": mounts,
        "env": env,
        **http_probes("http"),
    }
    return server_statefulset(
        cluster,
        settings,
        name=worker_name(cluster.ref.name),
        component=c.COMPONENT_WORKER,
        pod=spec.worker,
        container=container,
        volumes=volumes,
        affinity=worker_affinity(cluster),
        tokens=tokens,
        # Workers do not depend on each other: start and stop them all at once.
        extra_spec={"podManagementPolicy": "Parallel"},
        init_containers=init_containers,
    )


def _is_host_path(volume_name: str, volumes: list[dict[str, Any]]) -> bool:
    return any(v["name"] == volume_name and "hostPath" in v for v in volumes)


def build_worker_pdb(cluster: Cluster) -> Manifest:
    """At most one worker voluntarily down at a time (drains, upgrades)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(cluster, worker_name(cluster.ref.name), c.COMPONENT_WORKER),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(cluster.ref.name, c.COMPONENT_WORKER)},
        },
    }
