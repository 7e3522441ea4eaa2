"""Run the operator with kopf (`strata-operator run` calls `run`, operator/cli.py)."""

from __future__ import annotations

import asyncio
import logging
import random

import kopf

from strata.operator.handlers import register
from strata.operator.settings import OperatorSettings

log = logging.getLogger(__name__)


def build_registry(settings: OperatorSettings) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    register(registry, settings)
    return registry


def peering_priority() -> int:
    """kopf pauses every operator that sees a peer of higher *or equal* priority, so each
    replica draws its own: the highest acts, the others wait and take over when it stops
    renewing its lease (kopf's peering lifetime, 60 s)."""
    return random.SystemRandom().randint(1, 2**31 - 1)


def run(
    *,
    namespaces: list[str],
    all_namespaces: bool,
    liveness_endpoint: str | None,
    peering: str | None,
    standalone: bool,
) -> None:
    """Run the operator until it is stopped (SIGINT/SIGTERM).

    namespaces / all_namespaces: what to watch (one of them). liveness_endpoint: e.g.
    http://0.0.0.0:8080/healthz. peering: name of the KopfPeering (or ClusterKopfPeering when
    all_namespaces) object used for leader election; required unless standalone.
    """
    if bool(namespaces) == all_namespaces:
        raise ValueError("watch either some namespaces or all of them: pass namespaces or all_namespaces")
    if not standalone and not peering:
        raise ValueError("name a peering object for leader election, or run standalone")
    kopf.configure(log_format=kopf.LogFormat.JSON, log_prefix=False)
    # Probes hit the liveness endpoint every few seconds: keep them out of the log.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    settings = OperatorSettings()
    log.info("starting strata operator: namespaces=%s all=%s peering=%s", namespaces, all_namespaces, peering)
    asyncio.run(
        kopf.operator(
            registry=build_registry(settings),
            clusterwide=all_namespaces,
            namespaces=namespaces,
            liveness_endpoint=liveness_endpoint,
            peering_name=peering,
            standalone=standalone,
            priority=peering_priority(),
        )
    )
