"""The operator's Prometheus endpoint: GET /metrics (process, Python and webhook metrics)
on `STRATA_OPERATOR_METRICS_PORT`, served from startup to cleanup."""

from __future__ import annotations

from typing import Any

import kopf
from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from strata.contract.httpserver import HttpServer


class MetricsSettings(BaseSettings):
    """Where the operator serves /metrics, from `STRATA_OPERATOR_METRICS_*`."""

    model_config = SettingsConfigDict(env_prefix="STRATA_OPERATOR_METRICS_", frozen=True)

    # 0: no metrics server (the default outside the chart, so two local runs never clash).
    port: int = Field(default=0, ge=0, lt=65536)
    bind: str = "0.0.0.0"


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
