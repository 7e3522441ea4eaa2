"""The operator's own settings, read from `STRATA_OPERATOR_*` environment variables."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_image() -> str:
    try:
        return f"strata-server:{version('strata')}"
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "strata-server:latest"


class OperatorSettings(BaseSettings):
    """How the operator builds children and talks to masters."""

    model_config = SettingsConfigDict(env_prefix="STRATA_OPERATOR_", frozen=True)

    # Image for clusters whose spec.image is empty; the chart sets it to the server image
    # it was released with, so operator and servers speak the same protocol.
    server_image: str = Field(default_factory=_default_image)
    image_pull_policy: str = "IfNotPresent"
    # "" -> masters are addressed as <pod>.<svc>.<ns>.svc, which resolves in every cluster;
    # set e.g. cluster.local only where the search path does not cover `.svc`.
    cluster_domain: str = ""
    # Seconds between re-applying children and refreshing status: a deleted or edited child
    # comes back, and status follows the cluster, within this (plus one reconcile).
    reconcile_interval: float = Field(default=30.0, gt=0)
    # Seconds to wait for one master RPC; a slow master must not stall the whole operator.
    rpc_timeout: float = Field(default=10.0, gt=0)
    # Seconds after a Mount's deletion to keep trying to unmount it before the finalizer
    # is removed anyway (the cluster or its master may be gone for good).
    unmount_timeout: float = Field(default=60.0, ge=0)
    # Seconds a master's Report is reused by the Mounts of one cluster (one call, many Mounts).
    report_ttl: float = Field(default=5.0, ge=0)
    # Seconds to wait before re-checking a step that is not ready yet.
    retry_delay: float = Field(default=5.0, gt=0)
