"""kopf handlers: thin functions that parse nothing themselves and call the reconcile steps.

`register(registry, settings)` adds them all to a kopf registry. One module per concern:
lifecycle (startup, cleanup, kopf settings), cluster, mount; the locality admission webhook
(issue 5) will be one more module registered here.
"""

from __future__ import annotations

import kopf

from strata.operator.handlers import cluster, lifecycle, mount
from strata.operator.settings import OperatorSettings


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    lifecycle.register(registry, settings)
    cluster.register(registry, settings)
    mount.register(registry, settings)
