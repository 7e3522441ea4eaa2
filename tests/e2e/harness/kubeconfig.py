"""Kubeconfig files for the harness' users."""

from __future__ import annotations

from pathlib import Path

import yaml

from harness.pki import KeyPair


def write_kubeconfig(path: Path, *, server: str, ca: Path, user: KeyPair, name: str) -> Path:
    """Write a kubeconfig for one user of one cluster, referencing PEM files."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "strata-e2e", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": name, "user": {"client-certificate": str(user.cert), "client-key": str(user.key)}}],
        "contexts": [{"name": "strata-e2e", "context": {"cluster": "strata-e2e", "user": name}}],
        "current-context": "strata-e2e",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
