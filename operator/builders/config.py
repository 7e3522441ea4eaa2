"""The ConfigMap with `strata.yaml` and the Secret with the cluster token."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path, PurePosixPath

from strata.cacheserver.config import ServerConfig, TierSettings
from strata.operator import constants as c
from strata.operator.builders.common import (
    Manifest,
    auth_name,
    config_name,
    master_endpoint,
    metadata,
)
from strata.operator.models import Cluster, TierSpec
from strata.operator.settings import OperatorSettings


def tier_dir(tier: TierSpec) -> str:
    """Where a tier's volume is mounted in the worker container (and its dir in strata.yaml)."""
    return str(PurePosixPath(c.TIERS_DIR) / tier.medium.lower())


def server_config(cluster: Cluster, settings: OperatorSettings) -> ServerConfig:
    """The servers' settings for this cluster: the same model the servers read."""
    spec = cluster.spec
    return ServerConfig.model_validate(
        {
            "blockSize": spec.block_size,
            "masterAddress": master_endpoint(
                cluster.ref.name, cluster.ref.namespace, settings.cluster_domain
            ),
            "tiers": [
                TierSettings(medium=t.medium, quota=t.quota, dirs=(Path(tier_dir(t)),))
                for t in spec.tiers
            ],
            "cachePolicy": spec.cache_policy,
            "shortCircuit": spec.short_circuit,
        }
    )


def config_text(cluster: Cluster, settings: OperatorSettings) -> str:
    return server_config(cluster, settings).to_yaml()


def config_hash(cluster: Cluster, settings: OperatorSettings, token: str) -> str:
    """A short digest of strata.yaml and the token for the pod template: a changed config,
    or a new token (its Secret was deleted), rolls the pods so servers and clients agree."""
    digest = hashlib.sha256(config_text(cluster, settings).encode())
    digest.update(b"\0" + token.encode())
    return digest.hexdigest()[:16]


def build_config_map(cluster: Cluster, settings: OperatorSettings) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(cluster, config_name(cluster.ref.name), "config"),
        "data": {c.CONFIG_FILE: config_text(cluster, settings)},
    }


def build_auth_secret(cluster: Cluster, token: str) -> Manifest:
    """The Secret holding the token every RPC carries. The caller keeps an existing token:
    a new one would lock running clients out."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(cluster, auth_name(cluster.ref.name), "auth"),
        "type": "Opaque",
        "data": {c.TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }
