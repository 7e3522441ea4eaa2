"""The master: a one-pod StatefulSet, its headless Service, and the claim of its journal."""

from __future__ import annotations

from typing import Any

from strata.operator import constants as c
from strata.operator.builders.common import Manifest, format_quantity, journal_name, master_name, metadata
from strata.operator.builders.pods import (
    HOST_SUBPATH,
    headless_service,
    host_path_permissions,
    http_probes,
    ports,
    server_statefulset,
)
from strata.operator.models import Cluster, ClusterTokens
from strata.operator.settings import OperatorSettings

JOURNAL_VOLUME = "journal"


def build_master_service(cluster: Cluster) -> Manifest:
    return headless_service(
        cluster, master_name(cluster.ref.name), c.COMPONENT_MASTER, rpc=c.MASTER_RPC_PORT, http=c.MASTER_HTTP_PORT
    )


def build_journal_claim(cluster: Cluster) -> Manifest | None:
    """The PersistentVolumeClaim of the master's journal, when it lives on one (None
    otherwise). The operator makes it rather than a volumeClaimTemplate of the StatefulSet:
    a StatefulSet's claim templates can never change, so a cluster made before its journal
    had a claim, or one whose claim must name a StorageClass after the fact (the cluster has
    no default), could not get one without deleting its StatefulSet. Owned by the
    CacheCluster: deleted with it, never with a pod."""
    claim = cluster.spec.master.journal.volume.persistent_volume_claim
    if claim is None:
        return None
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": format_quantity(claim.size)}},
    }
    if claim.storage_class_name is not None:
        spec["storageClassName"] = claim.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(cluster, journal_name(cluster.ref.name), c.COMPONENT_JOURNAL),
        "spec": spec,
    }


def journal_volume(cluster: Cluster) -> tuple[dict[str, Any], dict[str, Any]]:
    """The journal's volume and its mount in the master container."""
    volume = cluster.spec.master.journal.volume
    mount: dict[str, Any] = {"name": JOURNAL_VOLUME, "mountPath": c.JOURNAL_DIR}
    if volume.persistent_volume_claim is not None:
        return {"name": JOURNAL_VOLUME, "persistentVolumeClaim": {"claimName": journal_name(cluster.ref.name)}}, mount
    if volume.host_path is not None:
        host = {"name": JOURNAL_VOLUME, "hostPath": {"path": volume.host_path.path, "type": "DirectoryOrCreate"}}
        return host, {**mount, "subPathExpr": HOST_SUBPATH}
    return {"name": JOURNAL_VOLUME, "emptyDir": {}}, mount


def build_master_statefulset(cluster: Cluster, settings: OperatorSettings, tokens: ClusterTokens) -> Manifest:
    """The journal lives where spec.master.journal says: a claim (the default) or a node
    folder keep it when the pod is replaced; an emptyDir only while the pod lives."""
    master = cluster.spec.master
    volume, mount = journal_volume(cluster)
    container = {
        "name": c.COMPONENT_MASTER,
        "args": ["master", "--config", f"{c.CONFIG_DIR}/{c.CONFIG_FILE}", "--journal-dir", c.JOURNAL_DIR],
        "ports": ports(rpc=c.MASTER_RPC_PORT, http=c.MASTER_HTTP_PORT),
        "volumeMounts": [mount],
        **http_probes("http"),
    }
    return server_statefulset(
        cluster,
        settings,
        name=master_name(cluster.ref.name),
        component=c.COMPONENT_MASTER,
        pod=master,
        container=container,
        volumes=[volume],
        affinity=master.affinity,
        tokens=tokens,
        init_containers=host_path_permissions([volume], [mount]),
    )
