"""Store credentials in the master's journal are sealed with the cluster's key: AES-256-GCM
under a key derived (HKDF-SHA256) from the cluster's internal token, bound to the mount they
belong to. The journal on the volume then holds no credential in the clear; a master started
with another token cannot open them (the mount is dropped and mounted again by its owner).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

_INFO = b"strata master journal: mount credentials v1"
_NONCE_BYTES = 12


class SealError(Exception):
    """Sealed credentials that this key cannot open (another cluster key, or damaged)."""


class Sealer:
    """Seals and opens one mount's credentials (a str -> str map) with the cluster's key."""

    def __init__(self, cluster_key: str) -> None:
        if not cluster_key:
            raise ValueError("the cluster key that seals the journal's credentials is empty")
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(cluster_key.encode())
        self._aead = AESGCM(key)

    def seal(self, credentials: Mapping[str, str], bound_to: str) -> str:
        nonce = os.urandom(_NONCE_BYTES)
        plain = json.dumps(dict(credentials), sort_keys=True).encode()
        return base64.b64encode(nonce + self._aead.encrypt(nonce, plain, bound_to.encode())).decode()

    def open(self, sealed: str, bound_to: str) -> dict[str, str]:
        try:
            raw = base64.b64decode(sealed, validate=True)
            plain = self._aead.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], bound_to.encode())
            data = json.loads(plain)
        except (binascii.Error, InvalidTag, ValueError) as exc:
            raise SealError(f"sealed credentials of {bound_to} cannot be opened with this cluster key") from exc
        if not isinstance(data, dict):
            raise SealError(f"sealed credentials of {bound_to} are not a map")
        return {str(k): str(v) for k, v in data.items()}
