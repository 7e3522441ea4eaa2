"""What the cluster holds, for GetCapacity, Report and the metrics: capacity of the live
workers, each mount's cached bytes by host, its store's totals, its loads and pending uploads."""

from __future__ import annotations

import time

from strata.contract.config import ServerConfig
from strata.contract.proto import strata_pb2 as pb
from ..namespace.mounts import MountTable
from ..pendinguploads import sum_pending
from .blocks import BlockIndex
from .loads import Loads
from .membership import Membership
from .messages import mount_to_proto
from .mounting import Mounting
from .totals import StoreTotals


class Reports:
    """Reports over the membership, the block index, the mounts, their totals and loads."""

    def __init__(self, *, config: ServerConfig, mounts: MountTable, membership: Membership, blocks: BlockIndex,
                 mounting: Mounting, totals: StoreTotals, loads: Loads) -> None:
        self.config = config
        self.mounts = mounts
        self.membership = membership
        self.blocks = blocks
        self.mounting = mounting
        self.totals = totals
        self.loads = loads

    async def get_capacity(self, request: pb.GetCapacityRequest) -> pb.GetCapacityResponse:
        capacity, used = self._live_capacity()
        return pb.GetCapacityResponse(capacity=capacity, used=used)

    def _live_capacity(self) -> tuple[int, int]:
        """Bytes the live workers' tiers may hold, and hold."""
        live = self.membership.live()
        return (sum(t.capacity for r in live for t in r.stats.tiers),
                sum(t.used for r in live for t in r.stats.tiers))

    async def report(self, request: pb.ReportRequest) -> pb.ReportResponse:
        capacity, used = self._live_capacity()
        response = pb.ReportResponse(capacity=capacity, used=used)
        for record in self.membership.records():
            live = self.membership.is_live(record)
            response.workers.append(pb.WorkerReport(worker=self.membership.to_proto(record), stats=record.stats, live=live))
            response.hits += record.stats.hits
            response.misses += record.stats.misses
        pending = self.pending_uploads()
        response.pending_uploads.CopyFrom(sum_pending(pending.values()))
        by_mount = self.blocks.cached_bytes_by_mount()
        settle = 2 * self.config.heartbeat_interval
        for mount in self.mounts.list():
            totals = self.totals.get(mount)
            by_host: dict[str, int] = {}
            for worker_id, n in self.blocks.cached_bytes_by_worker(mount.mount_id).items():
                host = self.membership.host_of(worker_id) or worker_id
                by_host[host] = by_host.get(host, 0) + n
            response.mounts.append(pb.MountReport(
                mount=mount_to_proto(mount, with_credentials=False, pinned=self.mounting.pinned_prefixes(mount)),
                cached_bytes=by_mount.get(mount.mount_id, 0),
                cached_bytes_by_host=by_host,
                ufs_total_bytes=totals.total_bytes if totals else 0,
                ufs_files=totals.files if totals else 0,
                ufs_totals_age_ms=int((time.monotonic() - totals.walked_at) * 1000) if totals else -1,
                loads=await self.loads.reports_under(mount.path, self.blocks, settle),
                pending_uploads=pending.get(mount.mount_id, pb.PendingUploads(mount_id=mount.mount_id)),
            ))
        return response

    def pending_uploads(self) -> dict[int, pb.PendingUploads]:
        """Pending ASYNC_THROUGH uploads per mount id, summed over live workers."""
        parts: dict[int, list[pb.PendingUploads]] = {}
        for record in self.membership.live():
            for part in record.stats.pending_uploads:
                parts.setdefault(part.mount_id, []).append(part)
        return {mount_id: sum_pending(p, mount_id) for mount_id, p in parts.items()}
