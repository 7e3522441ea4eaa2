"""Totals of the mounted stores (bytes, files), walked in the background and reused a while."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from strata.contract.errors import StrataError
from ..background import BackgroundTasks
from ..namespace.mounts import Mount as NsMount
from ..namespace.mounts import MountTable

log = logging.getLogger(__name__)

# How long store totals of a mount (bytes, files) are reused before walking the store again.
UFS_TOTALS_MAX_AGE = 60.0


@dataclass
class UfsTotals:
    total_bytes: int
    files: int
    walked_at: float  # time.monotonic() when the walk ended


class StoreTotals:
    """The last totals of each mount's store, and the walk of it under way."""

    def __init__(self, mounts: MountTable, background: BackgroundTasks) -> None:
        self.mounts = mounts
        self._background = background
        self.ufs_totals: dict[int, UfsTotals] = {}
        self._totalling: dict[int, asyncio.Task[object]] = {}  # by mount id: the walk under way

    def get(self, mount: NsMount) -> UfsTotals | None:
        """The last totals of `mount`'s store; a walk of it starts when they are older than
        UFS_TOTALS_MAX_AGE (or missing)."""
        totals = self.ufs_totals.get(mount.mount_id)
        if not mount.unusable and (totals is None or time.monotonic() - totals.walked_at > UFS_TOTALS_MAX_AGE):
            self.total_store(mount)
        return totals

    def forget(self, mount_id: int) -> None:
        """An unmounted mount: its totals go, and the walk of its store stops."""
        self.ufs_totals.pop(mount_id, None)
        totalling = self._totalling.pop(mount_id, None)
        if totalling is not None:
            totalling.cancel()

    def total_store(self, mount: NsMount) -> None:
        """Total the store of `mount` in the background, unless a walk of it is under way:
        reports answer from the last totals meanwhile (a walk of millions of files takes
        minutes, paced by `Store.totals`; one at a time however often reports ask)."""
        running = self._totalling.get(mount.mount_id)
        if running is None or running.done():
            self._totalling[mount.mount_id] = self._background.spawn(self._refresh_ufs_totals(mount),
                                                                     f"ufs-totals-{mount.mount_id}")

    async def _refresh_ufs_totals(self, mount: NsMount) -> None:
        try:
            totals = await self.mounts.store(mount).totals()
        except StrataError as exc:
            log.warning("cannot total the store of %s: %s", mount.path, exc)
            return
        if self.mounts.by_id(mount.mount_id) is not None:  # not unmounted meanwhile
            self.ufs_totals[mount.mount_id] = UfsTotals(totals.total_bytes, totals.files, time.monotonic())

