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
import errno
import logging
import mmap
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, ParamSpec, TypeVar

from strata.contract.constants import MEDIA
from strata.contract.errors import DataLoss, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from strata.contract.units import format_size
from ..common.checksums import compute_checksums
from ..common.durable import fsync_dir
from ..common.keys import BlockKey
from .eviction import make_policy
from .files import block_file, copy_atomically, fsync_file, meta_file, remove_block_files, write_atomically
from .metadata import BlockCorrupt, BlockMetadata
from .tiers import Tier, TierConfig

__all__ = ["BlockCorrupt", "BlockStore", "CachedBlock", "TierUsage"]

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

# A block's last access time is written to its sidecar at most this often (seconds), so
# reads do not rewrite sidecars, yet a restart (or a crash) loses at most this much of
# the TTL clock. close() writes the rest.
ACCESS_PERSIST_INTERVAL = 60.0
# The medium whose blocks a power cut takes (and a restart too, in a folder of its own).
MEM = MEDIA[0]
# Writes of one block that may find a disk full (each time after evicting more) before the
# put fails.
DISK_FULL_ATTEMPTS = 3


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


@dataclass(frozen=True)
class TierUsage:
    medium: str
    capacity: int  # bytes: the quota, or less when the tier's disk cannot hold that much
    used: int  # bytes of cached blocks and of writes in progress
    blocks: int
    pinned: int = 0  # bytes of pinned blocks
    quota: int = 0  # the configured quota, bytes


class _Entry:
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
        return CachedBlock(m.key, m.length, self.tier.medium, self.path, m.pinned, m.checksums, m.chunk_size)


class _Changes:
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


async def _finish_in_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run blocking file work in a thread. If the caller is cancelled, wait for the thread
    anyway (it cannot be stopped) so the caller's clean-up sees the files as they end up."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


