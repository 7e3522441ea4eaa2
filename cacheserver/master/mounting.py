"""The mount table as the master serves it: mounts made and removed, listed, and the table
(with credentials, and its version) that workers fetch."""

from __future__ import annotations

import logging
import time

from strata.contract.config import ServerConfig
from strata.contract.proto import strata_pb2 as pb
from strata.contract.urls import shown_url
from ..background import BackgroundTasks
from ..namespace.tree import Namespace
from ..namespace.mounts import Mount as NsMount
from ..namespace.mounts import MountTable
from ..common.paths import received
from ..ufs import check_source_allowed
from .loads import Loads
from .messages import mount_to_proto, options_from_proto
from .totals import StoreTotals
from .workerlink import WorkerLink

log = logging.getLogger(__name__)


class Mounting:
    """Mounts and unmounts; the table's version, which workers compare with their copy's."""

    def __init__(self, *, config: ServerConfig, mounts: MountTable, namespace: Namespace, totals: StoreTotals,
                 loads: Loads, link: WorkerLink, background: BackgroundTasks) -> None:
        self.config = config
        self.mounts = mounts
        self.namespace = namespace
        self.totals = totals
        self.loads = loads
        self.link = link
        self._background = background
        # From the clock, not 1: a master that starts again (on a new journal, its mounts made
        # again under new ids) must not hand out a version a worker already holds for the old
        # table, or the worker keeps the old table (and reads on under the forgotten ids).
        self.table_version = time.time_ns() // 1_000_000

    def bump_table(self) -> None:
        self.table_version += 1

    def pinned_prefixes(self, mount: NsMount) -> list[str]:
        prefixes = list(self.namespace.pinned_prefixes(mount.mount_id))
        if mount.options.pin:
            prefixes.append(mount.path)
        return sorted(set(prefixes))

    async def mount(self, request: pb.MountRequest) -> pb.MountResponse:
        path = received(request.path)
        check_source_allowed(request.source, self.config.local_sources.allowed_roots)
        options = options_from_proto(request.options, request.HasField("options"))
        existing = self.mounts.get(path)
        if (existing is not None and not existing.unusable and existing.source == request.source
                and existing.options == options):
            # Same mount again (the operator re-ensures mounts): keep its id and its cache.
            return pb.MountResponse(mount=mount_to_proto(existing, with_credentials=False, pinned=self.pinned_prefixes(existing)))
        if request.check:
            async with options.open_store(request.source) as store:
                await store.check()
        mount = self.mounts.add(path, request.source, options, replace=request.replace)
        if existing is not None and existing.mount_id != mount.mount_id:
            self._background.spawn(self.link.free_blocks(existing.mount_id, ""), f"free-replaced-{existing.mount_id}")
        self.bump_table()
        self.totals.total_store(mount)
        log.info("mounted %s -> %s (mount id %d)", mount.path, shown_url(mount.source), mount.mount_id)
        return pb.MountResponse(mount=mount_to_proto(mount, with_credentials=False, pinned=self.pinned_prefixes(mount)),
                                changed=True)

    async def unmount(self, request: pb.UnmountRequest) -> pb.UnmountResponse:
        mount = self.mounts.remove(received(request.path))
        self.bump_table()
        self.totals.forget(mount.mount_id)
        self.loads.drop_under(mount.path)
        if request.free:
            await self.link.free_blocks(mount.mount_id, "")
        log.info("unmounted %s", mount.path)
        return pb.UnmountResponse()

    async def list_mounts(self, request: pb.ListMountsRequest) -> pb.ListMountsResponse:
        return pb.ListMountsResponse(
            mounts=[mount_to_proto(m, with_credentials=False, pinned=self.pinned_prefixes(m)) for m in self.mounts.list()]
        )

    async def get_mount_table(self, request: pb.GetMountTableRequest) -> pb.GetMountTableResponse:
        return pb.GetMountTableResponse(
            version=self.table_version,
            mounts=[mount_to_proto(m, with_credentials=True, pinned=self.pinned_prefixes(m)) for m in self.mounts.list()],
        )
