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
from strata.operator.builders.pods import (
    HOST_SUBPATH,
    headless_service,
    host_path_permissions,
    http_probes,
    ports,
    server_statefulset,
)
from strata.operator.models import Cluster, ClusterTokens, TierSpec
from strata.operator.settings import OperatorSettings

SHORT_CIRCUIT_VOLUME = "short-circuit"
STAGING_VOLUME = "staging"
# The staging folder beside a hostPath tier's folder of the same worker.
_STAGING_SUBPATH = f"{HOST_SUBPATH}-staging"


def tier_volume_name(tier: TierSpec) -> str:
    return f"tier-{tier.medium.lower()}"


def node_folder(tier: TierSpec, settings: OperatorSettings) -> str | None:
    """The node folder holding a tier's workers' sub-folders (<namespace>/<pod>), or None
    for a tier kept on a volume of the pod's own (MEM, emptyDir, ephemeral). An SSD or
    HDD tier with no volume is on `settings.node_cache_root`: its blocks outlive the pod."""
    if tier.medium == "MEM":
        return None
    volume = tier.volume
    if volume is None:
        return f"{settings.node_cache_root}/{tier.medium.lower()}"
    return volume.host_path.path if volume.host_path is not None else None


def tier_volume(tier: TierSpec, settings: OperatorSettings) -> dict[str, Any]:
    """MEM: emptyDir in memory; SSD/HDD: a node folder (the given hostPath, or one under
    `settings.node_cache_root` when no volume is given), a generic ephemeral volume or a
    disk-backed emptyDir. Sizes equal the tier quota."""
    name = tier_volume_name(tier)
    quota = format_quantity(tier.quota)
    if tier.medium == "MEM":
        return {"name": name, "emptyDir": {"medium": "Memory", "sizeLimit": quota}}
    folder = node_folder(tier, settings)
    if folder is not None:
        return {"name": name, "hostPath": {"path": folder, "type": "DirectoryOrCreate"}}
    volume = tier.volume
    if volume is not None and volume.ephemeral is not None:
        claim: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": quota}},
        }
        if volume.ephemeral.storage_class_name is not None:
            claim["storageClassName"] = volume.ephemeral.storage_class_name
        return {"name": name, "ephemeral": {"volumeClaimTemplate": {"spec": claim}}}
    return {"name": name, "emptyDir": {"sizeLimit": quota}}


def tier_mount(tier: TierSpec, settings: OperatorSettings) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": tier_volume_name(tier), "mountPath": tier_dir(tier)}
    if node_folder(tier, settings) is not None:
        mount["subPathExpr"] = HOST_SUBPATH
    return mount


def staging_volume(cluster: Cluster, settings: OperatorSettings) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The worker's staging folder (staged writes, records of ASYNC_THROUGH uploads): the
    volumes it needs and its mount. Its copies must outlive what the blocks of their writes
    outlive. A disk tier on a node folder outlives the pod: the folder is a sibling of that
    tier's folder on the node. Otherwise (emptyDir or ephemeral disk tiers, MEM alone) the
    blocks live as long as the pod, and so does an emptyDir of its own, which also survives
    a restart of the container (its writable layer does not); not on the tier's volume,
    whose size limit is the tier's quota."""
    for tier in cluster.spec.tiers:
        if node_folder(tier, settings) is not None:
            return [], {"name": tier_volume_name(tier), "mountPath": c.STAGING_DIR, "subPathExpr": _STAGING_SUBPATH}
    return [{"name": STAGING_VOLUME, "emptyDir": {}}], {"name": STAGING_VOLUME, "mountPath": c.STAGING_DIR}


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
    staging, staging_mount = staging_volume(cluster, settings)
    volumes = [*(tier_volume(t, settings) for t in spec.tiers), *staging]
    mounts = [*(tier_mount(t, settings) for t in spec.tiers), staging_mount]
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
        # Folders from the node (hostPath) come up owned by root: hand them to the server user.
        init_containers=host_path_permissions(volumes, mounts),
    )


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