class BlockStore:
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
        self._tiers = [Tier(config) for config in tiers]
        self._policy = make_policy(eviction)
        self._high = high_watermark
        self._low = low_watermark
        self._on_change = on_change
        self._clock = clock
        self._block_size = block_size
        self._index: dict[str, _Entry] = {}
        self._inflight: dict[str, asyncio.Task[CachedBlock]] = {}
        self._write_lock = asyncio.Lock()
        self._pending = _Changes()
        self._state: Literal["new", "open", "closed"] = "new"
        # Blocks found damaged (bad checksum, wrong size, file gone) and dropped.
        self.corrupt_blocks = 0
        # Blocks evicted from each tier (moved one tier down, or out of the cache), by medium.
        self.evicted: dict[str, int] = {}

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
                self._attach(_Entry(block.meta, tier, block.directory, verified=False))
        if other_size:
            log.info("block store: dropping %d blocks cut with another block size than the "
                     "cluster's %s", len(other_size), format_size(self._block_size or 0))
        if surplus:
            log.info("block store: dropping %d blocks found beyond a quota or twice", len(surplus))
        if other_size or surplus:
            await asyncio.to_thread(_remove_all, other_size + surplus)
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
        async with self._write_lock:
            self._state = "closed"
            stale = [
                (e.meta, meta_file(e.directory, e.block_id))
                for e in self._index.values()
                if e.meta.last_access != e.meta.persisted_access
            ]
            await asyncio.to_thread(_write_sidecars, stale)
            for tier in self._tiers:
                if not tier.owns_dirs:
                    continue
                written = sum(1 for e in self._index.values() if e.tier is tier and _sole_copy(e.meta))
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
                    data, bad = await asyncio.to_thread(_read_chunks, path, meta, start, stop)
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
            bad = await asyncio.to_thread(_check_span, fd, entry.meta, start, stop)
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

    def _open_entry(self, key: BlockKey) -> tuple[int, _Entry]:
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
                bad = _verify_fd(fd, entry.meta)
            except OSError as exc:
                bad = f"cannot read it: {exc.strerror or exc}"
            if bad is not None:
                os.close(fd)
                raise self._corrupt(entry, bad)
            entry.verified = True
        self._touch(entry)
        return fd, entry

    def _corrupt(self, entry: _Entry, problem: str) -> BlockCorrupt:
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

    def _require_open(self) -> None:
        if self._state != "open":
            what = "closed" if self._state == "closed" else "not open yet: await store.open() first"
            raise FailedPrecondition(f"block store is {what}")

    def _attach(self, entry: _Entry) -> None:
        self._index[entry.block_id] = entry
        entry.tier.block_ids.add(entry.block_id)

    def _drop(self, entry: _Entry) -> None:
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

    def _present(self, key: BlockKey) -> _Entry | None:
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

    def _touch(self, entry: _Entry) -> None:
        now = self._clock()
        entry.meta.last_access = now
        self._policy.record_access(entry.block_id)
        if now - entry.meta.persisted_access >= ACCESS_PERSIST_INTERVAL:
            self._write_sidecar(entry)

    def _pin(self, entry: _Entry, pinned: bool) -> None:
        if entry.meta.pinned != pinned:
            entry.meta.pinned = pinned
            self._write_sidecar(entry)

    def _write_sidecar(self, entry: _Entry) -> None:
        durable = _sole_copy_on_disk(entry.meta, entry.tier)
        try:
            entry.meta.write(meta_file(entry.directory, entry.block_id), durable=durable)
            if durable:
                fsync_dir(entry.directory)
        except OSError as exc:
            log.warning("block %s: cannot update its sidecar: %s", entry.meta.key, exc)

    def _free_where(self, match: Callable[[_Entry], bool]) -> int:
        self._require_open()
        try:
            freed = 0
            for entry in [e for e in self._index.values() if match(e)]:
                freed += entry.meta.length
                self._drop(entry)
            return freed
        finally:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        changes, self._pending = self._pending, _Changes()
        added, removed = changes.lists()
        if self._on_change is not None and (added or removed):
            try:
                self._on_change(added, removed)
            except Exception:
                log.exception("block store: on_change callback failed")

    # -- internals: fetch ----------------------------------------------------------------------

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

    # -- internals: placement, eviction, moves ------------------------------------------------

    async def _put_locked(
        self, key: BlockKey, data: bytes, checksums: tuple[int, ...], pin: bool
    ) -> CachedBlock:
        existing = self._index.get(key.block_id)
        if existing is not None and existing.meta.checksums == checksums:
            if pin and not existing.meta.pinned:
                self._pin(existing, True)
                if _sole_copy_on_disk(existing.meta, existing.tier):  # written before as a cached copy
                    await _finish_in_thread(_sync_block, existing.directory, key.block_id)
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
                await _finish_in_thread(_write_block, directory, meta, data, _sole_copy_on_disk(meta, tier))
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
        entry = _Entry(meta, tier, directory, verified=True)
        self._attach(entry)
        self._policy.record_add(entry.block_id)
        block = entry.snapshot()
        self._pending.added(block)
        return block

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

    def _evictable(self, entry: _Entry | None, tier: Tier) -> bool:
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

    async def _evict(self, entry: _Entry) -> None:
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

    async def _promote(self, entry: _Entry) -> None:
        faster = self._tiers[: self._tiers.index(entry.tier)]
        if _sole_copy_on_disk(entry.meta, entry.tier):  # it stays on a disk
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

    async def _move(self, entry: _Entry, dest: Tier, directory: Path) -> bool:
        """Copy a block into `directory` of `dest` (already reserved there), then switch the
        entry over and delete the old files. True when the block has left its old tier
        (moved, or dropped by someone else meanwhile); False if the copy failed."""
        block_id, nbytes = entry.block_id, entry.meta.length
        copied = replace(entry.meta, medium=dest.medium)
        try:
            await _finish_in_thread(_copy_block, entry.directory, directory, copied, _sole_copy_on_disk(copied, dest))
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


