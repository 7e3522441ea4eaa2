"""The operator's Prometheus endpoint: GET /metrics (process, Python, webhook metrics and
each Mount's phase) on `STRATA_OPERATOR_METRICS_PORT`, served from startup to cleanup."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import kopf
from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from strata.contract.httpserver import HttpServer
from strata.operator.constants import MountPhase
from strata.operator.settings import MetricsSettings


class MountPhases(Collector):
    """The phase each Mount's last reconcile left it in, as `strata_operator_mount_phase`
    (1 for its phase, 0 for the others: alerts ask for `phase="Failed"`). The Mount's
    namespace is `mount_namespace`: `namespace` is the scraped operator pod's.

    Only the replica that reconciles (the peering's leader) sees reconciles: a Mount it has
    not reconciled for `expiry` seconds (every Mount is reconciled at least each
    reconcile interval) is dropped, so a replica that stopped leading stops reporting, and
    the table holds the Mounts that exist."""

    PHASES = (MountPhase.PENDING, MountPhase.MOUNTED, MountPhase.FAILED, MountPhase.UNMOUNTING)

    def __init__(self, expiry: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._expiry = expiry
        self._clock = clock
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, str], tuple[str, float]] = {}

    def record(self, namespace: str, name: str, phase: str) -> None:
        with self._lock:
            self._phases[(namespace, name)] = (phase, self._clock())

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._phases.pop((namespace, name), None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self._clock()
        with self._lock:
            for key in [k for k, (_, at) in self._phases.items() if now - at > self._expiry]:
                del self._phases[key]
            phases = dict(self._phases)
        family = GaugeMetricFamily("strata_operator_mount_phase",
                                   "1 for the phase of each Mount this replica reconciles, 0 for the others",
                                   labels=["mount_namespace", "mount", "phase"])
        for (namespace, name), (phase, _) in sorted(phases.items()):
            for each in self.PHASES:
                family.add_metric([namespace, name, each], 1.0 if each == phase else 0.0)
        yield family


def metrics_registry() -> CollectorRegistry:
    """A registry with the process, platform and GC collectors; handlers add their own."""
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    return registry


def register(registry: kopf.OperatorRegistry, settings: MetricsSettings, metrics: CollectorRegistry) -> None:
    if not settings.port:
        return
    server = HttpServer(metrics, healthy=lambda: True)

    @kopf.on.startup(id="metrics-server", registry=registry)
    async def serve(**_: Any) -> None:
        await server.start(settings.bind, settings.port)

    @kopf.on.cleanup(id="metrics-server", registry=registry)
    async def stop(**_: Any) -> None:
        await server.stop()
