"""The webhook certificate the operator makes itself: one per install, shared by the replicas
through a Secret, trusted by the caBundle, renewed before it expires."""

from __future__ import annotations

import base64
from datetime import timedelta

from cryptography import x509

from strata.operator.builders.certificate import certificate_of, make_certificate, renewal_reason
from strata.operator.handlers.admission import certificate_place
from strata.operator.reconcile.webhook import ensure_certificate
from strata.operator.settings import WebhookSettings
from tests.unit.operator.conftest import World

SETTINGS = WebhookSettings(enabled=True, certificate="operator", secret="strata-webhook-tls",
                           service="strata-webhook", configuration="strata-locality")
PLACE = certificate_place(SETTINGS, "strata-system")


def ca_bundle(world: World) -> list[x509.Certificate]:
    config = world.kube.obj("MutatingWebhookConfiguration", "strata-locality", "")
    (hook,) = config["webhooks"]
    assert hook["name"] == "locality.strata.dev"
    return x509.load_pem_x509_certificates(base64.b64decode(hook["clientConfig"]["caBundle"]))


def test_a_certificate_serves_the_webhook_service_and_is_signed_by_its_ca(world: World) -> None:
    made = make_certificate("strata-webhook", "strata-system", world.clock(), timedelta(days=365))
    cert = x509.load_pem_x509_certificate(made.cert)
    (ca,) = x509.load_pem_x509_certificates(made.ca_bundle)
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "strata-webhook.strata-system.svc" in sans
    assert renewal_reason(made, "strata-webhook", "strata-system", world.clock(), timedelta(days=30)) is None
    assert "other" in (renewal_reason(made, "other", "strata-system", world.clock(), timedelta(days=30)) or "")
    assert "expires" in (renewal_reason(made, "strata-webhook", "strata-system", world.clock() + timedelta(days=340),
                                        timedelta(days=30)) or "")
    # Its repr (a log line, an error) never shows the key: no field of that name, none of its
    # PEM (the certificates' base64 may spell "key" by chance).
    shown = repr(made)
    assert "key=" not in shown and "PRIVATE KEY" not in shown
    assert not any(line in shown for line in made.key.decode().splitlines()[1:-1])
    # Two makes never share a key.
    assert make_certificate("strata-webhook", "strata-system", world.clock(), timedelta(days=365)).key != made.key


async def test_the_first_start_makes_it_and_later_starts_keep_it(world: World) -> None:
    first = await ensure_certificate(world.kube, PLACE, world.clock)
    stored = certificate_of(world.kube.obj("Secret", "strata-webhook-tls", "strata-system"))
    assert stored == first
    x509.load_pem_x509_certificate(first.cert).verify_directly_issued_by(ca_bundle(world)[0])
    # Another replica, or a restart: the same certificate.
    assert await ensure_certificate(world.kube, PLACE, world.clock) == first


async def test_a_replica_that_lost_the_race_serves_the_winners_certificate(world: World) -> None:
    winner = await ensure_certificate(world.kube, PLACE, world.clock)
    real_get = world.kube.get
    calls = 0

    async def get_nothing_first(*args: str) -> dict[str, object] | None:
        nonlocal calls
        calls += 1
        return None if calls == 1 else await real_get(*args)

    world.kube.get = get_nothing_first  # type: ignore[method-assign]
    assert await ensure_certificate(world.kube, PLACE, world.clock) == winner


async def test_a_certificate_is_renewed_before_it_expires_and_the_old_ca_stays_trusted(world: World) -> None:
    old = await ensure_certificate(world.kube, PLACE, world.clock)
    world.clock.now += PLACE.validity - PLACE.renew_before + timedelta(hours=1)
    new = await ensure_certificate(world.kube, PLACE, world.clock)
    assert new != old and new.key != old.key
    assert certificate_of(world.kube.obj("Secret", "strata-webhook-tls", "strata-system")) == new
    trusted = ca_bundle(world)
    x509.load_pem_x509_certificate(new.cert).verify_directly_issued_by(trusted[0])
    x509.load_pem_x509_certificate(old.cert).verify_directly_issued_by(trusted[1])


async def test_a_broken_secret_is_replaced(world: World) -> None:
    await ensure_certificate(world.kube, PLACE, world.clock)
    for key in ("tls.crt", "ca.crt"):
        world.kube.obj("Secret", "strata-webhook-tls", "strata-system")["data"][key] = base64.b64encode(
            b"-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n").decode()
        fixed = await ensure_certificate(world.kube, PLACE, world.clock)
        assert renewal_reason(fixed, "strata-webhook", "strata-system", world.clock(), PLACE.renew_before) is None