# -- file work done in threads ------------------------------------------------------------------


def _sole_copy(meta: BlockMetadata) -> bool:
    """Is this block the only copy of its bytes (a written file's pinned block)?"""
    return meta.pinned and meta.key.written


def _sole_copy_on_disk(meta: BlockMetadata, tier: Tier) -> bool:
    """Must this block's files be on the disk when they are written (see the module doc)?"""
    return _sole_copy(meta) and tier.medium != MEM


def _write_block(directory: Path, meta: BlockMetadata, data: bytes, durable: bool) -> None:
    write_atomically(block_file(directory, meta.key.block_id), data, durable=durable)
    meta.write(meta_file(directory, meta.key.block_id), durable=durable)
    if durable:
        fsync_dir(directory)


def _copy_block(src_dir: Path, dst_dir: Path, meta: BlockMetadata, durable: bool) -> None:
    block_id = meta.key.block_id
    copy_atomically(block_file(src_dir, block_id), block_file(dst_dir, block_id), durable=durable)
    meta.write(meta_file(dst_dir, block_id), durable=durable)
    if durable:
        fsync_dir(dst_dir)


def _sync_block(directory: Path, block_id: str) -> None:
    """Put a block's files, written without fsync, on the disk."""
    fsync_file(block_file(directory, block_id))
    fsync_file(meta_file(directory, block_id))
    fsync_dir(directory)


def _remove_all(blocks: list[tuple[Path, str]]) -> None:
    for directory, block_id in blocks:
        remove_block_files(directory, block_id)


def _write_sidecars(sidecars: list[tuple[BlockMetadata, Path]]) -> None:
    for meta, path in sidecars:
        try:
            meta.write(path)
        except OSError as exc:
            log.warning("cannot write sidecar %s: %s", path, exc)


def _pread_exactly(fd: int, start: int, nbytes: int) -> bytes:
    """Up to `nbytes` from `start`; shorter only at the end of the file."""
    data = os.pread(fd, nbytes, start)
    if len(data) == nbytes or not data:
        return data
    parts = [data]
    got = len(data)
    while got < nbytes:
        more = os.pread(fd, nbytes - got, start + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _read_chunks(path: Path, meta: BlockMetadata, start: int, stop: int) -> tuple[bytes, int | None]:
    """Bytes [start, stop) (chunk-aligned) of a block file and the first bad chunk, if any."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = _pread_exactly(fd, start, stop - start)
    finally:
        os.close(fd)
    if len(data) < stop - start:
        return data, (start + len(data)) // meta.chunk_size
    return data, meta.bad_chunk(data, start)


def _verify_fd(fd: int, meta: BlockMetadata) -> str | None:
    """What is wrong with the whole block behind `fd`, or None."""
    data = _pread_exactly(fd, 0, meta.length + 1)
    if len(data) != meta.length:
        return f"file has {len(data)} bytes, expected {meta.length}"
    bad = meta.bad_chunk(data, 0)
    return None if bad is None else f"chunk {bad} failed its CRC-32C check"


def _check_span(fd: int, meta: BlockMetadata, start: int, stop: int) -> str | None:
    """What is wrong with the chunk-aligned bytes [start, stop) of the block file behind `fd`,
    or None. Reads them through a map of the file: no copy, and they stay in the page cache
    for the sender."""
    if start >= stop:
        return None
    size = os.fstat(fd).st_size
    if size != meta.length:  # a map past the end of a file faults on access
        return f"file has {size} bytes, expected {meta.length}"
    with mmap.mmap(fd, meta.length, prot=mmap.PROT_READ) as mapped:
        view = memoryview(mapped)
        try:
            bad = meta.bad_chunk(view[start:stop], start)
        finally:
            view.release()
    return None if bad is None else f"chunk {bad} failed its CRC-32C check"


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
