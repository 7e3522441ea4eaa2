"""The master's MountRequest for a Mount: its spec plus the keys of its credentials Secret."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from strata.contract.modes import ReadType, WriteType
from strata.contract.proto import strata_pb2 as pb
from strata.operator.models import MountSpec


def build_mount_request(spec: MountSpec, credentials: Mapping[str, str]) -> pb.MountRequest:
    """Idempotent on the master: replace=True remounts only when something differs, and
    check=True lists the source first, so a wrong bucket or key fails here, not in a pod."""
    options = pb.MountOptions(
        options=dict(spec.options),
        credentials=dict(credentials),
        read_only=spec.read_only,
        metadata_sync_interval=spec.metadata_sync.interval,
        read_type=ReadType.proto_of(spec.read_type),
        write_type=WriteType.proto_of(spec.write_type),
        pin=spec.pin,
        ttl_seconds=spec.ttl,
        stale_if_error=spec.stale_if_error,
    )
    return pb.MountRequest(path=spec.path, source=spec.source, options=options, replace=True, check=True)


def request_fingerprint(request: pb.MountRequest) -> str:
    """A digest of everything mounted (credentials included, never kept in clear)."""
    return hashlib.sha256(request.SerializeToString(deterministic=True)).hexdigest()
