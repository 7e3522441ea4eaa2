"""Pure builders: a parsed CacheCluster in, Kubernetes manifests (dicts) out. No I/O."""

from __future__ import annotations

from strata.operator.builders.common import Manifest
from strata.operator.builders.config import build_auth_secret, build_config_map
from strata.operator.builders.master import build_journal_claim, build_master_service, build_master_statefulset
from strata.operator.builders.worker import (
    build_worker_pdb,
    build_worker_service,
    build_worker_statefulset,
)
from strata.operator.models import Cluster, ClusterTokens
from strata.operator.settings import OperatorSettings

__all__ = [
    "Manifest",
    "build_auth_secret",
    "build_config_map",
    "build_journal_claim",
    "build_master_service",
    "build_master_statefulset",
    "build_worker_pdb",
    "build_worker_service",
    "build_worker_statefulset",
    "build_master_children",
    "build_worker_children",
]


def build_master_children(cluster: Cluster, settings: OperatorSettings, tokens: ClusterTokens) -> list[Manifest]:
    """Everything the master step applies, in apply order."""
    claim = build_journal_claim(cluster)
    return [
        build_config_map(cluster, settings),
        build_auth_secret(cluster, tokens),
        build_master_service(cluster),
        *([claim] if claim is not None else []),
        build_master_statefulset(cluster, settings, tokens),
    ]


def build_worker_children(cluster: Cluster, settings: OperatorSettings, tokens: ClusterTokens) -> list[Manifest]:
    """Everything the worker step applies, in apply order."""
    return [
        build_worker_service(cluster),
        build_worker_statefulset(cluster, settings, tokens),
        build_worker_pdb(cluster),
    ]
