"""The block store's index: which blocks are cached, in which tier and folder, and what it
reports when blocks appear or leave.

Each cached block has an entry (the metadata of its sidecar, its tier and folder). The index
attaches and drops entries, keeping the tiers' accounting and the eviction policy's ranks in
step; drops a block whose file vanished or changed size; records reads and pins in sidecars
(durably for a written file's only copy on a disk tier); and hands the blocks that appeared
or left to `on_change` in one batch. `placement.BlockPlacement` and `store.BlockStore` build
on it; everything runs on the store's event loop.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from strata.contract.constants import MEDIA
from ..common.durable import fsync_dir
from .eviction import EvictionPolicy
from .files import block_file, meta_file, remove_block_files
from ..common.keys import BlockKey
from .metadata import BlockMetadata
from .tiers import Tier, TierConfig

log = logging.getLogger(__name__)

# A block's last access time is written to its sidecar at most this often (seconds), so
# reads do not rewrite sidecars, yet a restart (or a crash) loses at most this much of
# the TTL clock. close() writes the rest.
ACCESS_PERSIST_INTERVAL = 60.0
# The medium whose blocks a power cut takes (and a restart too, in a folder of its own).
MEM = MEDIA[0]


@dataclass(frozen=True)
class CachedBlock:
    """A snapshot of one cached block."""

    key: BlockKey
    length: int
    medium: str
    path: Path  # the block file; valid until the block moves or leaves
    pinned: bool
    checksums: tuple[int, ...]  # CRC-32C of each chunk_size piece of the file
    chunk_size: int
    # The store's clock (wall-clock seconds) at its last read; not part of what a block is.
    last_access: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class TierUsage:
    medium: str
    capacity: int  # bytes: the quota, or less when the tier's disk cannot hold that much
    used: int  # bytes of cached blocks and of writes in progress
    blocks: int
    pinned: int = 0  # bytes of pinned blocks
    quota: int = 0  # the configured quota, bytes


class Entry:
    """A cached block at run time."""

    __slots__ = ("meta", "tier", "directory", "verified", "moving")

    def __init__(self, meta: BlockMetadata, tier: Tier, directory: Path, *, verified: bool) -> None:
        self.meta = meta
        self.tier = tier
        self.directory = directory
        self.verified = verified  # every chunk checked since it was written or found
        self.moving = False  # being demoted or promoted

    @property
    def block_id(self) -> str:
        return self.meta.key.block_id

    @property
    def path(self) -> Path:
        return block_file(self.directory, self.block_id)

    def snapshot(self) -> CachedBlock:
        m = self.meta
        return CachedBlock(m.key, m.length, self.tier.medium, self.path, m.pinned, m.checksums, m.chunk_size,
                           m.last_access)


class Changes:
    """Blocks that appeared or left since the last report, netted per block: a block
    dropped and cached again is reported once, as added."""

    def __init__(self) -> None:
        # block id -> (cached before these changes, key, block now or None if gone)
        self._blocks: dict[str, tuple[bool, BlockKey, CachedBlock | None]] = {}

    def __bool__(self) -> bool:
        return bool(self._blocks)

    def added(self, block: CachedBlock) -> None:
        before = self._blocks.get(block.key.block_id, (False,))[0]
        self._blocks[block.key.block_id] = (before, block.key, block)

    def removed(self, key: BlockKey) -> None:
        before = self._blocks.get(key.block_id, (True,))[0]
        self._blocks[key.block_id] = (before, key, None)

    def lists(self) -> tuple[list[CachedBlock], list[BlockKey]]:
        added = [now for _, _, now in self._blocks.values() if now is not None]
        removed = [key for before, key, now in self._blocks.values() if before and now is None]
        return added, removed


class BlockIndex:
    """Cached blocks by id in their tiers; see the module docstring."""

    def __init__(
        self,
        tiers: Sequence[TierConfig],
        policy: EvictionPolicy,
        on_change: Callable[[list[CachedBlock], list[BlockKey]], None] | None,
        clock: Callable[[], float],
    ) -> None:
        self._tiers = [Tier(config) for config in tiers]
        self._policy = policy
        self._on_change = on_change
        self._clock = clock
        self._index: dict[str, Entry] = {}
        self._pending = Changes()
        # Blocks found damaged (bad checksum, wrong size, file gone) and dropped.
        self.corrupt_blocks = 0

    # -- state --------------------------------------------------------------------------------

    def stats(self) -> list[TierUsage]:
        pinned = dict.fromkeys((t.medium for t in self._tiers), 0)
        for entry in self._index.values():
            if entry.meta.pinned:
                pinned[entry.tier.medium] += entry.meta.length
        return [
            TierUsage(t.medium, t.capacity, t.used, len(t.block_ids), pinned[t.medium], t.quota)
            for t in self._tiers
        ]

    def used_share(self) -> float:
        """Bytes in use over the capacity of every tier together (1.0 with no capacity)."""
        capacity = sum(t.capacity for t in self._tiers)
        return sum(t.used for t in self._tiers) / capacity if capacity > 0 else 1.0

    def blocks(self) -> list[CachedBlock]:
        return [entry.snapshot() for entry in self._index.values()]

    def bytes_by_mount(self) -> dict[int, int]:
        """Bytes cached per mount id (every heartbeat asks: no snapshot of each block)."""
        by_mount: dict[int, int] = {}
        for entry in self._index.values():
            mount_id = entry.meta.key.mount_id
            by_mount[mount_id] = by_mount.get(mount_id, 0) + entry.meta.length
        return by_mount

    # -- internals: index and reports ----------------------------------------------------------

    def _attach(self, entry: Entry) -> None:
        self._index[entry.block_id] = entry
        entry.tier.block_ids.add(entry.block_id)

    def _drop(self, entry: Entry) -> None:
        """Remove a block from the cache and its files from disk (if still cached)."""
        block_id = entry.block_id
        if self._index.get(block_id) is not entry:
            return
        del self._index[block_id]
        entry.tier.block_ids.discard(block_id)
        entry.tier.release(entry.meta.length, entry.directory)
        self._policy.record_remove(block_id)
        remove_block_files(entry.directory, block_id)
        self._pending.removed(entry.meta.key)

    def _present(self, key: BlockKey) -> Entry | None:
        """The entry if its file is there with the right size; drops it otherwise."""
        entry = self._index.get(key.block_id)
        if entry is None:
            return None
        try:
            size = os.stat(entry.path).st_size
        except OSError:
            size = -1
        if size != entry.meta.length:
            log.warning("block %s: file %s is %s; dropping it", key, entry.path,
                        "missing" if size < 0 else f"{size} bytes, not {entry.meta.length}")
            self.corrupt_blocks += 1
            self._drop(entry)
            return None
        return entry

    def _touch(self, entry: Entry) -> None:
        now = self._clock()
        entry.meta.last_access = now
        self._policy.record_access(entry.block_id)
        if now - entry.meta.persisted_access >= ACCESS_PERSIST_INTERVAL:
            self._write_sidecar(entry)

    def _pin(self, entry: Entry, pinned: bool) -> None:
        if entry.meta.pinned != pinned:
            entry.meta.pinned = pinned
            self._write_sidecar(entry)

    def _write_sidecar(self, entry: Entry) -> None:
        durable = sole_copy_on_disk(entry.meta, entry.tier)
        try:
            entry.meta.write(meta_file(entry.directory, entry.block_id), durable=durable)
            if durable:
                fsync_dir(entry.directory)
        except OSError as exc:
            log.warning("block %s: cannot update its sidecar: %s", entry.meta.key, exc)

    def _flush(self) -> None:
        if not self._pending:
            return
        changes, self._pending = self._pending, Changes()
        added, removed = changes.lists()
        if self._on_change is not None and (added or removed):
            try:
                self._on_change(added, removed)
            except Exception:
                log.exception("block store: on_change callback failed")


def sole_copy(meta: BlockMetadata) -> bool:
    """Is this block the only copy of its bytes (a written file's pinned block)?"""
    return meta.pinned and meta.key.written


def sole_copy_on_disk(meta: BlockMetadata, tier: Tier) -> bool:
    """Must this block's files be on the disk when they are written (see the module doc)?"""
    return sole_copy(meta) and tier.medium != MEM
