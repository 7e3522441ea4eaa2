"""Keep the locality webhook's certificate: every operator replica serves the webhook with the
certificate of one Secret in the operator's namespace, which the first replica makes and any
replica renews before it expires, and the webhook configuration's caBundle trusts its CA.

Nothing secret is installed with the operator: the key is made here, in the cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from strata.operator.builders.certificate import (
    WebhookCertificate,
    ca_bundle_patch,
    certificate_of,
    certificate_secret,
    make_certificate,
    renewal_reason,
)
from strata.operator.kube import KubeAPI

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CertificatePlace:
    """Where the certificate lives and whom it serves."""

    namespace: str      # the operator's own namespace
    secret: str         # the Secret holding ca.crt, tls.crt and tls.key
    service: str        # the webhook Service (the certificate's DNS names)
    configuration: str  # the MutatingWebhookConfiguration whose caBundle trusts it
    webhook: str        # the webhook's name in that configuration
    validity: timedelta
    renew_before: timedelta


async def ensure_certificate(kube: KubeAPI, place: CertificatePlace, now: Callable[[], datetime]) -> WebhookCertificate:
    """The certificate to serve: the Secret's when it is good for more than `renew_before`,
    else a new one (created, or replacing the old). The caBundle is applied every time (a
    no-op when it is current), so a configuration re-installed without it is trusted again."""
    stored = certificate_of(await kube.get("v1", "Secret", place.namespace, place.secret))
    reason = "there is none" if stored is None else renewal_reason(
        stored, place.service, place.namespace, now(), place.renew_before)
    certificate = stored
    if reason is not None or certificate is None:
        fresh = make_certificate(place.service, place.namespace, now(), place.validity, previous=stored)
        secret = certificate_secret(fresh, place.secret, place.namespace)
        if stored is None:
            made = await kube.create(secret)
            # Another replica made it first: serve that one, so every replica serves one certificate.
            certificate = fresh if made is not None else certificate_of(
                await kube.get("v1", "Secret", place.namespace, place.secret))
        else:
            await kube.apply(secret)
            certificate = fresh
        if certificate is None:
            raise RuntimeError(f"the webhook certificate Secret {place.namespace}/{place.secret} could not be read "
                               "back after it was made")
        log.info("made a webhook certificate for %s.%s.svc in Secret %s: the old one %s", place.service,
                 place.namespace, place.secret, reason)
    await kube.apply(ca_bundle_patch(place.configuration, place.webhook, certificate.ca_bundle))
    return certificate
