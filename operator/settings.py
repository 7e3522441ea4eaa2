"""What the operator process reads from its environment, one model per concern: how it builds
children and talks to masters (`OperatorSettings`, `STRATA_OPERATOR_*`), where it serves
/metrics (`MetricsSettings`, `STRATA_OPERATOR_METRICS_*`) and how it serves the locality
webhook (`WebhookSettings`, `STRATA_OPERATOR_WEBHOOK_*`). The chart sets them
(charts/strata/templates/operator-deployment.yaml); a bad value stops the operator with an error naming
the variable and the value."""

from __future__ import annotations

import posixpath
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from strata.contract.settings import EnvironmentSettings


def _default_image() -> str:
    try:
        return f"strata-server:{version('strata')}"
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "strata-server:latest"


class OperatorSettings(EnvironmentSettings):
    """How the operator builds children and talks to masters."""

    model_config = SettingsConfigDict(env_prefix="STRATA_OPERATOR_", frozen=True)

    # Image for clusters whose spec.image is empty; the chart sets it to the server image
    # it was released with, so operator and servers speak the same protocol.
    server_image: str = Field(default_factory=_default_image)
    # The imagePullPolicy of the children's containers: a tagged release image is pulled once.
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
    # Seconds a Mount whose store does not answer stays Pending (a store's hiccup) before it
    # is Failed (kstatus Stalled); it is tried again every `reconcile_interval` either way.
    store_patience: float = Field(default=120.0, ge=0)
    # Seconds a master's Report is reused by the Mounts of one cluster (one call, many Mounts).
    report_ttl: float = Field(default=5.0, ge=0)
    # Seconds to wait before re-checking a step that is not ready yet.
    retry_delay: float = Field(default=5.0, gt=0)
    # Seconds between checks of the pods held by the warm-up gate (strata.dev/warm): how late
    # a pod may start after its data is warm or its warmTimeout is up.
    warm_check_interval: float = Field(default=5.0, gt=0)
    # The operator's own namespace (the chart sets it from the pod): where the Secrets the
    # operator keeps for itself and the CSI node plugin live.
    namespace: str = ""
    # Name of the Secret in `namespace` that holds every cluster's data token for the CSI
    # node plugin (one key per cluster, see contract/constants.py); "" keeps none,
    # and volumes then need the token in their own secrets (nodePublishSecretRef).
    csi_tokens_secret: str = ""
    # Name of the Secret in `namespace` where the operator keeps its own copy of every
    # cluster's tokens, so a deleted `<cluster>-auth` comes back unchanged (no server rolls,
    # no volume loses its token); "" keeps none, and new tokens are made then.
    kept_tokens_secret: str = ""
    # The ClusterRole a namespace binds to the operator's ServiceAccount (`service_account`,
    # in `namespace`) to let it keep its clusters' token Secrets and read the Mounts'
    # credentials there; named in the message of a cluster the operator may not serve.
    tenant_role: str = ""
    service_account: str = ""
    # The node folder under which an SSD or HDD tier with no volume keeps its blocks:
    # <node_cache_root>/<ssd|hdd>/<namespace>/<worker pod>. It outlives the worker's pod, so a
    # rolling update or a restarted pod finds its blocks again (checked before use).
    node_cache_root: str = "/var/lib/strata/cache"

    @model_validator(mode="after")
    def _tokens_secret_has_a_namespace(self) -> OperatorSettings:
        for env, value in (("CSI_TOKENS_SECRET", self.csi_tokens_secret), ("KEPT_TOKENS_SECRET", self.kept_tokens_secret)):
            if value and not self.namespace:
                raise ValueError(f"STRATA_OPERATOR_{env} is set but STRATA_OPERATOR_NAMESPACE (the operator's "
                                 "own namespace, where that Secret lives) is not: set both")
        return self

    @field_validator("node_cache_root")
    @classmethod
    def _node_folder(cls, v: str) -> str:
        if not v.startswith("/") or posixpath.normpath(v) != v:
            raise ValueError(f"STRATA_OPERATOR_NODE_CACHE_ROOT must be an absolute, normalised path, got {v!r}")
        return v


class MetricsSettings(EnvironmentSettings):
    """Where the operator serves /metrics, from `STRATA_OPERATOR_METRICS_*`."""

    model_config = SettingsConfigDict(env_prefix="STRATA_OPERATOR_METRICS_", frozen=True)

    # 0: no metrics server (the default outside the chart, so two local runs never clash).
    port: int = Field(default=0, ge=0, lt=65536)
    # The address it listens on: every interface, so Prometheus reaches it at the pod's IP.
    bind: str = "0.0.0.0"


class WebhookSettings(EnvironmentSettings):
    """How the operator serves the webhook, from `STRATA_OPERATOR_WEBHOOK_*`."""

    model_config = SettingsConfigDict(env_prefix="STRATA_OPERATOR_WEBHOOK_", frozen=True)

    # Off unless asked for: serving needs the certificate the chart makes, and an operator
    # run from a laptop (`kopf run`) has no webhook configuration pointing at it.
    enabled: bool = False
    # TCP port of the HTTPS server (the chart's Service maps 443 to it); above 1024 so the
    # operator runs as non-root.
    port: int = Field(default=9443, gt=0, lt=65536)
    # Folder with tls.crt and tls.key: read from there (`files`), or written there (`operator`).
    cert_dir: Path = Path("/etc/strata/webhook")
    # Who keeps the certificate: the operator itself, or someone who puts files in cert_dir.
    certificate: Literal["operator", "files"] = "files"
    # With `operator`: the Secret (in the operator's namespace) that holds it, the webhook
    # Service it is for, and the MutatingWebhookConfiguration whose caBundle trusts it.
    secret: str = ""
    service: str = ""
    configuration: str = ""
    # Days a made certificate is valid, and how long before its end a new one is made; one
    # year and a month: renewals are rare, and a missed check has weeks to be retried.
    certificate_days: float = Field(default=365.0, gt=1)
    renew_before_days: float = Field(default=30.0, gt=0)
    # Seconds between checks of the certificate (renewal, or one renewed by another replica).
    check_interval: float = Field(default=3600.0, gt=0)

    @model_validator(mode="after")
    def _operator_certificate_is_placed(self) -> WebhookSettings:
        if self.enabled and self.certificate == "operator" and not (self.secret and self.service and self.configuration):
            raise ValueError("STRATA_OPERATOR_WEBHOOK_CERTIFICATE=operator needs STRATA_OPERATOR_WEBHOOK_SECRET, "
                             "_SERVICE and _CONFIGURATION (the chart sets them)")
        if self.renew_before_days >= self.certificate_days:
            raise ValueError(f"STRATA_OPERATOR_WEBHOOK_RENEW_BEFORE_DAYS ({self.renew_before_days:g}) must be less "
                             f"than STRATA_OPERATOR_WEBHOOK_CERTIFICATE_DAYS ({self.certificate_days:g})")
        return self
    # Seconds for reading a pod's Mounts and CacheClusters; kept under the webhook's
    # timeoutSeconds (chart default 5) so a slow API server ends in "no change" from us,
    # logged, instead of a timeout at the API server.
    lookup_timeout: float = Field(default=2.0, gt=0)
