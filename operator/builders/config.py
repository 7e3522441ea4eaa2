"""The ConfigMap with `strata.yaml` and the Secret with the cluster's tokens."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path, PurePosixPath

from strata.contract.config import ServerConfig, TierSettings
from strata.operator import constants as c
from strata.operator.builders.common import (
    Manifest,
    auth_name,
    config_name,
    master_endpoint,
    metadata,
)
from strata.operator.models import Cluster, ClusterTokens, TierSpec
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
            "localSources": {"allowedRoots": list(spec.local_sources.allowed_roots)},
        }
    )


def config_text(cluster: Cluster, settings: OperatorSettings) -> str:
    return server_config(cluster, settings).to_yaml()


def config_hash(cluster: Cluster, settings: OperatorSettings, tokens: ClusterTokens) -> str:
    """A short digest of strata.yaml and the tokens for the pod template: a changed config,
    or a new token (its Secret was deleted), rolls the pods so servers and clients agree."""
    digest = hashlib.sha256(config_text(cluster, settings).encode())
    for token in token_items(tokens).values():
        digest.update(b"\0" + token.encode())
    return digest.hexdigest()[:16]


def token_items(tokens: ClusterTokens) -> dict[str, str]:
    """The Secret's keys and their tokens."""
    return {c.TOKEN_KEY: tokens.admin, c.DATA_TOKEN_KEY: tokens.data, c.INTERNAL_TOKEN_KEY: tokens.internal}


def build_config_map(cluster: Cluster, settings: OperatorSettings) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(cluster, config_name(cluster.ref.name), "config"),
        "data": {c.CONFIG_FILE: config_text(cluster, settings)},
    }


def build_auth_secret(cluster: Cluster, tokens: ClusterTokens) -> Manifest:
    """The Secret holding the tokens RPCs carry. The caller keeps existing tokens: a new one
    would lock running clients out."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(cluster, auth_name(cluster.ref.name), "auth"),
        "type": "Opaque",
        "data": {key: base64.b64encode(token.encode()).decode() for key, token in token_items(tokens).items()},
    }
