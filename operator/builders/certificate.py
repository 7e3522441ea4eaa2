"""The locality webhook's TLS certificate, made by the operator itself (no key in any file
that is installed): a CA and a serving certificate for the webhook Service, the Secret that
keeps them for every replica, and the caBundle the API server trusts.

Pure functions: the time and the names come in, PEM bytes and manifests go out.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from strata.operator import constants as c
from strata.operator.builders.common import Manifest

CA_FILE = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
# Clocks of the API server and the operator may differ a little.
_BACKDATE = timedelta(minutes=5)


@dataclass(frozen=True)
class WebhookCertificate:
    """PEM: the CA bundle the API server trusts (the current CA, then the one it replaced
    while that is still valid), the serving certificate, and its key."""

    ca_bundle: bytes
    cert: bytes
    key: bytes = field(repr=False)


def dns_names(service: str, namespace: str) -> list[str]:
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc"]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_certificate(service: str, namespace: str, now: datetime, validity: timedelta,
                     previous: WebhookCertificate | None = None) -> WebhookCertificate:
    """A new CA and a serving certificate it signs for the webhook Service; the previous
    bundle's CAs that are still valid stay trusted next to the new one (a replica still
    serving the old certificate keeps being trusted until it loads the new one)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = now - _BACKDATE, now + validity
    ca_name = _name(f"{service}-ca-{now:%Y%m%d%H%M%S}")
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    names = dns_names(service, namespace)
    cert = (
        x509.CertificateBuilder().subject_name(_name(names[-1])).issuer_name(ca_name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    bundle = ca.public_bytes(pem)
    if previous is not None:
        try:
            kept = [old for old in _certificates(previous.ca_bundle) if old.not_valid_after_utc > now]
        except ValueError:  # a broken bundle: nothing of it to keep
            kept = []
        bundle += b"".join(old.public_bytes(pem) for old in kept[:1])
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return WebhookCertificate(ca_bundle=bundle, cert=cert.public_bytes(pem), key=key_pem)


def _certificates(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem) if pem.strip() else []


def renewal_reason(certificate: WebhookCertificate, service: str, namespace: str, now: datetime,
                   renew_before: timedelta) -> str | None:
    """Why the certificate must be replaced (it cannot be parsed, names another service, is
    not signed by the bundle's CA, or expires within `renew_before`), or None."""
    try:
        cert = x509.load_pem_x509_certificate(certificate.cert)
        serialization.load_pem_private_key(certificate.key, password=None)
        cas = _certificates(certificate.ca_bundle)
    except ValueError as exc:
        return f"it cannot be read ({exc})"
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
    except x509.ExtensionNotFound:
        sans = []
    if not set(dns_names(service, namespace)) <= set(sans):
        return f"it names {sans}, not the webhook Service {service}.{namespace}.svc"
    if not cas or cas[0].subject != cert.issuer:
        return "it is not signed by the CA of its bundle"
    if cert.not_valid_after_utc - renew_before <= now:
        return f"it expires at {cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}"
    return None


def certificate_secret(certificate: WebhookCertificate, name: str, namespace: str) -> Manifest:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {c.LABEL_NAME: c.APP_NAME, c.LABEL_COMPONENT: "webhook",
                                c.LABEL_MANAGED_BY: c.MANAGED_BY}},
        "data": {CA_FILE: b64(certificate.ca_bundle), CERT_FILE: b64(certificate.cert), KEY_FILE: b64(certificate.key)},
    }


def certificate_of(secret: Mapping[str, object] | None) -> WebhookCertificate | None:
    """The certificate a Secret made by certificate_secret holds (None: absent or incomplete)."""
    data = (secret or {}).get("data")
    if not isinstance(data, Mapping):
        return None
    try:
        parts = [base64.b64decode(str(data.get(k) or ""), validate=True) for k in (CA_FILE, CERT_FILE, KEY_FILE)]
    except binascii.Error:
        return None
    if not all(parts):
        return None
    return WebhookCertificate(ca_bundle=parts[0], cert=parts[1], key=parts[2])


def ca_bundle_patch(configuration: str, webhook: str, ca_bundle: bytes) -> Manifest:
    """The MutatingWebhookConfiguration as the operator applies it: only the caBundle of its
    webhook (server-side apply merges webhooks by name; the installer owns the rest)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": configuration},
        "webhooks": [{"name": webhook, "clientConfig": {"caBundle": base64.b64encode(ca_bundle).decode()}}],
    }
