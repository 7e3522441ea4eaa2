"""Certificates for the test control plane, made with `cryptography`.

ECDSA P-256 keys throughout: they take milliseconds to make, and every
Kubernetes component accepts them (service-account tokens are signed ES256).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class KeyPair:
    """Paths of a PEM certificate and its private key."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Every file the control plane needs, all under one directory."""

    ca: KeyPair
    apiserver: KeyPair
    sa_public: Path
    sa_private: Path
    admin: KeyPair
    controller_manager: KeyPair
    scheduler: KeyPair
    kubelet_client: KeyPair  # the API server's identity towards kubelets (logs, exec)
    kube_proxy: KeyPair
    nodes: dict[str, KeyPair]  # each kubelet's client certificate, by node name


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


class _Authority:
    """A self-signed CA that issues serving and client certificates."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self.name = _name("strata-e2e-ca")
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True,
                    content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.pair = self._save("ca", self.cert, self.key)

    def _save(
        self, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
    ) -> KeyPair:
        pair = KeyPair(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair

    def issue(
        self,
        stem: str,
        common_name: str,
        organization: str | None = None,
        *,
        dns_names: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
    ) -> KeyPair:
        """Issue a certificate; with names or IPs it is a serving certificate."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        serving = bool(dns_names or ips)
        usage = [ExtendedKeyUsageOID.SERVER_AUTH] if serving else [ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organization))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        )
        if serving:
            sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
            sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return self._save(stem, builder.sign(self.key, hashes.SHA256()), key)


def make_pki(directory: Path, *, apiserver_ips: tuple[str, ...], nodes: tuple[str, ...] = ()) -> Pki:
    """Create the CA, the API server's serving cert, the service-account key
    pair and client certs for the admin, controller-manager, scheduler, the API
    server towards kubelets, kube-proxy and each node's kubelet."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _Authority(directory)
    sa_key = ec.generate_private_key(ec.SECP256R1())
    sa_private = directory / "sa.key"
    sa_public = directory / "sa.pub"
    _write_key(sa_key, sa_private)
    sa_public.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    dns = (
        "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    )
    return Pki(
        ca=ca.pair,
        apiserver=ca.issue("apiserver", "kube-apiserver", dns_names=dns, ips=apiserver_ips),
        sa_public=sa_public,
        sa_private=sa_private,
        admin=ca.issue("admin", "strata-e2e-admin", "system:masters"),
        controller_manager=ca.issue("controller-manager", "system:kube-controller-manager"),
        scheduler=ca.issue("scheduler", "system:kube-scheduler"),
        kubelet_client=ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"),
        kube_proxy=ca.issue("kube-proxy", "system:kube-proxy"),
        # The Node authorizer and NodeRestriction know a kubelet by this name and group.
        nodes={n: ca.issue(f"node-{n}", f"system:node:{n}", "system:nodes") for n in nodes},
    )
