"""Where the block store puts a block: the tier that takes it, the evictions that make room
for it, and moves between tiers.

A new block goes to the fastest of the tiers it may use that can make room (a written file's
pinned block: the disk tiers, see store.py). Past a tier's high watermark, blocks are evicted
in the eviction policy's order until the tier is at its low watermark, each moved one tier
down (or out of the cache from the last one); pinned blocks and blocks being moved stay. A
read may promote a block to a faster tier. A move copies the block first and deletes its old
files after. A disk found full (ENOSPC) cuts its tier's capacity, and the write is tried again
after evicting more.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from strata.contract.errors import ResourceExhausted
from strata.contract.units import format_size
from .eviction import EvictionPolicy
from .filework import copy_block, finish_in_thread, sync_block, write_block
from .files import block_file, remove_block_files
from .hugepages import HugePages
from .index import MEM, BlockIndex, CachedBlock, Entry, sole_copy_on_disk
from ..common.keys import BlockKey
from .metadata import BlockMetadata
from .tiers import Tier, TierConfig

log = logging.getLogger(__name__)

# Writes of one block that may find a disk full (each time after evicting more) before the
# put fails.
DISK_FULL_ATTEMPTS = 3


class BlockPlacement(BlockIndex):
    """The index, with placement, eviction and moves between tiers; see the module docstring."""

    def __init__(
        self,
        tiers: Sequence[TierConfig],
        policy: EvictionPolicy,
        on_change: Callable[[list[CachedBlock], list[BlockKey]], None] | None,
        clock: Callable[[], float],
        *,
        high_watermark: float,
        low_watermark: float,
    ) -> None:
        super().__init__(tiers, policy, on_change, clock)
        self._high = high_watermark
        self._low = low_watermark
        # A MEM tier's new block files are gathered into huge pages (cache/hugepages.py).
        self.huge_pages = HugePages()
        # Blocks evicted from each tier (moved one tier down, or out of the cache), by medium.
        self.evicted: dict[str, int] = {}

    async def _put_locked(
        self, key: BlockKey, data: bytes, checksums: tuple[int, ...], pin: bool
    ) -> CachedBlock:
        existing = self._index.get(key.block_id)
        if existing is not None and existing.meta.checksums == checksums:
            if pin and not existing.meta.pinned:
                self._pin(existing, True)
                if sole_copy_on_disk(existing.meta, existing.tier):  # written before as a cached copy
                    await finish_in_thread(sync_block, existing.directory, key.block_id)
            self._touch(existing)
            return existing.snapshot()
        if existing is not None:
            self._drop(existing)
        tiers = self._tiers_for(key, pin)
        for attempt in range(1, DISK_FULL_ATTEMPTS + 1):
            placed = await self._place(len(data), tiers)
            if placed is None:
                raise ResourceExhausted(self._no_room(key, len(data), tiers))
            tier, directory = placed
            now = self._clock()
            meta = BlockMetadata(key, len(data), tier.medium, checksums, now, now, pin)
            try:
                await finish_in_thread(write_block, directory, meta, data, sole_copy_on_disk(meta, tier))
                break
            except BaseException as exc:
                tier.release(len(data), directory)
                remove_block_files(directory, key.block_id)
                if not isinstance(exc, OSError):
                    raise
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    # A disk gone read-only or failing: the reader is served uncached.
                    raise ResourceExhausted(
                        f"tier {tier.medium}: cannot write block {key} in {directory}: {exc.strerror or exc}; "
                        "check that disk"
                    ) from exc
                # The disk is full before the tier is: the tier is smaller than we thought.
                tier.refresh_capacity(time.monotonic(), failed_write=len(data))
                log.warning("tier %s: %s is full (%s) with %s of blocks; evicting down to %s and "
                            "trying again", tier.medium, directory, exc.strerror, format_size(tier.used),
                            format_size(int(self._low * tier.capacity)))
                if attempt == DISK_FULL_ATTEMPTS:
                    raise ResourceExhausted(
                        f"tier {tier.medium}: directory {directory} stays full ({exc.strerror}) after "
                        f"evicting down to {format_size(tier.used)}; free space on that disk"
                    ) from exc
        entry = Entry(meta, tier, directory, verified=True)
        self._attach(entry)
        self._landed_in(tier, directory, meta)
        self._policy.record_add(entry.block_id)
        block = entry.snapshot()
        self._pending.added(block)
        return block

    def _landed_in(self, tier: Tier, directory: Path, meta: BlockMetadata) -> None:
        """A block file just put in `directory` of `tier`: in memory, gathered into huge pages."""
        if tier.medium == MEM:
            self.huge_pages.submit(block_file(directory, meta.key.block_id), meta.length)

    def _tiers_for(self, key: BlockKey, pin: bool) -> Sequence[Tier]:
        """Where a new block may go, fastest first: a written file's pinned block (its only
        copy) to the disk tiers, if the store has any; any other block to every tier."""
        if pin and key.written:
            disks = [tier for tier in self._tiers if tier.medium != MEM]
            if disks:
                return disks
        return self._tiers

    async def _place(self, nbytes: int, tiers: Sequence[Tier]) -> tuple[Tier, Path] | None:
        """Reserve `nbytes` in the first of `tiers` that can make room; None if none can."""
        for tier in tiers:
            if await self._make_room(tier, nbytes):
                directory = tier.choose_dir()
                tier.reserve(nbytes, directory)
                return tier, directory
        return None

    def _evictable(self, entry: Entry | None, tier: Tier) -> bool:
        return (
            entry is not None
            and entry.tier is tier
            and not entry.meta.pinned
            and not entry.moving
            and self._index.get(entry.block_id) is entry
        )

    async def _make_room(self, tier: Tier, nbytes: int) -> bool:
        """Evict from `tier` so `nbytes` more fit; past the high watermark, evict down to the
        low one. False, evicting nothing, when even evicting all it may cannot make room."""
        tier.refresh_capacity(time.monotonic())
        if nbytes > tier.capacity:
            return False
        if tier.used + nbytes <= self._high * tier.capacity:
            return True
        victims = [
            entry
            for entry in (self._index.get(block_id) for block_id in self._policy.victims())
            if entry is not None and self._evictable(entry, tier)
        ]
        if tier.used - sum(e.meta.length for e in victims) + nbytes > tier.capacity:
            return False
        target = self._low * tier.capacity
        for entry in victims:
            if tier.used + nbytes <= target:
                break
            if self._evictable(entry, tier):
                await self._evict(entry)
        return tier.used + nbytes <= tier.capacity

    async def _evict(self, entry: Entry) -> None:
        """Move a block one tier down (or further if the next cannot take it); drop it from
        the last tier or when no lower tier can take it."""
        lower = self._tiers[self._tiers.index(entry.tier) + 1 :]
        self.evicted[entry.tier.medium] = self.evicted.get(entry.tier.medium, 0) + 1
        entry.moving = True
        try:
            placed = await self._place(entry.meta.length, lower)
            if placed is not None and await self._move(entry, *placed):
                return
        finally:
            entry.moving = False
        self._drop(entry)

    async def keep_memory(self, deadline: float) -> int:
        """Before the worker exits: move the MEM tier's blocks to a disk tier, the most
        recently read first, until `deadline` (time.monotonic()); a restarted worker finds
        them there. Only MEM blocks among the most recently read blocks of the store that the
        disk tiers hold below their low watermark move, so that the room made for them (as
        for any block: the eviction policy's victims go) is made of blocks read before them.
        Pinned blocks stay. Returns how many moved."""
        mem = next((t for t in self._tiers if t.medium == MEM), None)
        disks = [t for t in self._tiers if t.medium != MEM]
        if mem is None or not disks:
            return 0
        room = sum(self._low * t.capacity for t in disks) - sum(
            e.meta.length for e in self._index.values() if e.tier in disks and e.meta.pinned)
        chosen = []
        for entry in sorted((e for e in self._index.values() if not e.meta.pinned),
                            key=lambda e: -e.meta.last_access):
            room -= entry.meta.length
            if room < 0:
                break
            if entry.tier is mem:
                chosen.append(entry)
        moved = 0
        for entry in chosen:
            if time.monotonic() >= deadline:
                break
            if not self._evictable(entry, mem):
                continue  # moving, or dropped meanwhile
            entry.moving = True
            try:
                placed = await self._place(entry.meta.length, disks)
                if placed is None or not await self._move(entry, *placed):
                    break
            finally:
                entry.moving = False
            moved += 1
        return moved

    async def _promote(self, entry: Entry) -> None:
        faster = self._tiers[: self._tiers.index(entry.tier)]
        if sole_copy_on_disk(entry.meta, entry.tier):  # it stays on a disk
            faster = [tier for tier in faster if tier.medium != MEM]
        if not faster or self._index.get(entry.block_id) is not entry:
            return
        entry.moving = True
        try:
            placed = await self._place(entry.meta.length, faster)
            if placed is not None:
                await self._move(entry, *placed)
        finally:
            entry.moving = False

    async def _move(self, entry: Entry, dest: Tier, directory: Path) -> bool:
        """Copy a block into `directory` of `dest` (already reserved there), then switch the
        entry over and delete the old files. True when the block has left its old tier
        (moved, or dropped by someone else meanwhile); False if the copy failed."""
        block_id, nbytes = entry.block_id, entry.meta.length
        copied = replace(entry.meta, medium=dest.medium)
        try:
            await finish_in_thread(copy_block, entry.directory, directory, copied, sole_copy_on_disk(copied, dest))
        except BaseException as exc:
            dest.release(nbytes, directory)
            remove_block_files(directory, block_id)
            if not isinstance(exc, OSError):
                raise
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                dest.refresh_capacity(time.monotonic(), failed_write=nbytes)
            if self._index.get(block_id) is not entry:
                return True  # removed meanwhile, maybe with the file we copied
            log.warning("block %s: cannot move it from %s to %s: %s",
                        entry.meta.key, entry.tier.medium, dest.medium, exc)
            return False
        if self._index.get(block_id) is not entry:
            dest.release(nbytes, directory)
            remove_block_files(directory, block_id)
            return True
        source, old_directory = entry.tier, entry.directory
        source.block_ids.discard(block_id)
        entry.tier, entry.directory = dest, directory
        entry.meta.medium = dest.medium
        dest.block_ids.add(block_id)
        source.release(nbytes, old_directory)
        self._landed_in(dest, directory, entry.meta)
        if entry.meta.pinned != copied.pinned:  # pinned or unpinned while it was copied
            self._write_sidecar(entry)
        remove_block_files(old_directory, block_id)
        return True

    def _no_room(self, key: BlockKey, nbytes: int, tiers: Sequence[Tier]) -> str:
        media = {tier.medium for tier in tiers}
        usage = "; ".join(
            f"{u.medium} quota {format_size(u.capacity)}, used {format_size(u.used)}, "
            f"pinned {format_size(u.pinned)}"
            for u in self.stats() if u.medium in media
        )
        where = ("" if len(tiers) == len(self._tiers) else
                 " (a block of a file written into the cache and not in the store yet goes to a disk tier only)")
        return (
            f"no cache tier can take block {key} ({format_size(nbytes)}){where}: {usage}. "
            "Unpin or free cached data, or give a tier a larger quota"
        )
