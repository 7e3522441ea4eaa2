"""The locality admission webhook: kopf serves it, strata.operator.locality decides.

The chart owns the MutatingWebhookConfiguration (path `/locality`, failurePolicy Ignore). The
TLS certificate is the operator's own (`certificate: operator`, the chart's default: made at
the first start, kept in a Secret of the operator's namespace, renewed before it expires, its
CA put in the configuration's caBundle; strata.operator.reconcile.webhook), or files someone
else keeps in `cert_dir` (`certificate: files`, e.g. cert-manager's). The handler never fails
a pod: every error, slow API read or missing object ends in "no change" (a denial from here
would block the pod, which failurePolicy Ignore does not cover). A pod without a Strata volume costs no API call.
The same handler adds the warm-up scheduling gate (strata.operator.warmup) to a pod whose
Strata volume asks for it; that needs no API call either.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import kopf
from prometheus_client import CollectorRegistry, Counter, Histogram

from strata.operator import constants as c
from strata.operator.builders.certificate import CERT_FILE, KEY_FILE, WebhookCertificate
from strata.operator.handlers.common import deps_of
from strata.operator.kube import KubeAPI, KubeError
from strata.operator.locality import (
    APPLIED_ANNOTATION,
    Decision,
    MountRef,
    Source,
    cluster_of,
    decide,
    mounts_of,
)
from strata.operator.reconcile.common import utcnow
from strata.operator.reconcile.webhook import CertificatePlace, ensure_certificate
from strata.operator.settings import WebhookSettings
from strata.operator.warmup import WARM_GATE, gate_for

log = logging.getLogger(__name__)

# kopf serves a handler at /<id>: the chart's webhook clientConfig.service.path is "/locality".
HANDLER_ID: Final = "locality"
# The webhook's name in the chart's MutatingWebhookConfiguration.
WEBHOOK_NAME: Final = "locality.strata.dev"


class AdmissionMetrics:
    """What the webhook counts, on the operator's metrics registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.reviews = Counter(
            "strata_operator_locality_reviews", "Pod admissions reviewed by the locality webhook, by result "
            "(placed, unchanged: Strata volumes but nothing to add, skipped: no Strata volume, failed).",
            ["result"], registry=registry,
        )
        self.seconds = Histogram(
            "strata_operator_locality_review_seconds", "Time to review a pod that uses Strata volumes.",
            registry=registry, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        )


