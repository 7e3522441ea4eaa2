"""The worker's tiered block store: cached blocks of remote files in MEM, SSD and HDD tiers.

New blocks go to the fastest tier that can take them (the only copy of a written file's
block: the fastest disk tier, see below). When a write would take a tier past
`high_watermark` of its quota, blocks are evicted in the eviction policy's order until the
tier is at `low_watermark`: an evicted block moves down one tier (which may in turn evict)
or, from the last tier, leaves the cache. Pinned blocks are never evicted.

Concurrency model (one asyncio loop): writes, evictions and promotions run one at a time
under a lock, with file work in threads; reads and the synchronous methods need no lock.
Accounting reserves a tier's bytes before they are written, so `used <= capacity` always
holds; a tier's capacity is its quota, or less when its disk cannot hold that much (see
tiers.Tier). A write that finds the disk full (ENOSPC) cuts the tier's capacity, evicts and
tries again.
A block that moves between tiers is copied first and its old file removed after, so a
reader holding the old path either reads it whole or retries with the new one.

Blocks of store data are written without fsync: a power cut may lose them, the checksums
catch what did not reach the disk, and the store has the bytes. A pinned block of a file
written into the cache (`BlockKey.written`: MUST_CACHE, ASYNC_THROUGH not yet uploaded) is
its file's only copy: it goes to the first disk tier (SSD, HDD) that can take it when the
store has one, never to MEM (whose folder a restart of the machine, or of a Kubernetes pod,
empties); its file and sidecar are fsynced, and their folder, before `put` returns (and
before a move deletes the old copy), and it is never promoted into memory. With MEM alone it
goes to MEM, and close() leaves a folder of its own that still holds such blocks in place.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

from strata.contract.constants import MEDIA
from strata.contract.errors import DataLoss, FailedPrecondition, InvalidArgument, NotFound
from strata.contract.units import format_size
from .eviction import make_policy
from .filework import remove_all, write_sidecars
from .files import meta_file
from .index import CachedBlock, Entry, sole_copy
from ..common.keys import BlockKey
from ..common.checksums import compute_checksums
from .metadata import BlockCorrupt
from .placement import BlockPlacement
from .tiers import TierConfig
from .verification import check_span, read_chunks, verify_fd

__all__ = ["BlockCorrupt", "BlockStore"]

log = logging.getLogger(__name__)


class BlockStore(BlockPlacement):
    """Blocks of remote files cached in tiers; see the module docstring.

    `on_change(added, removed)` is called synchronously whenever blocks appear in or leave
    the store (not when they move between tiers, and not for the blocks `open()` finds,
    which it returns). Keep it cheap; its exceptions are logged, not raised.

    `block_size` is the cluster's block size: `open()` drops the blocks a previous run cut
    with another size (no reader asks for them again), except pinned ones, which may be the
    only copy of a write not yet in the store (a written file keeps the block size it was
    written with).
    """

    def __init__(
        self,
        tiers: Sequence[TierConfig],
        *,
        eviction: str = "LRU",
        high_watermark: float = 0.95,
        low_watermark: float = 0.80,
        on_change: Callable[[list[CachedBlock], list[BlockKey]], None] | None = None,
        clock: Callable[[], float] = time.time,
        block_size: int | None = None,
    ) -> None:
        _check_tiers(tiers)
        if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int)
                                       or block_size <= 0):
            raise InvalidArgument(f"block_size must be an integer > 0, got {block_size!r}")
        if not 0 < high_watermark <= 1:
            raise InvalidArgument(f"high_watermark must be in (0, 1], got {high_watermark!r}")
        if not 0 <= low_watermark < high_watermark:
            raise InvalidArgument(
                f"low_watermark ({low_watermark!r}) must be >= 0 and below high_watermark "
                f"({high_watermark!r})"
            )
        super().__init__(tiers, make_policy(eviction), on_change, clock,
                         high_watermark=high_watermark, low_watermark=low_watermark)
        self._block_size = block_size
        self._inflight: dict[str, asyncio.Task[CachedBlock]] = {}
        self._write_lock = asyncio.Lock()
        self._state: Literal["new", "open", "closed"] = "new"

    @property
    def eviction(self) -> str:
        return self._policy.name

    # -- life cycle ---------------------------------------------------------------------------

    async def open(self) -> list[CachedBlock]:
        """Create the tier directories and take over the blocks a previous run left: those
        whose sidecar and file are intact (size matches; checksums are verified when they are
        read). Leftovers are deleted. Blocks beyond a (reduced) quota are dropped, pinned and
        recently used ones kept first."""
        if self._state != "new":
            raise FailedPrecondition(f"block store: open() called twice (state {self._state})")
        scanned = []
        for tier in self._tiers:
            await asyncio.to_thread(tier.prepare)
            scanned.append(await asyncio.to_thread(tier.scan))
        surplus: list[tuple[Path, str]] = []
        other_size: list[tuple[Path, str]] = []
        for tier, found in zip(self._tiers, scanned):
            found.sort(key=lambda s: (not s.meta.pinned, -s.meta.last_access))
            for block in found:
                block_id, length = block.meta.key.block_id, block.meta.length
                if self._block_size is not None and block.meta.key.block_size != self._block_size \
                        and not block.meta.pinned:
                    other_size.append((block.directory, block_id))
                    continue
                if block_id in self._index or tier.used + length > tier.quota:
                    surplus.append((block.directory, block_id))
                    continue
                tier.reserve(length, block.directory)
                self._attach(Entry(block.meta, tier, block.directory, verified=False))
        if other_size:
            log.info("block store: dropping %d blocks cut with another block size than the "
                     "cluster's %s", len(other_size), format_size(self._block_size or 0))
        if surplus:
            log.info("block store: dropping %d blocks found beyond a quota or twice", len(surplus))
        if other_size or surplus:
            await asyncio.to_thread(remove_all, other_size + surplus)
        for tier in self._tiers:
            tier.refresh_capacity(time.monotonic())
        for entry in sorted(self._index.values(), key=lambda e: e.meta.last_access):
            self._policy.record_add(entry.block_id)
        self._state = "open"
        return self.blocks()

    async def close(self) -> None:
        """Stop fetches in flight, write pending access times, delete a default MEM folder
        (unless it holds the only copy of a written block: that stays, and is logged)."""
        if self._state != "open":
            return
        for task in list(self._inflight.values()):
            task.cancel()
        await asyncio.gather(*self._inflight.values(), return_exceptions=True)
        await asyncio.to_thread(self.huge_pages.close)
        async with self._write_lock:
            self._state = "closed"
            stale = [
                (e.meta, meta_file(e.directory, e.block_id))
                for e in self._index.values()
                if e.meta.last_access != e.meta.persisted_access
            ]
            await asyncio.to_thread(write_sidecars, stale)
            for tier in self._tiers:
                if not tier.owns_dirs:
                    continue
                written = sum(1 for e in self._index.values() if e.tier is tier and sole_copy(e.meta))
                if written:
                    log.error("tier %s: leaving %s in place: it holds %d block(s) of files written into the cache "
                              "and not in the store yet, their only copy; give the tier a directory of its own "
                              "so that a restarted worker finds them", tier.medium,
                              ", ".join(map(str, tier.dirs)), written)
                else:
                    await asyncio.to_thread(tier.remove_owned_dirs)

    async def __aenter__(self) -> BlockStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- reads --------------------------------------------------------------------------------

    async def get_or_fetch(
        self,
        key: BlockKey,
        fetch: Callable[[], Awaitable[bytes]],
        *,
        promote: bool = False,
        pin: bool = False,
    ) -> tuple[CachedBlock, bool]:
        """The cached block and whether it was a hit. On a miss `fetch()` is called once for
        all concurrent callers of one key; its error reaches them all and nothing is cached.
        Fetched bytes of another length than the key's raise DataLoss. `promote` moves a hit
        up to the fastest tier that can make room. ResourceExhausted when no tier can take
        the fetched block (serve those bytes uncached)."""
        self._require_open()
        try:
            entry = self._present(key)
            if entry is not None:
                if pin:
                    self._pin(entry, True)
                self._touch(entry)
                if promote:
                    async with self._write_lock:
                        await self._promote(entry)
                return entry.snapshot(), True
            block_id = key.block_id
            flight = self._inflight.get(block_id)
            if flight is None:
                flight = asyncio.create_task(self._fetch_and_put(key, fetch, pin))
                self._inflight[block_id] = flight
                flight.add_done_callback(lambda t: self._landed(block_id, t))
            self._flush()  # report a dropped stale copy now, not after the fetch
            block = await asyncio.shield(flight)
            if pin and not block.pinned:
                self.set_pinned(lambda k: k == key, True)
                block = replace(block, pinned=True)
            return block, False
        finally:
            self._flush()

    def lookup(self, key: BlockKey) -> CachedBlock | None:
        """The cached block, or None. A block whose file vanished or changed size is dropped."""
        self._require_open()
        try:
            entry = self._present(key)
            return None if entry is None else entry.snapshot()
        finally:
            self._flush()

    async def read(self, key: BlockKey, offset: int, length: int) -> bytes:
        """Bytes [offset, offset+length) of a cached block (fewer at its end). Verifies the
        CRC32 of each chunk it touches; a failed check or a missing file drops the block and
        raises BlockCorrupt, so the caller fetches it again. NotFound if it is not cached."""
        self._require_open()
        _check_length(offset, "offset")
        _check_length(length, "length")
        try:
            for _attempt in range(3):
                entry = self._index.get(key.block_id)
                if entry is None:
                    raise NotFound(f"block {key} is not cached on this worker; fetch it from the store")
                meta, path = entry.meta, entry.path
                if offset > meta.length:
                    raise InvalidArgument(
                        f"block {key}: offset {offset} is past its end ({meta.length} bytes)"
                    )
                end = min(offset + length, meta.length)
                start, stop = meta.chunk_span(offset, end - offset)
                try:
                    data, bad = await asyncio.to_thread(read_chunks, path, meta, start, stop)
                except OSError as exc:
                    problem = f"cannot read {path}: {exc.strerror or exc}"
                else:
                    if bad is None:
                        if start == 0 and stop == meta.length:
                            entry.verified = True
                        self._touch(entry)
                        return data if (start, stop) == (offset, end) else data[offset - start : end - start]
                    problem = f"chunk {bad} failed its CRC-32C check"
                current = self._index.get(key.block_id)
                if current is None:
                    raise NotFound(f"block {key} left the cache while it was read; fetch it again")
                if current is entry and current.path == path:
                    raise self._corrupt(entry, problem)
                # It moved to another tier or was replaced while we read: read the new copy.
            raise BlockCorrupt(f"block {key} kept moving while it was read; read it again")
        finally:
            self._flush()

    def open_fd(self, key: BlockKey) -> tuple[int, CachedBlock]:
        """A read-only file descriptor of the block file for short-circuit reads; the caller
        closes it. The first open of a block found at restart verifies all its checksums
        (BlockCorrupt if one fails). NotFound if the block is not cached."""
        self._require_open()
        try:
            fd, entry = self._open_entry(key)
            return fd, entry.snapshot()
        finally:
            self._flush()

    def touch(self, block_id: str) -> None:
        """A read of the block was served from its file without the store (an open a
        worker's socket thread answered, worker/keptopens.py): it counts as one for
        eviction. Nothing happens for a block no longer cached."""
        entry = self._index.get(block_id)
        if entry is not None:
            self._touch(entry)

    async def open_checked(self, key: BlockKey, offset: int, length: int) -> tuple[int, CachedBlock]:
        """A read-only descriptor of the block file (the caller closes it) after checking the
        CRC-32C of every chunk that [offset, offset+length) touches, as `read` does: a failed
        check drops the block and raises BlockCorrupt. For senders that hand the file's bytes
        to the kernel (sendfile) rather than reading them."""
        _check_length(offset, "offset")
        _check_length(length, "length")
        self._require_open()
        try:
            fd, entry = self._open_entry(key)
            block = entry.snapshot()
        finally:
            self._flush()
        start, stop = entry.meta.chunk_span(offset, length)
        try:
            bad = await asyncio.to_thread(check_span, fd, entry.meta, start, stop)
        except BaseException:
            os.close(fd)
            raise
        if bad is None:
            return fd, block
        os.close(fd)
        try:
            if self._index.get(key.block_id) is entry and entry.path == block.path:
                raise self._corrupt(entry, bad)
            raise BlockCorrupt(f"block {key} on {block.medium}: {bad}; read it again from the store")
        finally:
            self._flush()

    def _open_entry(self, key: BlockKey) -> tuple[int, Entry]:
        """An open descriptor of the block's file and its entry (see open_fd)."""
        entry = self._present(key)
        if entry is None:
            raise NotFound(f"block {key} is not cached on this worker; fetch it from the store")
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._drop(entry)
            raise NotFound(f"block {key} vanished from {entry.tier.medium}; fetch it again") from None
        if not entry.verified:
            try:
                bad = verify_fd(fd, entry.meta)
            except OSError as exc:
                bad = f"cannot read it: {exc.strerror or exc}"
            if bad is not None:
                os.close(fd)
                raise self._corrupt(entry, bad)
            entry.verified = True
        self._touch(entry)
        return fd, entry

    def _corrupt(self, entry: Entry, problem: str) -> BlockCorrupt:
        """Drop a block found bad; the error to raise for it."""
        log.warning("block %s on %s: %s; dropping it", entry.meta.key, entry.tier.medium, problem)
        self.corrupt_blocks += 1
        self._drop(entry)
        return BlockCorrupt(
            f"block {entry.meta.key} on {entry.tier.medium}: {problem}; it was dropped from the "
            "cache, read it again from the store"
        )

    # -- writes -------------------------------------------------------------------------------

    async def put(self, key: BlockKey, data: bytes, *, pin: bool = False) -> CachedBlock:
        """Cache `data` as block `key` in the fastest tier that can take it (a written
        file's pinned block: the fastest disk tier, if any), evicting as needed. The same bytes again only refresh the block (and pin it if asked); other
        bytes replace it. ResourceExhausted if no tier can take it."""
        self._require_open()
        if len(data) != key.length:
            raise InvalidArgument(f"block {key}: got {len(data)} bytes, its key says {key.length}")
        checksums = await asyncio.to_thread(compute_checksums, data)
        try:
            async with self._write_lock:
                self._require_open()
                return await self._put_locked(key, data, checksums, pin)
        finally:
            self._flush()

    def remove(self, key: BlockKey) -> bool:
        """Drop one block; False if it was not cached."""
        self._require_open()
        try:
            entry = self._index.get(key.block_id)
            if entry is None:
                return False
            self._drop(entry)
            return True
        finally:
            self._flush()

    def free(self, predicate: Callable[[BlockKey], bool]) -> int:
        """Drop every block whose key matches, pinned ones too; returns the bytes freed."""
        return self._free_where(lambda e: predicate(e.meta.key))

    def free_unused_since(self, cutoff_unix: float, predicate: Callable[[BlockKey], bool]) -> int:
        """Drop matching blocks (pinned ones too) not read since `cutoff_unix`: a mount's TTL.
        Returns the bytes freed."""
        return self._free_where(lambda e: e.meta.last_access < cutoff_unix and predicate(e.meta.key))

    def set_pinned(self, predicate: Callable[[BlockKey], bool], pinned: bool) -> int:
        """Pin or unpin every block whose key matches; returns how many matched."""
        self._require_open()
        try:
            matched = [e for e in self._index.values() if predicate(e.meta.key)]
            for entry in matched:
                self._pin(entry, pinned)
            return len(matched)
        finally:
            self._flush()

    # -- internals --------------------------------------------------------------------------------

    def _require_open(self) -> None:
        if self._state != "open":
            what = "closed" if self._state == "closed" else "not open yet: await store.open() first"
            raise FailedPrecondition(f"block store is {what}")

    def _free_where(self, match: Callable[[Entry], bool]) -> int:
        self._require_open()
        try:
            freed = 0
            for entry in [e for e in self._index.values() if match(e)]:
                freed += entry.meta.length
                self._drop(entry)
            return freed
        finally:
            self._flush()

    async def _fetch_and_put(
        self, key: BlockKey, fetch: Callable[[], Awaitable[bytes]], pin: bool
    ) -> CachedBlock:
        data = await fetch()
        if len(data) != key.length:
            raise DataLoss(
                f"block {key}: the store returned {len(data)} bytes, expected {key.length}; the file "
                "may have changed in the store: refresh its metadata and read again"
            )
        return await self.put(key, data, pin=pin)

    def _landed(self, block_id: str, task: asyncio.Task[CachedBlock]) -> None:
        if self._inflight.get(block_id) is task:
            del self._inflight[block_id]
        if not task.cancelled():
            task.exception()  # the waiters got it; do not log it as never retrieved


def _check_length(value: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"{what} must be an integer >= 0, got {value!r}")


def _check_tiers(tiers: Sequence[TierConfig]) -> None:
    if not tiers:
        raise InvalidArgument("block store: configure at least one cache tier")
    for config in tiers:
        if not isinstance(config, TierConfig):
            raise InvalidArgument(f"block store: tiers must be TierConfig, got {config!r}")
    media = [c.medium for c in tiers]
    if len(set(media)) != len(media) or media != sorted(media, key=MEDIA.index):
        raise InvalidArgument(
            f"block store: list at most one tier per medium, fastest first (MEM, SSD, HDD); got {media}"
        )
    seen: dict[Path, str] = {}
    for config in tiers:
        for d in config.dirs:
            other = seen.setdefault(d.resolve(), config.medium)
            if other != config.medium:
                raise InvalidArgument(
                    f"block store: directory {d} is used by tiers {other} and {config.medium}; "
                    "give each tier its own directories"
                )
