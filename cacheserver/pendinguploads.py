"""Pending uploads (acknowledged ASYNC_THROUGH writes not in the store yet) as workers report
them, summed for a mount or a cluster, and how old the oldest one is: what `strata report`,
the metrics and the Mount's status show."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily

from strata.contract.proto import strata_pb2 as pb


def sum_pending(parts: Iterable[pb.PendingUploads], mount_id: int = 0) -> pb.PendingUploads:
    """The sum of `parts` (count, bytes, the oldest time), labelled with `mount_id`."""
    total = pb.PendingUploads(mount_id=mount_id)
    for part in parts:
        total.count += part.count
        total.bytes += part.bytes
        if part.count and part.oldest_unix_ms and (not total.oldest_unix_ms or part.oldest_unix_ms < total.oldest_unix_ms):
            total.oldest_unix_ms = part.oldest_unix_ms
    return total


def oldest_age_seconds(pending: pb.PendingUploads, now_unix: float | None = None) -> float:
    """Seconds since the oldest pending upload was acknowledged; 0 when nothing is pending."""
    if not pending.count or not pending.oldest_unix_ms:
        return 0.0
    now = time.time() if now_unix is None else now_unix
    return max(0.0, now - pending.oldest_unix_ms / 1000.0)


def pending_upload_metrics(prefix: str, pending: dict[int, pb.PendingUploads], names: dict[int, str]) -> Iterator[GaugeMetricFamily]:
    """Gauges of pending ASYNC_THROUGH uploads per mount (label: the mount's path, or its id
    when the mount is not known here)."""
    now = time.time()
    count = GaugeMetricFamily(f"{prefix}_pending_uploads", "Acknowledged ASYNC_THROUGH writes not in the store yet", labels=["mount"])
    size = GaugeMetricFamily(f"{prefix}_pending_upload_bytes", "Bytes of pending ASYNC_THROUGH uploads", labels=["mount"])
    age = GaugeMetricFamily(f"{prefix}_pending_upload_oldest_seconds", "Age of the oldest pending upload", labels=["mount"])
    for mount_id in sorted(set(names) | set(pending)):
        part = pending.get(mount_id, pb.PendingUploads(mount_id=mount_id))
        label = [names.get(mount_id, str(mount_id))]
        count.add_metric(label, part.count)
        size.add_metric(label, part.bytes)
        age.add_metric(label, oldest_age_seconds(part, now))
    yield count
    yield size
    yield age
