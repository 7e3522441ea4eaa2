"""Operator start and stop: kopf settings, the Kubernetes client and the master pool."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from strata.operator import constants as c
from strata.operator.kube import Kube
from strata.operator.master import Masters
from strata.operator.reconcile import Deps
from strata.operator.settings import OperatorSettings


def configure(kopf_settings: kopf.OperatorSettings) -> None:
    """kopf keeps its bookkeeping in strata.dev annotations (never in status, which the CRD
    schema would prune), uses our finalizer, and posts only warnings as Events."""
    kopf_settings.persistence.finalizer = c.FINALIZER
    kopf_settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.ANNOTATION_PREFIX)
    kopf_settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=c.ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    kopf_settings.posting.level = logging.WARNING
    kopf_settings.peering.stealth = True


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    operator_settings = settings  # kopf passes its own settings to startup as `settings`

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        """The same credentials the `kubernetes` client finds (service account or kubeconfig)."""
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(id="startup", registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        configure(settings)
        memo["kube"] = kube = await Kube.from_environment()
        memo["deps"] = Deps(
            kube=kube,
            masters=Masters(timeout=operator_settings.rpc_timeout, report_ttl=operator_settings.report_ttl),
            settings=operator_settings,
        )

    @kopf.on.cleanup(id="cleanup", registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        deps = memo.get("deps")
        if isinstance(deps, Deps):
            await deps.masters.close()
        kube = memo.get("kube")
        if isinstance(kube, Kube):
            await kube.close()
