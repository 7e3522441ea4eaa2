"""Names, labels, owner references and quantities shared by every child of a CacheCluster."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from strata.contract.constants import auth_secret_name, data_token_key
from strata.operator import constants as c
from strata.operator.models import Cluster, ObjectRef

Manifest = dict[str, Any]

_BINARY = (("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
_DECIMAL = (("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3))


def master_name(cluster: str) -> str:
    return f"{cluster}-master"


def worker_name(cluster: str) -> str:
    return f"{cluster}-worker"


def journal_name(cluster: str) -> str:
    """The master's journal claim (spec.master.journal.volume.persistentVolumeClaim)."""
    return f"{cluster}-journal"


def config_name(cluster: str) -> str:
    return f"{cluster}-config"


def auth_name(cluster: str) -> str:
    return auth_secret_name(cluster)


@dataclass(frozen=True)
class SharedSecret:
    """A Secret in the operator's namespace where every cluster keeps keys of its own, each
    cluster applying only its keys under its own field manager (server-side apply then
    keeps every other cluster's)."""

    namespace: str
    name: str
    component: str  # its app.kubernetes.io/component label
    tag: str        # in each cluster's field manager name

    def entry(self, namespace: str, cluster: str, data: Mapping[str, str] | None) -> Manifest:
        """The Secret as one cluster's field manager applies it: with `data` (clear text, keys
        already named for the cluster), or (None) without, which removes the keys it set."""
        manifest: Manifest = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": self.name, "namespace": self.namespace,
                         "labels": {c.LABEL_NAME: c.APP_NAME, c.LABEL_COMPONENT: self.component,
                                    c.LABEL_MANAGED_BY: c.MANAGED_BY}},
            "type": "Opaque",
        }
        if data is not None:
            manifest["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        return manifest

    def manager(self, namespace: str, cluster: str) -> str:
        """The field manager of one cluster's keys."""
        digest = hashlib.sha256(data_token_key(namespace, cluster).encode()).hexdigest()[:20]
        return f"{c.FIELD_MANAGER}-{self.tag}-{digest}"


def csi_tokens(settings_namespace: str, secret: str) -> SharedSecret:
    """Every cluster's data token for the CSI node plugin, one key per cluster
    (contract/constants.py, data_token_key, names it)."""
    return SharedSecret(settings_namespace, secret, "csi-tokens", "csi")


def kept_tokens(settings_namespace: str, secret: str) -> SharedSecret:
    """The operator's own copy of every cluster's tokens (`<namespace>.<cluster>.<key>`), from
    which a deleted `<cluster>-auth` Secret is made again unchanged; only the operator reads it."""
    return SharedSecret(settings_namespace, secret, "cluster-tokens", "keys")


def kept_token_key(namespace: str, cluster: str, key: str) -> str:
    return f"{data_token_key(namespace, cluster)}.{key}"


def worker_pod_names(cluster: str, replicas: range) -> list[str]:
    """Pod names of the worker StatefulSet for the given ordinals."""
    return [f"{worker_name(cluster)}-{i}" for i in replicas]


def master_endpoint(cluster: str, namespace: str, cluster_domain: str = "") -> str:
    """host:port of the master: its StatefulSet pod's DNS name under the headless Service.
    The same name is used by workers, clients and the operator, inside and outside a cluster."""
    domain = f".{cluster_domain}" if cluster_domain else ""
    host = f"{master_name(cluster)}-0.{master_name(cluster)}.{namespace}.svc{domain}"
    return f"{host}:{c.MASTER_RPC_PORT}"


def selector_labels(cluster: str, component: str) -> dict[str, str]:
    """Labels that select one component's pods; never change them (selectors are immutable)."""
    return {c.LABEL_NAME: c.APP_NAME, c.LABEL_INSTANCE: cluster, c.LABEL_COMPONENT: component}


def labels(cluster: str, component: str) -> dict[str, str]:
    return {**selector_labels(cluster, component), c.LABEL_MANAGED_BY: c.MANAGED_BY}


def label_selector(cluster: str, component: str) -> str:
    """The selector as a string (status.workers.selector, for the scale subresource)."""
    return ",".join(f"{k}={v}" for k, v in selector_labels(cluster, component).items())


def owner_reference(owner: ObjectRef) -> dict[str, Any]:
    return {
        "apiVersion": owner.api_version,
        "kind": owner.kind,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(cluster: Cluster, name: str, component: str) -> dict[str, Any]:
    """metadata of a child: name, namespace, labels and the controller ownerReference."""
    return {
        "name": name,
        "namespace": cluster.ref.namespace,
        "labels": labels(cluster.ref.name, component),
        "ownerReferences": [owner_reference(cluster.ref)],
    }


def format_quantity(n: int) -> str:
    """Exact Kubernetes quantity for a byte count, as short as possible: 1Gi, 10G, 1500."""
    exact = [f"{n // f}{suffix}" for suffix, f in (*_BINARY, *_DECIMAL) if n and n % f == 0]
    return min(exact, key=len, default=str(n))


def approximate_quantity(n: int | float) -> str:
    """A short, human quantity for status (3.2Gi): changes only when the shown value does."""
    value = float(n)
    for suffix, factor in _BINARY:
        if value >= factor:
            shown = round(value / factor, 1)
            return f"{shown:g}{suffix}"
    return str(int(value))