async def read_sources(kube: KubeAPI, refs: Sequence[MountRef]) -> list[Source]:
    """Each Mount and its CacheCluster (None where absent or not readable, e.g. a namespace
    the operator may not read)."""

    async def get(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await kube.get(c.API_VERSION, kind, namespace, name)
        except KubeError as exc:
            if exc.status != 403:
                raise
            log.info("cannot read %s %s/%s for locality: %s", kind, namespace, name, exc)
            return None

    mounts = await asyncio.gather(*(get(c.MOUNT_KIND, r.namespace, r.name) for r in refs))
    wanted = {(r.namespace, name) for r, m in zip(refs, mounts) if m is not None and (name := cluster_of(m))}
    keys = sorted(wanted)
    found = await asyncio.gather(*(get(c.CACHE_CLUSTER_KIND, ns, name) for ns, name in keys))
    clusters: Mapping[tuple[str, str], dict[str, Any] | None] = dict(zip(keys, found))
    return [
        Source(ref, mount, clusters.get((ref.namespace, cluster_of(mount) or "")) if mount is not None else None)
        for ref, mount in zip(refs, mounts)
    ]


async def review(kube: KubeAPI, pod: Mapping[str, Any], timeout: float) -> Decision:
    """The decision for one pod: read what its Strata volumes name, then decide."""
    refs = mounts_of(pod)
    if not refs:
        return Decision()
    async with asyncio.timeout(timeout):
        sources = await read_sources(kube, refs)
    return decide(pod, sources)


def apply_decision(decision: Decision, patch: kopf.Patch) -> None:
    """Record the decision in kopf's patch (kopf turns it into the JSON patch it answers)."""
    if decision.affinity is None:
        return
    patch.spec["affinity"] = decision.affinity
    patch.metadata.annotations[APPLIED_ANNOTATION] = decision.mode


def certificate_place(settings: WebhookSettings, namespace: str) -> CertificatePlace:
    return CertificatePlace(
        namespace=namespace, secret=settings.secret, service=settings.service,
        configuration=settings.configuration, webhook=WEBHOOK_NAME,
        validity=timedelta(days=settings.certificate_days), renew_before=timedelta(days=settings.renew_before_days),
    )


def write_certificate(certificate: WebhookCertificate, folder: Path) -> None:
    """tls.crt and tls.key (owner-only) in `folder`, replaced whole (a reader sees old or new)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in ((CERT_FILE, certificate.cert), (KEY_FILE, certificate.key)):
        part = folder / f".{name}.new"
        part.write_bytes(data)
        part.chmod(0o600)
        part.replace(folder / name)


async def keep_certificate(kube: KubeAPI, place: CertificatePlace, settings: WebhookSettings,
                           context: ssl.SSLContext, served: WebhookCertificate) -> None:
    """Check the certificate every `check_interval`; load a new one (renewed here or by another
    replica) into the server's SSL context, which new connections then use."""
    while True:
        await asyncio.sleep(settings.check_interval)
        try:
            current = await ensure_certificate(kube, place, utcnow)
        except Exception as exc:  # noqa: BLE001 - keep serving the current one; retry next time
            log.warning("cannot check the webhook certificate (serving the current one): %s", exc)
            continue
        if current != served:
            write_certificate(current, settings.cert_dir)
            context.load_cert_chain(str(settings.cert_dir / CERT_FILE), str(settings.cert_dir / KEY_FILE))
            served = current
            log.info("serving the webhook with a new certificate")


def register(registry: kopf.OperatorRegistry, settings: WebhookSettings, metrics: AdmissionMetrics,
             namespace: str = "") -> None:
    """Serve the webhook (when enabled) and register the pod handler; `namespace` is the
    operator's own (where its certificate Secret lives)."""
    webhook_settings = settings  # kopf passes its own settings to startup as `settings`
    if not webhook_settings.enabled:
        return

    @kopf.on.startup(id="webhook-server", registry=registry)
    async def serve(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        if webhook_settings.certificate == "files":
            settings.admission.server = webhook_server(webhook_settings)
            return
        if not namespace:
            raise kopf.PermanentError("the webhook certificate is the operator's own but the operator's namespace "
                                      "is unknown: set STRATA_OPERATOR_NAMESPACE")
        kube = deps_of(memo).kube
        place = certificate_place(webhook_settings, namespace)
        certificate = await ensure_certificate(kube, place, utcnow)
        write_certificate(certificate, webhook_settings.cert_dir)
        context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
        settings.admission.server = webhook_server(webhook_settings, context)
        memo["webhook_certificate"] = asyncio.create_task(
            keep_certificate(kube, place, webhook_settings, context, certificate), name="webhook-certificate")

    @kopf.on.cleanup(id="webhook-certificate", registry=registry)
    async def stop_keeping(memo: kopf.Memo, **_: Any) -> None:
        task = memo.get("webhook_certificate")
        if isinstance(task, asyncio.Task):
            task.cancel()

    @kopf.on.mutate("", "v1", "pods", id=HANDLER_ID, operations=["CREATE"], ignore_failures=True,
                    side_effects=False, registry=registry)
    async def locality(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, warnings: list[str],
                       operation: str | None = None, **_: Any) -> None:
        """Add affinity to the nodes holding the pod's data, and the warm-up gate when a volume
        asks for it (strata.operator.warmup); never refuse the pod."""
        # kopf filters by `operations` only in webhook configurations it manages itself.
        if operation != "CREATE" or not mounts_of(body):
            metrics.reviews.labels("skipped").inc()
            return
        started = time.monotonic()
        name = body.metadata.name or body.metadata.get("generateName", "")
        gates, gate_notes = gate_for(body)
        warnings.extend(gate_notes)
        if gates is not None:
            patch.spec["schedulingGates"] = gates
            log.info("pod %s/%s: held by %s until its data is cached", body.metadata.namespace, name, WARM_GATE)
        try:
            decision = await review(deps_of(memo).kube, body, webhook_settings.lookup_timeout)
        except Exception as exc:  # noqa: BLE001 - a failed lookup must not block the pod
            log.warning("locality of pod %s/%s not set: %s", body.metadata.namespace, name, exc or type(exc).__name__)
            metrics.reviews.labels("failed").inc()
            return
        finally:
            metrics.seconds.observe(time.monotonic() - started)
        warnings.extend(decision.notes)
        apply_decision(decision, patch)
        if decision.affinity is None:
            metrics.reviews.labels("unchanged").inc()
            return
        metrics.reviews.labels("placed").inc()
        log.info("pod %s/%s: locality %s, nodes %s", body.metadata.namespace, name, decision.mode,
                 ", ".join(decision.nodes) or "(the cluster's workers)")


def webhook_server(settings: WebhookSettings, context: ssl.SSLContext | None = None) -> kopf.WebhookServer:
    """kopf's HTTPS server on all interfaces with the certificate files in cert_dir, loaded
    into `context` when given (which a renewal then reloads)."""
    certfile, keyfile = settings.cert_dir / CERT_FILE, settings.cert_dir / KEY_FILE
    for path in (certfile, keyfile):
        if not path.is_file():
            raise kopf.PermanentError(
                f"webhook certificate file {path} is missing: mount the webhook TLS Secret at "
                f"{settings.cert_dir} or set STRATA_OPERATOR_WEBHOOK_ENABLED=false")
    return kopf.WebhookServer(port=settings.port, certfile=str(certfile), pkeyfile=str(keyfile), context=context)
