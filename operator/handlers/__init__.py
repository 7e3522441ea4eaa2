"""kopf handlers: thin functions that parse nothing themselves and call the reconcile steps.

`register(registry, settings)` adds them all to a kopf registry. One module per concern:
lifecycle (startup, cleanup, kopf settings), cluster, mount, warmup (the pods the warm-up
gate holds), drain (cordoned nodes and evicted worker pods), admission (the locality
webhook and the warm-up gate it sets, on when STRATA_OPERATOR_WEBHOOK_ENABLED) and metrics
(/metrics, on when STRATA_OPERATOR_METRICS_PORT is set).
"""

from __future__ import annotations

import kopf

from strata.operator.handlers import admission, cluster, drain, lifecycle, metrics, mount, warmup
from strata.operator.settings import MetricsSettings, OperatorSettings, WebhookSettings


def register(
    registry: kopf.OperatorRegistry,
    settings: OperatorSettings,
    webhook: WebhookSettings | None = None,
    metrics_settings: MetricsSettings | None = None,
) -> None:
    """Add every handler; the webhook and metrics settings default to the environment's."""
    collectors = metrics.metrics_registry()
    lifecycle.register(registry, settings)
    cluster.register(registry, settings)
    # A Mount is reconciled at least every reconcile interval; a retry's call to the master
    # takes at most the RPC timeout.
    phases = metrics.MountPhases(expiry=3 * settings.reconcile_interval + settings.rpc_timeout)
    collectors.register(phases)
    mount.register(registry, settings, phases)
    warmup.register(registry, settings)
    drain.register(registry)
    admission.register(registry, webhook or WebhookSettings(), admission.AdmissionMetrics(collectors),
                       settings.namespace)
    metrics.register(registry, metrics_settings or MetricsSettings(), collectors)
