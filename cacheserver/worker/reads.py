"""The worker's reads: serve blocks from the tiered store, fetch misses (one request per
block however many readers wait) from a live worker that holds them, else from the store
under the namespace's name for them, read ahead of sequential readers. Every transport (gRPC, the data port, the short-circuit
socket) reads through `BlockReads`."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from cachetools import TTLCache

from strata.contract.config import ServerConfig
from strata.contract.constants import MAX_READAHEAD_BLOCKS
from strata.contract.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    StrataError,
    Unavailable,
    Unreachable,
)
from strata.contract.modes import ReadType
from strata.contract.proto import strata_pb2 as pb
from ..background import BackgroundTasks
from ..cache.index import CachedBlock
from ..cache.store import BlockCorrupt, BlockStore
from ..common.blockrefs import key_of
from ..common.checksums import CHUNK_SIZE, compute_checksums
from ..namespace.permissions import is_upload_path
from ..ufs import VersionChanged
from .geometry import STATUS_PATIENCE, STATUSES_KEPT, FileStatuses
from .folderahead import LISTING_DEADLINE, FolderReadahead
from .folders import FolderListings
from .kept import KeptStatuses
from .masterlink import MasterLink
from .mounts import MountView, WorkerMounts
from .outagestatuses import OutageStatuses, store_file_info
from .settings import FolderReadaheadSettings

log = logging.getLogger(__name__)

# Background readahead fetches one worker runs at once.
READAHEAD_CONCURRENCY = 4
# Blocks one CacheBlocks call fetches at once (a load sends a few blocks per call).
CACHE_BLOCKS_CONCURRENCY = 4
# Seconds after the master answered a one-block file's status with no byte of it cached
# anywhere (FileInfo.cached_bytes 0) during which a miss of its block goes to the store
# without asking the master where it is (LocateBlocks answers from the same block index). A
# block another worker caches within that time is fetched from the store once more: the
# right bytes, one request; a cold open saves a master round trip before its store read.
HELD_NOWHERE_FOR = 1.0


@dataclass
class Counters:
    """What a worker counts; heartbeats carry it to the master, /metrics shows it."""

    hits: int = 0
    misses: int = 0
    ufs_bytes_read: int = 0
    bytes_served: int = 0
    short_circuit_reads: int = 0
    data_port_reads: int = 0
    # Opens answered in a block socket's thread from a kept status and block (worker/keptopens.py).
    kept_opens: int = 0
    # Statuses of read-only mounts' files answered from their stores while the master was away.
    outage_statuses: int = 0
    # Short-circuit readers that found a bad checksum in a block file and asked for a check.
    short_circuit_rechecks: int = 0
    # Misses served by a copy from the worker holding the block (not fetched from the store).
    peer_reads: int = 0
    peer_bytes_read: int = 0
    # Bytes of this worker's blocks sent to workers that missed them.
    peer_bytes_served: int = 0
    # Small files fetched ahead of their readers, and their bytes (worker/folderahead.py).
    folder_readahead_files: int = 0
    folder_readahead_bytes: int = 0
    # Bytes handed out, by (path, client): the transport that served them (SERVED_PATHS) and
    # the kind of reader that asked (`blockwire.client_label`), counted by the transports.
    served_bytes: Counter[tuple[str, str]] = field(default_factory=Counter)
    # Hits and misses by mount id, and bytes of the blocks hit by the tier holding them.
    hits_by_mount: Counter[int] = field(default_factory=Counter)
    misses_by_mount: Counter[int] = field(default_factory=Counter)
    hit_bytes_by_medium: Counter[str] = field(default_factory=Counter)

    def hit(self, mount_id: int, medium: str, length: int) -> None:
        """A read of a block this worker holds (a reader's on this node, or a worker's that
        missed it: either way the store was not asked), `length` bytes of it on `medium`."""
        self.hits += 1
        self.hits_by_mount[mount_id] += 1
        self.hit_bytes_by_medium[medium] += length


# The paths bytes are served over: the short-circuit socket, the data port, gRPC's ReadBlock.
SERVED_PATHS = ("short_circuit", "data_port", "grpc")


def on_chunks(offset: int, length: int, block_length: int) -> bool:
    """Whether [offset, offset+length) of a block starts on one of its CHUNK_SIZE chunks and
    ends on one (or at the block's end)."""
    end = offset + length
    return offset % CHUNK_SIZE == 0 and (end % CHUNK_SIZE == 0 or end == block_length)


@dataclass
class BlockSource:
    """What a read is served from: an open block file (`fd`, bytes [offset, offset+length)
    of it; the owner closes it; `checksums` of its `chunk_size` chunks, `block_length` its
    size) or bytes in memory (`data`)."""

    hit: bool
    length: int
    fd: int = -1
    offset: int = 0
    data: bytes = b""
    checksums: tuple[int, ...] = ()
    chunk_size: int = 0
    block_length: int = 0

    def sent_checksums(self) -> tuple[int, ...]:
        """CRC-32C of each CHUNK_SIZE piece of the bytes this source serves, for the reader
        to check (`blockwire`). Bytes in memory (checked against the block's checksums when
        they were read) get checksums made from them. A block file is served only at a range
        that starts on one of its CHUNK_SIZE chunks and ends on one (or at the block's end):
        it goes out with the file's own checksums, so the check spans disk to reader."""
        if self.fd < 0:
            return compute_checksums(self.data)
        start, end = self.offset, self.offset + self.length
        if self.chunk_size != CHUNK_SIZE or not on_chunks(start, self.length, self.block_length):
            raise ValueError(f"bytes {start}-{end} of a block file in chunks of {self.chunk_size} have no "
                             "checksums of their own: serve them from memory")
        return self.checksums[start // CHUNK_SIZE : -(-end // CHUNK_SIZE)]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def effective_read_type(request_type: pb.ReadType.ValueType, mount: MountView, config: ServerConfig) -> pb.ReadType.ValueType:
    """The request's read type, else the mount's, else the cluster's."""
    if request_type:
        return request_type
    if mount.info.options.read_type:
        return mount.info.options.read_type
    return config.cache_policy.read_type.to_proto()


# Bytes [offset, offset+length) (length 0: to its end) of a block this worker misses, from a
# live worker holding it; None: fetch it from the store (`Peers.held_elsewhere`).
HeldElsewhere = Callable[[pb.BlockRef, int, int], Awaitable["bytes | None"]]


async def held_nowhere(ref: pb.BlockRef, offset: int, length: int) -> bytes | None:
    return None


def only_block(info: pb.FileInfo) -> pb.BlockRef:
    """The first (for a small file, only) block of the file `info` describes."""
    return pb.BlockRef(mount_id=info.mount_id, path=info.path, version=info.version, index=0,
                       block_size=info.block_size, file_length=info.length, in_store=info.persisted)


class BlockReads:
    """Blocks for readers, from the cache, another worker's cache or the store."""

    def __init__(self, *, config: ServerConfig, worker_id: str, store: BlockStore, mounts: WorkerMounts,
                 link: MasterLink, counters: Counters, held_elsewhere: HeldElsewhere = held_nowhere,
                 folder_readahead: FolderReadaheadSettings | None = None) -> None:
        self.config = config
        self._held_elsewhere = held_elsewhere
        self.worker_id = worker_id
        self.store = store
        self.mounts = mounts
        self._link = link
        self.counters = counters
        # The master's reusable answers, for the opens of this node's readers (worker/kept.py).
        self.kept = KeptStatuses(current=mounts.is_current)
        self.folders = FolderListings(link, self.kept, current=mounts.is_current,  # worker/folders.py
                                      read_only=self._in_read_only_mount)
        self._asking: dict[str, asyncio.Future[pb.FileInfo]] = {}  # path -> the master's status on its way
        # Statuses of read-only mounts' files from their stores while the master is away.
        self.outage = OutageStatuses(mounts, block_size=config.block_size, patience=STATUS_PATIENCE,
                                     readahead_blocks=config.cache_policy.readahead_blocks)
        self.statuses = FileStatuses(link.file_status, store_status=self._store_status,
                                     on_answer=self._answered, kept=self.kept.get)
        # (path, version) of files the master said no worker holds a byte of, for a second.
        self._held_nowhere: TTLCache[tuple[str, str], bool] = TTLCache(maxsize=STATUSES_KEPT, ttl=HELD_NOWHERE_FOR)
        self._readahead = asyncio.Semaphore(READAHEAD_CONCURRENCY)
        self._readahead_pending: set[str] = set()
        self._tasks = BackgroundTasks()
        # The small files of folders readers open cold, fetched ahead (worker/folderahead.py).
        self.ahead = FolderReadahead(folder_readahead or FolderReadaheadSettings(), pages=self._listed_pages,
                                     fetch=self._fetch_ahead, held=lambda info: self.store.lookup(key_of(only_block(info))) is not None,
                                     full=lambda share: self.store.used_share() >= share,
                                     listable=self._in_read_only_mount)

    def _answered(self, info: pb.FileInfo, sent: float) -> None:
        """Take the master's answer to a status question sent at `sent`: kept for the node's
        opens, and noted while HELD_NOWHERE_FOR when no worker held a byte of the file and
        it is one block (the blocks of a larger one are fetched by several workers at once,
        in a load: one may hold a block moments after the master said none did)."""
        self.kept.put(info, sent)
        file = (info.path, info.version)
        if info.persisted and not info.is_dir and info.cached_bytes == 0 and info.length <= info.block_size:
            self._held_nowhere[file] = True
        else:
            self._held_nowhere.pop(file, None)

    async def _listed_pages(self, path: str) -> AsyncGenerator[Sequence[pb.FileInfo], None]:
        """The master's listing of a folder for its read-ahead, a page at a time. Each entry
        is kept as the master's status of its file (not published: as the entries of a
        listing for the node's readers are, worker/folders.py), valid from when the listing
        was asked for: the folder's opens that follow need no question to the master."""
        asked = time.monotonic()
        pages = self._link.folder_pages(path, timeout=LISTING_DEADLINE)
        try:
            async for page in pages:
                for info in page:
                    if not info.is_dir:
                        self.kept.put(info, asked, publish=False)
                yield page
        finally:
            await pages.aclose()

    def _in_read_only_mount(self, path: str) -> bool:
        mount = self.mounts.covering(path)
        return mount is not None and mount.info.options.read_only

    # -- what a miss may fetch ---------------------------------------------------------------

    async def _store_status(self, ref: pb.BlockRef) -> pb.FileInfo | None:
        """The file as the store alone describes it (for FileStatuses while the master does
        not answer): an object under the mount the worker already knows covers its path,
        cut at this cluster's block size. None for a directory or another mount's path."""
        mount = self.mounts.covering(ref.path)
        if mount is None or mount.mount_id != ref.mount_id:
            return None
        rel = mount.rel(ref.path)
        if is_upload_path(rel):
            return None
        status = await mount.store.info(rel)
        if status.is_dir:
            return None
        return store_file_info(mount, ref.path, status, block_size=self.config.block_size)

    async def _store_version(self, ref: pb.BlockRef) -> str:
        """The store's version of the object the block `ref` names is read from. Refuses
        to fetch a block from the store unless the namespace says the reader's file is that
        file now and it is in the store: bytes fetched are kept (or served) under the
        reader's name for them, so that name must be the true one; the store read then
        insists on this version (`Store.read_range`), so an object changed in the store
        since the namespace last looked is refused rather than cached under the old name."""
        if ref.in_store:
            info = await self.statuses.check(ref)
            if info.persisted:
                return info.store_version or info.version
        raise FailedPrecondition(
            f"block {ref.index} of {ref.path} is not cached on worker {self.worker_id} and "
            "the file is not in the store yet (written with MUST_CACHE or not yet persisted)"
        )

    async def _read_store(self, ref: pb.BlockRef, start: int, end: int,
                          version: asyncio.Future[str] | None = None) -> bytes:
        """Bytes [start, end) of the file `ref` names, from the store, of the version the
        namespace gives it. If the store holds another version now, the master is told to
        look again (so that the reader's next open names the new version) before the reader
        gets the error. The block lies within the file the namespace describes, so the store
        must send every byte asked for (DataLoss otherwise): a short answer served as is would
        leave a reader waiting for bytes promised and never sent, or a copy with bytes missing."""
        wanted = await (version if version is not None else self._store_version(ref))
        mount = await self.mounts.get(ref.mount_id)
        try:
            data = await mount.store.read_range(mount.rel(ref.path), start, end, version=wanted, exact=True)
        except VersionChanged:
            self.statuses.forget(ref.path)
            self.kept.forget(ref.path)
            self.folders.forget_file(ref.path)
            try:
                await self._link.file_status(ref.path, refresh=True)
            except StrataError as exc:
                log.warning("could not have the master look at %s again: %s", ref.path, exc)
            raise
        self.counters.misses += 1
        self.counters.misses_by_mount[ref.mount_id] += 1
        self.counters.ufs_bytes_read += len(data)
        return data

    # -- the cache ---------------------------------------------------------------------------

    async def ensure_cached(self, ref: pb.BlockRef, *, promote: bool = False, reader: bool = True,
                            on_store: Callable[[int], None] | None = None) -> tuple[CachedBlock, bool]:
        """The block in the store, fetched from the mount's store on a miss (`on_store` is
        told the bytes read from the store, not from a peer). A `reader`'s (not a load's nor a
        read-ahead's) open of a small file counts towards its folder's read-ahead."""
        key = key_of(ref)
        mount = await self.mounts.get(ref.mount_id)

        async def fetch() -> bytes:
            return await self._read_missed(ref, 0, key.length, on_store)

        block, hit = await self.store.get_or_fetch(
            key, fetch, promote=promote, pin=mount.is_pinned(ref.path)
        )
        if hit:
            self.counters.hit(ref.mount_id, block.medium, block.length)
        if reader and ref.index == 0 and self.ahead.small(ref.file_length, ref.block_size):
            self.ahead.opened(ref.path, ref.file_length, cold=not hit)
        return block, hit

    async def _fetch_ahead(self, info: pb.FileInfo) -> None:
        """Cache the only block of the small file `info` describes, and keep where it lies
        with the file's status: the folder's read-ahead. A file the listing says a worker
        caches is copied from it (a block any worker holds is not fetched from the store
        again); otherwise, or when no holder sends it, the store serves the version `info`
        names (the store's read insists on it)."""
        ref = only_block(info)
        key = key_of(ref)
        mount = await self.mounts.get(ref.mount_id)
        version: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        version.set_result(info.store_version or info.version)

        async def fetch() -> bytes:
            data = await self._from_peers(ref, 0, key.length) if info.cached_bytes else None
            if data is not None:
                return self._copied(data)
            return await self._read_store(ref, key.offset, key.offset + key.length, version)

        block, hit = await self.store.get_or_fetch(key, fetch, pin=mount.is_pinned(ref.path))
        if not hit:
            self.counters.folder_readahead_files += 1
            self.counters.folder_readahead_bytes += block.length
            # Its status is kept from the listing (`_listed_pages`): the socket threads answer
            # the file's first open too (worker/keptopens.py), without a turn of the loop.
            await self._keep_block(info, ref)

    async def cache_blocks(self, refs: list[pb.BlockRef]) -> tuple[int, int, int]:
        """Have the blocks cached (a load); (bytes cached, bytes of them fetched now, bytes
        of those read from the store rather than copied from a peer)."""
        semaphore = asyncio.Semaphore(CACHE_BLOCKS_CONCURRENCY)
        cached = fetched = from_store = 0

        def stored(n: int) -> None:
            nonlocal from_store
            from_store += n

        async def one(ref: pb.BlockRef) -> None:
            nonlocal cached, fetched
            async with semaphore:
                block, hit = await self.ensure_cached(ref, reader=False, on_store=stored)
            cached += block.length
            if not hit:
                fetched += block.length

        await asyncio.gather(*(one(ref) for ref in refs))
        return cached, fetched, from_store

    async def _read_missed(self, ref: pb.BlockRef, offset: int, length: int,
                           on_store: Callable[[int], None] | None = None) -> bytes:
        """Bytes [offset, offset+length) of a block this worker misses: from a live worker
        that holds it (checked in transit), else from the store. The namespace is asked for
        the version a store fetch needs while the holders are: a master that does not answer
        costs the reader one wait, not two in a row."""
        version = asyncio.ensure_future(self._store_version(ref))
        # Its refusal matters only to a store fetch (which awaits it and gets it then).
        version.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            data = await self._from_peers(ref, offset, length)
        except BaseException:
            version.cancel()
            raise
        if data is not None:
            version.cancel()
            return self._copied(data)
        start = key_of(ref).offset + offset
        data = await self._read_store(ref, start, start + length, version)
        if on_store is not None:
            on_store(len(data))
        return data

    def _copied(self, data: bytes) -> bytes:
        """`data`, copied from another worker, counted as such."""
        self.counters.peer_reads += 1
        self.counters.peer_bytes_read += len(data)
        return data

    async def _from_peers(self, ref: pb.BlockRef, offset: int, length: int) -> bytes | None:
        """The bytes from a live worker holding the block (`held_elsewhere`); None at once,
        without asking the master where the block is, for a file it said a moment ago no
        worker holds (HELD_NOWHERE_FOR): the store serves it."""
        if self._held_nowhere.get((ref.path, ref.version)):
            return None
        return await self._held_elsewhere(ref, offset, length)

    async def read_uncached(self, ref: pb.BlockRef, offset: int, length: int) -> bytes:
        """Bytes of a block not cached here, when the cache cannot take the block: from the
        worker holding it, else straight from the store."""
        return await self._read_missed(ref, offset, length)

    async def read_cached(self, ref: pb.BlockRef, offset: int, length: int, *, promote: bool) -> tuple[bytes, bool]:
        """Bytes [offset, offset+length) of a block, refetching once if the cached copy is bad."""
        for attempt in (1, 2):
            block, hit = await self.ensure_cached(ref, promote=promote)
            try:
                data = await self.store.read(block.key, offset, length)
            except BlockCorrupt as exc:
                log.warning("dropped bad block %s of %s: %s", ref.index, ref.path, exc)
                if attempt == 2:
                    raise
                continue
            return data, hit
        raise AssertionError("unreachable")

    async def whole_block(self, ref: pb.BlockRef) -> bytes | None:
        """The whole block from this worker's cache without fetching it; None when it is not
        here (or its copy turned out bad or was evicted meanwhile)."""
        key = key_of(ref)
        if self.store.lookup(key) is None:
            return None
        try:
            return await self.store.read(key, 0, key.length)
        except (BlockCorrupt, NotFound) as exc:  # bad or evicted since: look elsewhere
            log.debug("block %d of %s: %s", ref.index, ref.path, exc)
            return None

    async def held_source(self, ref: pb.BlockRef, offset: int, length: int) -> BlockSource:
        """Bytes [offset, offset+length) (length 0: to its end) of a block this worker holds,
        checked against its checksums, for a worker that misses it. NotFound when it is not
        held here (or its copy is bad): never fetched for the asker, who goes to the store."""
        total = key_of(ref).length
        if offset < 0 or length < 0 or offset > total:
            raise InvalidArgument(f"offset {offset} and length {length} do not lie in block {ref.index} "
                                  f"({total} bytes)")
        length = min(length or total - offset, total - offset)
        key = key_of(ref)
        try:
            block = self.store.lookup(key)
            if block is None:
                raise NotFound("not held")
            data = await self.store.read(key, offset, length)
        except (BlockCorrupt, NotFound) as exc:
            raise NotFound(f"worker {self.worker_id} does not hold block {ref.index} of {ref.path} "
                           f"version {ref.version} ({exc})") from None
        self.counters.hit(ref.mount_id, block.medium, len(data))  # the cluster's cache, not the store, served it
        self.counters.peer_bytes_served += len(data)
        return BlockSource(hit=True, length=len(data), data=data)

    # -- what a transport serves -------------------------------------------------------------

    async def open_block(self, ref: pb.BlockRef, read_type: int, *, check: tuple[int, int] | None = None) -> BlockSource:
        """An open descriptor of the block's file, fetched from the store on a miss. A copy
        found at startup has its checksums verified on its first open; `check` (offset,
        length) verifies the chunks of that range on this open too. A bad copy is dropped and
        fetched again."""
        mount = await self.mounts.get(ref.mount_id)
        promote = effective_read_type(ReadType.from_wire(read_type), mount, self.config) == pb.CACHE_PROMOTE
        for attempt in (1, 2):
            block, hit = await self.ensure_cached(ref, promote=promote)
            try:
                if check is None:
                    fd, block = self.store.open_fd(block.key)
                else:
                    fd, block = await self.store.open_checked(block.key, *check)
            except (BlockCorrupt, NotFound) as exc:  # bad, or evicted since it was fetched
                log.warning("block %s of %s: %s", ref.index, ref.path, exc)
                if attempt == 2:
                    raise
                continue
            return BlockSource(hit=hit, length=block.length, fd=fd, checksums=block.checksums,
                               chunk_size=block.chunk_size, block_length=block.length)
        raise AssertionError("unreachable")

    async def read_source(self, ref: pb.BlockRef, read_type: int, *, offset: int, length: int,
                          readahead: int, as_file: bool = True) -> BlockSource:
        """What a read of [offset, offset+length) of a block (length 0: to its end) is served
        from: the block's file (as_file) or its checksummed bytes when it is cached, else bytes
        from the store (read type NO_CACHE, or every tier full of pinned blocks). Starts the
        readahead and counts the bytes served."""
        total = key_of(ref).length
        if offset < 0 or length < 0:
            raise InvalidArgument(f"offset and length must be >= 0, got {offset} and {length}")
        if offset > total:
            raise InvalidArgument(f"offset {offset} is past the end of block {ref.index} ({total} bytes)")
        length = min(length or total, total - offset)
        mount = await self.mounts.get(ref.mount_id)
        effective = effective_read_type(ReadType.from_wire(read_type), mount, self.config)
        if effective == pb.NO_CACHE and self.store.lookup(key_of(ref)) is None:
            source = BlockSource(hit=False, length=length, data=await self.read_uncached(ref, offset, length))
        else:
            try:
                source = await self._cached_source(ref, effective, offset, length, as_file=as_file)
            except ResourceExhausted as exc:
                # Every tier is full of pinned blocks: serve the reader, cache nothing.
                log.warning("serving block %d of %s uncached: %s", ref.index, ref.path, exc)
                source = BlockSource(hit=False, length=length, data=await self.read_uncached(ref, offset, length))
        self._readahead_from(ref, readahead, effective)
        self.counters.bytes_served += source.length
        return source

    async def _cached_source(self, ref: pb.BlockRef, read_type: int, offset: int, length: int, *,
                             as_file: bool) -> BlockSource:
        """Bytes [offset, offset+length) of the block, cached first: its file (`as_file`, a
        range on the file's chunks) or its bytes, checked, in memory."""
        if as_file and on_chunks(offset, length, key_of(ref).length):
            # A range on the file's chunks goes out from the file with the checksums made when
            # the block was cached, and the reader checks them (a block damaged on disk fails
            # there, and the reader's next try drops it).
            source = await self.open_block(ref, read_type)
            if source.chunk_size == CHUNK_SIZE:
                source.offset, source.length = offset, length
                return source
            source.close()  # cut in other chunks
        # Any other range needs checksums of its own: they are made from the bytes checked
        # here, in memory, which are the bytes sent (the file may change between a check of
        # it and a send from it).
        data, hit = await self.read_cached(ref, offset, length, promote=read_type == pb.CACHE_PROMOTE)
        return BlockSource(hit=hit, length=len(data), data=data)

    async def short_circuit(self, ref: pb.BlockRef, read_type: int, *, verify: bool) -> BlockSource:
        """The block's open file for a reader on this host. The reader verifies the chunks it
        reads against the checksums handed with it; one that found a bad chunk asks again
        with `verify`: the whole block is checked first, a damaged copy dropped and the block
        fetched again from the store."""
        if verify:
            self.counters.short_circuit_rechecks += 1
        source = await self.open_block(ref, read_type, check=(0, key_of(ref).length) if verify else None)
        self.counters.short_circuit_reads += 1
        self.counters.bytes_served += source.length
        return source

    async def file_status(self, path: str) -> pb.FileInfo:
        """The master's status of `path` for a reader of this node: the answer kept while it
        is valid (see worker/kept.py), else the master's now. While the master does not
        answer (refused, or silent for STATUS_PATIENCE; once it failed, AWAY_PATIENCE), the
        store's for a read-only mount's file (worker/outagestatuses.py), else the master's
        error (the reader then asks it itself, with its own deadline)."""
        info = self.kept.get(path)
        if info is not None:
            return info
        flight = self._asking.get(path)
        if flight is None:  # the node's processes asking at once share one question
            flight = self._asking[path] = asyncio.ensure_future(self._ask_status(path))
            flight.add_done_callback(lambda _: self._asking.pop(path, None))
        patience = self.outage.patience()
        away: StrataError
        try:
            # The question goes on (shielded): its answer is kept for the next open.
            return await asyncio.wait_for(asyncio.shield(flight), timeout=patience)
        except TimeoutError:
            self.outage.master_failed()
            away = Unavailable(f"the master did not tell the status of {path} within {patience:g}s")
        except Unreachable as exc:
            away = exc
        # A read-only mount's file: the store stands in for the master (worker/outagestatuses.py).
        info = await self.outage.status(path, away)
        self.kept.put(info, time.monotonic())
        self.counters.outage_statuses += 1
        return info

    async def folder_listing(self, path: str) -> tuple[bytes | None, float, bool]:
        """The folder's listing for a reader of this node (worker/folders.py); while the
        master is known to be away it is waited for AWAY_PATIENCE only (the question goes on,
        and its answer is kept): the reader then asks for the file's status, which the store
        answers (worker/outagestatuses.py), instead of waiting out the listing's patience."""
        listing = asyncio.ensure_future(self.folders.listing(path))
        listing.add_done_callback(lambda f: f.cancelled() or f.exception())  # a late failure is no one's
        patience = None if self.outage.away_since is None else self.outage.patience()
        await asyncio.wait({listing}, timeout=patience)
        if not listing.done():
            raise Unavailable(f"the master did not list {path} within {patience:g}s (it is away)")
        try:
            return listing.result()
        except Unreachable:
            self.outage.master_failed()
            raise

    async def _ask_status(self, path: str) -> pb.FileInfo:
        sent = time.monotonic()
        try:
            info = await self._link.file_status(path)
        except (Unreachable, DeadlineExceeded):  # no answer: refused, or silent to the end of the call
            self.outage.master_failed()
            raise
        except StrataError:
            self.outage.master_answered()
            raise
        self.outage.master_answered()
        self._answered(info, sent)
        return info

    async def open_path(self, path: str, read_type: int, *, whole_below: int, fetch: bool,
                        as_file: bool) -> tuple[pb.FileInfo, BlockSource | None]:
        """The status of the file at `path` and, when it is one block of fewer than
        `whole_below` bytes that this worker holds (or, with `fetch`, may fetch from the
        store), the block: its file (`as_file`, for the short-circuit socket) or what the
        data port sends of it. A block that cannot be had now is left out, not an error: the
        reader reads it as any other, and sees the error there."""
        info = await self.file_status(path)
        if info.is_dir or not 0 < info.length <= min(whole_below, info.block_size):
            return info, None
        ref = only_block(info)
        try:
            source = await self._held_source(ref, read_type, as_file=as_file)
            if source is None:
                if not (fetch and ref.in_store):
                    return info, None
                if as_file:
                    source = await self.short_circuit(ref, read_type, verify=False)
                else:
                    source = await self.read_source(ref, read_type, offset=0, length=0, readahead=0)
        except StrataError as exc:
            log.debug("open of %s: its block left to the reader: %s", path, exc)
            return info, None
        if not as_file:
            self.counters.data_port_reads += 1
        if not read_type and source.fd >= 0:
            await self._keep_block(info, ref)
        return info, source

    async def _keep_block(self, info: pb.FileInfo, ref: pb.BlockRef) -> None:
        """Keep where the file's block lies with its kept status, for the next opens of it
        (worker/keptopens.py), unless its reads move it between tiers (CACHE_PROMOTE)."""
        mount = await self.mounts.get(ref.mount_id)
        if effective_read_type(pb.READ_TYPE_UNSPECIFIED, mount, self.config) == pb.CACHE_PROMOTE:
            return
        block = self.store.lookup(key_of(ref))
        if block is not None:
            self.kept.hold_block(info, block)

    async def _held_source(self, ref: pb.BlockRef, read_type: int, *, as_file: bool) -> BlockSource | None:
        """The whole block's open file when this worker holds it and its hit needs nothing
        more (no promotion between tiers): an open's hit, found with one look in the store;
        None otherwise (the reads above serve it). Its checksums go with it, and the reader
        checks the bytes against them (`blockwire`)."""
        mount = await self.mounts.get(ref.mount_id)
        if effective_read_type(ReadType.from_wire(read_type), mount, self.config) == pb.CACHE_PROMOTE:
            return None
        try:
            fd, block = self.store.open_fd(key_of(ref))
        except (NotFound, BlockCorrupt):
            return None
        if not as_file and block.chunk_size != CHUNK_SIZE:  # the data port sends whole chunks' checksums
            os.close(fd)
            return None
        self.counters.hit(ref.mount_id, block.medium, block.length)
        self.counters.bytes_served += block.length
        if as_file:
            self.counters.short_circuit_reads += 1
        if self.ahead.small(ref.file_length, ref.block_size):
            self.ahead.opened(ref.path, ref.file_length, cold=False)
        return BlockSource(hit=True, length=block.length, fd=fd, checksums=block.checksums,
                           chunk_size=block.chunk_size, block_length=block.length)

    # -- readahead ---------------------------------------------------------------------------

    def _readahead_from(self, ref: pb.BlockRef, count: int, read_type: int) -> None:
        """Fetch the `count` blocks after `ref` (at most MAX_READAHEAD_BLOCKS: a request
        asking for more gets that many) in the background."""
        if read_type == pb.NO_CACHE or count <= 0 or not ref.block_size:
            return
        count = min(count, MAX_READAHEAD_BLOCKS)
        blocks = (ref.file_length + ref.block_size - 1) // ref.block_size
        for index in range(ref.index + 1, min(blocks, ref.index + 1 + count)):
            nxt = pb.BlockRef()
            nxt.CopyFrom(ref)
            nxt.index = index
            block_id = key_of(nxt).block_id
            if block_id in self._readahead_pending or self.store.lookup(key_of(nxt)) is not None:
                continue
            self._readahead_pending.add(block_id)
            self._tasks.spawn(self._prefetch(nxt, block_id), f"readahead-{block_id[:12]}")

    async def _prefetch(self, ref: pb.BlockRef, block_id: str) -> None:
        try:
            async with self._readahead:
                await self.ensure_cached(ref, reader=False)
        except StrataError as exc:
            log.debug("readahead of block %d of %s failed: %s", ref.index, ref.path, exc)
        finally:
            self._readahead_pending.discard(block_id)

    async def close(self) -> None:
        """Stop the readahead under way."""
        await self.ahead.close()
        await self._tasks.close()
