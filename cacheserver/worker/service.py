"""The worker's gRPC service: serve blocks from the tiered store, fetch misses from the
store (one request per block however many readers wait), take writes."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from pydantic import BaseModel

from .. import constants, rpcutil
from ..cache.keys import BlockKey
from ..cache.store import BlockCorrupt, BlockStore, CachedBlock
from ..config import ServerConfig
from ..blockrefs import block_count, key_of, ref_of
from ..errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, StrataError, Unavailable
from ..namespace.metadata import is_upload_path
from ..namespace.paths import is_under, normalize
from ..proto import strata_pb2 as pb
from ..proto import strata_pb2_grpc as pb_grpc
from ..ufs import UfsStatus, VersionChanged
from .geometry import FileStatuses
from .mounts import MountView, WorkerMounts
from .uploads import UploadRecord, Uploads, now_ms

log = logging.getLogger(__name__)

# Background readahead fetches one worker runs at once.
READAHEAD_CONCURRENCY = 4
# Seconds a worker waits for the master's status of a file whose block it fetches.
FILE_STATUS_TIMEOUT = 10.0
# Blocks one CacheBlocks call fetches at once (a load sends a few blocks per call).
CACHE_BLOCKS_CONCURRENCY = 4
# Seconds for the master calls of a write (prepare, commit, withdraw).
MASTER_WRITE_TIMEOUT = 30.0
# Versions of files written into the cache (MUST_CACHE, ASYNC_THROUGH) start with this; their
# blocks are pinned until the file is in the store.
WRITTEN_VERSION_PREFIX = "w-"


@dataclass
class Counters:
    """What a worker counts; heartbeats carry it to the master, /metrics shows it."""

    hits: int = 0
    misses: int = 0
    ufs_bytes_read: int = 0
    bytes_served: int = 0
    short_circuit_reads: int = 0
    data_port_reads: int = 0
    # Short-circuit readers that found a bad checksum in a block file and asked for a check.
    short_circuit_rechecks: int = 0


@dataclass
class BlockSource:
    """What a read is served from: an open block file (`fd`, bytes [offset, offset+length)
    of it; the owner closes it; `checksums` of its `chunk_size` chunks) or bytes in memory
    (`data`)."""

    hit: bool
    length: int
    fd: int = -1
    offset: int = 0
    data: bytes = b""
    checksums: tuple[int, ...] = ()
    chunk_size: int = 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class BlockReports:
    """Blocks added and removed since the last heartbeat."""

    added: dict[str, pb.BlockRef] = field(default_factory=dict)
    removed: dict[str, pb.BlockRef] = field(default_factory=dict)

    def on_change(self, added: list[CachedBlock], removed: list[BlockKey]) -> None:
        for block in added:
            ref = ref_of(block.key)
            self.removed.pop(block.key.block_id, None)
            self.added[block.key.block_id] = ref
        for key in removed:
            self.added.pop(key.block_id, None)
            self.removed[key.block_id] = ref_of(key)

    def take(self) -> tuple[list[pb.BlockRef], list[pb.BlockRef]]:
        added, removed = list(self.added.values()), list(self.removed.values())
        self.added.clear()
        self.removed.clear()
        return added, removed


def effective_read_type(request_type: pb.ReadType.ValueType, mount: MountView, config: ServerConfig) -> pb.ReadType.ValueType:
    """The request's read type, else the mount's, else the cluster's."""
    if request_type:
        return request_type
    if mount.info.options.read_type:
        return mount.info.options.read_type
    return pb.ReadType.Value(config.cache_policy.read_type)


def effective_write_type(request_type: pb.WriteType.ValueType, mount: MountView, config: ServerConfig) -> pb.WriteType.ValueType:
    """The request's write type, else the mount's, else the cluster's."""
    if request_type:
        return request_type
    if mount.info.options.write_type:
        return mount.info.options.write_type
    return pb.WriteType.Value(config.cache_policy.write_type)


class WorkerService(pb_grpc.WorkerServicer):
    def __init__(
        self,
        *,
        config: ServerConfig,
        worker_id: str,
        store: BlockStore,
        mounts: WorkerMounts,
        master: Callable[[], pb_grpc.MasterStub],
        peers: Callable[[], list[pb.WorkerInfo]],
        peer_stub: Callable[[pb.WorkerInfo], pb_grpc.WorkerStub],
        staging_dir: Path,
    ) -> None:
        self.config = config
        self.worker_id = worker_id
        self.store = store
        self.mounts = mounts
        self._master = master
        self._peers = peers
        self._peer_stub = peer_stub
        self.counters = Counters()
        self._readahead = asyncio.Semaphore(READAHEAD_CONCURRENCY)
        self._readahead_pending: set[str] = set()
        self._background: set[asyncio.Task[object]] = set()
        self.uploads = Uploads(staging_dir, master=master, mounts=mounts,
                               release=lambda refs, keep_pinned: self._unpin(refs, pinned=keep_pinned))
        self.statuses = FileStatuses(self._file_status, store_status=self._store_status)

    async def _file_status(self, path: str, *, refresh: bool = False) -> pb.FileInfo:
        try:
            info: pb.FileInfo = await self._master().GetStatus(pb.GetStatusRequest(path=path, refresh=refresh),
                                                               timeout=FILE_STATUS_TIMEOUT)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Unavailable(f"the master did not tell the status of {path} within "
                                  f"{FILE_STATUS_TIMEOUT:g}s") from exc
            raise rpcutil.raise_from_rpc_error(exc, f"status of {path} from the master") from exc
        return info

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
        return pb.FileInfo(path=ref.path, name=status.name, mount_id=mount.mount_id, version=status.version,
                           block_size=self.config.block_size, length=status.length, persisted=True,
                           store_version=status.version, mtime_unix_ms=status.mtime_unix_ms)

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

    # -- block cache -------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, object], name: str) -> None:
        task: asyncio.Task[object] = asyncio.ensure_future(coro)
        task.set_name(name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def ensure_cached(self, ref: pb.BlockRef, *, promote: bool = False) -> tuple[CachedBlock, bool]:
        """The block in the store, fetched from the mount's store on a miss."""
        key = key_of(ref)
        mount = await self.mounts.get(ref.mount_id)

        async def fetch() -> bytes:
            return await self._read_store(ref, key.offset, key.offset + key.length)

        block, hit = await self.store.get_or_fetch(
            key, fetch, promote=promote, pin=mount.is_pinned(ref.path)
        )
        if hit:
            self.counters.hits += 1
        return block, hit

    async def read_uncached(self, ref: pb.BlockRef, offset: int, length: int) -> bytes:
        """Bytes straight from the store, when the cache cannot take the block."""
        start = key_of(ref).offset + offset
        return await self._read_store(ref, start, start + length)

    async def _read_store(self, ref: pb.BlockRef, start: int, end: int) -> bytes:
        """Bytes [start, end) of the file `ref` names, from the store, of the version the
        namespace gives it. If the store holds another version now, the master is told to
        look again (so that the reader's next open names the new version) before the reader
        gets the error."""
        version = await self._store_version(ref)
        mount = await self.mounts.get(ref.mount_id)
        try:
            data = await mount.store.read_range(mount.rel(ref.path), start, end, version=version)
        except VersionChanged:
            self.statuses.forget(ref.path)
            try:
                await self._file_status(ref.path, refresh=True)
            except StrataError as exc:
                log.warning("could not have the master look at %s again: %s", ref.path, exc)
            raise
        self.counters.misses += 1
        self.counters.ufs_bytes_read += len(data)
        return data

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

    async def open_block(self, ref: pb.BlockRef, read_type: int, *, check: tuple[int, int] | None = None) -> BlockSource:
        """An open descriptor of the block's file, fetched from the store on a miss. A copy
        found at startup has its checksums verified on its first open; `check` (offset,
        length) verifies the chunks of that range on this open too. A bad copy is dropped and
        fetched again."""
        mount = await self.mounts.get(ref.mount_id)
        promote = effective_read_type(pb.ReadType.ValueType(read_type), mount, self.config) == pb.CACHE_PROMOTE
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
                               chunk_size=block.chunk_size)
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
        effective = effective_read_type(pb.ReadType.ValueType(read_type), mount, self.config)
        if effective == pb.NO_CACHE and self.store.lookup(key_of(ref)) is None:
            source = BlockSource(hit=False, length=length, data=await self.read_uncached(ref, offset, length))
        else:
            try:
                if as_file:
                    source = await self.open_block(ref, effective, check=(offset, length))
                    source.offset, source.length = offset, length
                else:
                    data, hit = await self.read_cached(ref, offset, length, promote=effective == pb.CACHE_PROMOTE)
                    source = BlockSource(hit=hit, length=len(data), data=data)
            except ResourceExhausted as exc:
                # Every tier is full of pinned blocks: serve the reader, cache nothing.
                log.warning("serving block %d of %s uncached: %s", ref.index, ref.path, exc)
                source = BlockSource(hit=False, length=length, data=await self.read_uncached(ref, offset, length))
        self._readahead_from(ref, readahead, effective)
        self.counters.bytes_served += source.length
        return source

    def _readahead_from(self, ref: pb.BlockRef, count: int, read_type: int) -> None:
        if read_type == pb.NO_CACHE or count <= 0 or not ref.block_size:
            return
        blocks = (ref.file_length + ref.block_size - 1) // ref.block_size
        for index in range(ref.index + 1, min(blocks, ref.index + 1 + count)):
            nxt = pb.BlockRef()
            nxt.CopyFrom(ref)
            nxt.index = index
            block_id = key_of(nxt).block_id
            if block_id in self._readahead_pending or self.store.lookup(key_of(nxt)) is not None:
                continue
            self._readahead_pending.add(block_id)
            self._spawn(self._prefetch(nxt, block_id), f"readahead-{block_id[:12]}")

    async def _prefetch(self, ref: pb.BlockRef, block_id: str) -> None:
        try:
            async with self._readahead:
                await self.ensure_cached(ref)
        except StrataError as exc:
            log.debug("readahead of block %d of %s failed: %s", ref.index, ref.path, exc)
        finally:
            self._readahead_pending.discard(block_id)

    # -- reads -------------------------------------------------------------------------------

    @rpcutil.streaming
    async def ReadBlock(self, request: pb.ReadBlockRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ReadBlockChunk]:
        source = await self.read_source(request.block, request.read_type, offset=request.offset, length=request.length,
                                        readahead=request.readahead_blocks, as_file=False)
        data = source.data
        view = memoryview(data)
        step = constants.STREAM_CHUNK_SIZE
        for i in range(0, max(len(data), 1), step):
            yield pb.ReadBlockChunk(data=bytes(view[i:i + step]), cache_hit=source.hit and i == 0)

    @rpcutil.unary
    async def CacheBlocks(self, request: pb.CacheBlocksRequest, context: grpc.aio.ServicerContext) -> pb.CacheBlocksResponse:
        semaphore = asyncio.Semaphore(CACHE_BLOCKS_CONCURRENCY)
        response = pb.CacheBlocksResponse()

        async def one(ref: pb.BlockRef) -> None:
            async with semaphore:
                block, hit = await self.ensure_cached(ref)
            response.bytes_cached += block.length
            if not hit:
                response.bytes_fetched += block.length

        await asyncio.gather(*(one(ref) for ref in request.blocks))
        return response

    # -- writes ------------------------------------------------------------------------------

    async def _cache_file(self, staged: Path, *, mount_id: int, path: str, version: str, length: int, pin: bool, in_store: bool) -> list[pb.BlockRef]:
        """Cache the blocks of a file this worker is writing, here: written bytes enter the
        cache only on the worker that takes the write (no worker accepts block bytes from
        another), under the geometry it commits to the namespace."""
        size = self.config.block_size
        refs = []
        with staged.open("rb") as f:
            for index in range((length + size - 1) // size):
                data = await asyncio.to_thread(f.read, size)
                ref = pb.BlockRef(mount_id=mount_id, path=path, version=version, index=index,
                                  block_size=size, file_length=length, in_store=in_store)
                await self.store.put(key_of(ref), data, pin=pin)
                refs.append(ref)
        return refs

    @rpcutil.unary
    async def WriteFile(self, request_iterator: AsyncIterator[pb.WriteFileChunk], context: grpc.aio.ServicerContext) -> pb.WriteFileResponse:
        staged = self.uploads.new_staged()
        first: pb.WriteFileChunk | None = None
        length = 0
        try:
            with staged.open("wb") as out:
                async for chunk in request_iterator:
                    if first is None:
                        first = chunk
                    out.write(chunk.data)
                    length += len(chunk.data)
            if first is None:
                raise InvalidArgument("WriteFile: empty stream; the first message must name the path")
            path = normalize(first.path)
            mount = await self.mounts.resolve(path)
            mount.check_writable()
            write_type = effective_write_type(first.write_type, mount, self.config)
            write_id = await self._prepare(path, overwrite=first.overwrite)
            return pb.WriteFileResponse(file=await self._write(staged, mount, path, length, write_type, write_id))
        finally:
            if not self.uploads.is_pending(staged):
                staged.unlink(missing_ok=True)

    async def _prepare(self, path: str, *, overwrite: bool) -> str:
        """Ask the master before writing: refuses an existing file (unless overwrite) and
        holds back older uploads of it until this write ends. Returns the write's id."""
        try:
            response = await self._master().PrepareWrite(pb.PrepareWriteRequest(path=path, overwrite=overwrite),
                                                         timeout=MASTER_WRITE_TIMEOUT)
        except grpc.RpcError as exc:
            raise rpcutil.raise_from_rpc_error(exc, f"preparing the write of {path} on the master") from exc
        return str(response.write_id)

    async def _abort(self, path: str, version: str, write_id: str) -> None:
        """Tell the master a write ended without an acknowledgement: its commit (`version`,
        if the master recorded it) is dropped. Best effort: the write's lease runs out anyway."""
        try:
            await self._master().AbortWrite(pb.AbortWriteRequest(path=path, version=version, write_id=write_id),
                                            timeout=MASTER_WRITE_TIMEOUT)
        except grpc.RpcError as exc:
            log.warning("could not withdraw the failed write of %s: %s", path, exc.details() if hasattr(exc, "details") else exc)

    async def _commit(self, path: str, length: int, version: str, persisted: bool, ufs_version: str, write_id: str) -> pb.FileInfo:
        try:
            response = await self._master().CommitFile(pb.CommitFileRequest(
                path=path, length=length, version=version, block_size=self.config.block_size,
                persisted=persisted, worker_id=self.worker_id, ufs_version=ufs_version, write_id=write_id,
            ), timeout=MASTER_WRITE_TIMEOUT)
        except grpc.RpcError as exc:
            raise rpcutil.raise_from_rpc_error(exc, f"committing {path} on the master") from exc
        file: pb.FileInfo = response.file
        return file

    async def _write(self, staged: Path, mount: MountView, path: str, length: int, write_type: pb.WriteType.ValueType,
                     write_id: str) -> pb.FileInfo:
        """Write a staged file with its write type. The writer is answered only when the
        write type's promise holds (THROUGH, CACHE_THROUGH: in the store; ASYNC_THROUGH:
        staged durably here and committed; MUST_CACHE: cached and committed); on an error
        nothing of the file stays."""
        if write_type in (pb.THROUGH, pb.CACHE_THROUGH):
            return await self._write_through(
                mount, path, length, write_id, put=lambda: mount.store.write_file(mount.rel(path), staged),
                cache_from=staged if write_type == pb.CACHE_THROUGH else None,
            )
        # MUST_CACHE and ASYNC_THROUGH: the cache holds the only copy, so its blocks are
        # pinned (never evicted) until the file is in the store or removed.
        version = f"{WRITTEN_VERSION_PREFIX}{uuid.uuid4().hex}"
        refs: list[pb.BlockRef] = []
        try:
            if write_type == pb.ASYNC_THROUGH:
                record = UploadRecord(path=path, mount_id=mount.mount_id, version=version, length=length,
                                      block_size=self.config.block_size, acknowledged=False, staged_unix_ms=now_ms(),
                                      write_id=write_id)
                await asyncio.to_thread(self.uploads.begin, staged, record)
            refs = await self._cache_file(staged, mount_id=mount.mount_id, path=path, version=version,
                                          length=length, pin=True, in_store=False)
            file = await self._commit(path, length, version, False, "", write_id)
            if write_type == pb.ASYNC_THROUGH:
                await self.uploads.acknowledge(staged)
            return file
        except BaseException:
            if write_type == pb.ASYNC_THROUGH and self.uploads.is_pending(staged):
                await asyncio.shield(self.uploads.abort(staged))
            else:
                await asyncio.shield(self._withdraw(path, version, refs, write_id))
            raise

    async def _withdraw(self, path: str, version: str, refs: list[pb.BlockRef], write_id: str) -> None:
        """Undo a MUST_CACHE write that could not be acknowledged: its commit, if the master
        recorded it, and its blocks."""
        await self._abort(path, version, write_id)
        await self._unpin(refs, pinned=False)

    async def _write_through(self, mount: MountView, path: str, length: int, write_id: str, *,
                             put: Callable[[], Coroutine[Any, Any, UfsStatus]], cache_from: Path | None) -> pb.FileInfo:
        """Put the file into the store (`put`), cache it from `cache_from` if given, then
        commit it. Not acknowledged (an error anywhere): nothing of it stays listed."""
        rel = mount.rel(path)
        try:
            status = await put()
        except BaseException:
            await asyncio.shield(self._abort(path, "", write_id))
            raise
        try:
            if cache_from is not None:
                try:
                    await self._cache_file(cache_from, mount_id=mount.mount_id, path=path, version=status.version,
                                           length=length, pin=False, in_store=True)
                except (StrataError, OSError) as exc:  # the file is in the store: it is written
                    log.warning("wrote %s to the store but could not cache it: %s", path, exc)
            return await self._commit(path, length, status.version, True, status.version, write_id)
        except BaseException:
            # Not acknowledged: what went to the store must not stay listed.
            try:
                await asyncio.shield(mount.store.rm(rel))
            except (StrataError, OSError) as exc:
                log.warning("could not remove %s from the store after its write failed: %s", path, exc)
            await asyncio.shield(self._abort(path, "", write_id))
            raise

    async def _unpin(self, refs: list[pb.BlockRef], *, pinned: bool) -> None:
        """Release written blocks unless they stay `pinned`. They live on this worker, the
        one that took the write (no call places block bytes on another worker), so they are
        released here only."""
        if not pinned:
            self._pin(pb.PinBlocksRequest(blocks=refs, pinned=False))

    # -- copies and appends -----------------------------------------------------------------

    async def _block_bytes(self, ref: pb.BlockRef, holders: list[str]) -> bytes:
        """One block of a file for a copy: from this worker's cache, else the store, else
        (a file not in the store yet) from a peer holding it."""
        key = key_of(ref)
        length = key.length
        if self.store.lookup(key) is not None:
            try:
                return await self.store.read(key, 0, length)
            except (BlockCorrupt, NotFound) as exc:  # bad or evicted since: look elsewhere
                log.debug("block %d of %s: %s", ref.index, ref.path, exc)
        if ref.in_store:
            return await self.read_uncached(ref, 0, length)
        peers = {p.worker_id: p for p in self._peers()}
        errors = []
        for worker_id in [h for h in holders if h in peers and h != self.worker_id]:
            request = pb.ReadBlockRequest(block=ref, length=length)
            try:
                chunks = [c.data async for c in self._peer_stub(peers[worker_id]).ReadBlock(request, timeout=120)]
            except grpc.RpcError as exc:
                errors.append(f"{worker_id}: {exc.details() if hasattr(exc, 'details') else exc}")
                continue
            data = b"".join(chunks)
            if len(data) == length:
                return data
            errors.append(f"{worker_id}: sent {len(data)} of {length} bytes")
        raise FailedPrecondition(
            f"block {ref.index} of {ref.path} is not in the store and no worker holding it answered "
            f"({'; '.join(errors) or 'no holders'}); the file cannot be copied now"
        )

    async def _locate(self, path: str) -> pb.GetBlockLocationsResponse:
        """The file at `path` and its blocks' holders. NotFound if no file."""
        try:
            located: pb.GetBlockLocationsResponse = await self._master().GetBlockLocations(
                pb.GetBlockLocationsRequest(path=path), timeout=30)
        except grpc.RpcError as exc:
            raise rpcutil.raise_from_rpc_error(exc, f"locating the blocks of {path}") from exc
        return located

    async def _stage_existing(self, path: str, out: Any, located: pb.GetBlockLocationsResponse | None = None) -> int:
        """Write the bytes of the file at `path` to `out`; its length. NotFound if no file."""
        located = located or await self._locate(path)
        info: pb.FileInfo = located.file
        for block in located.blocks:
            ref = pb.BlockRef(mount_id=info.mount_id, path=info.path, version=info.version, index=block.index,
                              block_size=info.block_size, file_length=info.length, in_store=info.persisted)
            data = await self._block_bytes(ref, list(block.worker_ids))
            await asyncio.to_thread(out.write, data)
        return int(info.length)

    async def _write_staged(self, staged: Path, path: str, length: int, write_type: pb.WriteType.ValueType,
                            overwrite: bool) -> pb.FileInfo:
        """Write a staged file to `path` with the write type (the mount's if unspecified);
        the staged file is removed unless an ASYNC_THROUGH upload still needs it."""
        try:
            mount = await self.mounts.resolve(path)
            mount.check_writable()
            effective = effective_write_type(write_type, mount, self.config)
            write_id = await self._prepare(path, overwrite=overwrite)
            return await self._write(staged, mount, path, length, effective, write_id)
        finally:
            if not self.uploads.is_pending(staged):
                staged.unlink(missing_ok=True)

    @rpcutil.unary
    async def AppendFile(self, request_iterator: AsyncIterator[pb.WriteFileChunk], context: grpc.aio.ServicerContext) -> pb.WriteFileResponse:
        staged = self.uploads.new_staged()
        try:
            first: pb.WriteFileChunk | None = None
            length = 0
            with staged.open("wb") as out:
                async for chunk in request_iterator:
                    if first is None:
                        first = chunk
                        path = normalize(chunk.path)
                        (await self.mounts.resolve(path)).check_writable()
                        try:
                            length = await self._stage_existing(path, out)
                        except NotFound:
                            length = 0  # appending to nothing makes a new file
                    await asyncio.to_thread(out.write, chunk.data)
                    length += len(chunk.data)
            if first is None:
                raise InvalidArgument("AppendFile: empty stream; the first message must name the path")
        except BaseException:
            staged.unlink(missing_ok=True)
            raise
        return pb.WriteFileResponse(file=await self._write_staged(staged, path, length, first.write_type, overwrite=True))

    @rpcutil.unary
    async def CopyFile(self, request: pb.CopyFileRequest, context: grpc.aio.ServicerContext) -> pb.WriteFileResponse:
        src, dst = normalize(request.src), normalize(request.dst)
        if src == dst:
            raise InvalidArgument(f"cannot copy {src} onto itself")
        mount = await self.mounts.resolve(dst)
        mount.check_writable()
        located = await self._locate(src)
        source = located.file
        write_type = effective_write_type(request.write_type, mount, self.config)
        if source.persisted and source.mount_id == mount.mount_id and write_type in (pb.THROUGH, pb.CACHE_THROUGH):
            # Both in one store: the store copies (S3: server-side), no byte leaves it.
            write_id = await self._prepare(dst, overwrite=request.overwrite)
            file = await self._write_through(mount, dst, int(source.length), write_id, cache_from=None,
                                             put=lambda: mount.store.copy(mount.rel(src), mount.rel(dst)))
            return pb.WriteFileResponse(file=file)
        staged = self.uploads.new_staged()
        try:
            with staged.open("wb") as out:
                length = await self._stage_existing(src, out, located)
        except BaseException:
            staged.unlink(missing_ok=True)
            raise
        file = await self._write_staged(staged, dst, length, write_type, overwrite=request.overwrite)
        return pb.WriteFileResponse(file=file)

    # -- cache management --------------------------------------------------------------------

    def _matcher(self, mount_id: int, prefix: str, keep: Sequence[pb.BlockRef] = ()) -> Callable[[BlockKey], bool]:
        """Blocks of a mount below a prefix, except those of the files (path, version) in
        `keep`."""
        kept = {(ref.path, ref.version) for ref in keep}
        return lambda key: (key.mount_id == mount_id and (not prefix or is_under(key.path, prefix))
                            and (key.path, key.version) not in kept)

    def unpersisted_written(self) -> set[str]:
        """Ids of pinned blocks of files written into the cache: the only copy of a file
        not in the store yet (or pinned by a user). A TTL sweep leaves them alone."""
        return {b.key.block_id for b in self.store.blocks()
                if b.pinned and b.key.version.startswith(WRITTEN_VERSION_PREFIX)}

    @rpcutil.unary
    async def FreeBlocks(self, request: pb.FreeBlocksRequest, context: grpc.aio.ServicerContext) -> pb.FreeBlocksResponse:
        freed = self.store.free(self._matcher(request.mount_id, request.path_prefix, request.keep))
        return pb.FreeBlocksResponse(bytes_freed=freed)

    def _pin(self, request: pb.PinBlocksRequest) -> int:
        if request.blocks:
            ids = {key_of(ref).block_id for ref in request.blocks}
            return self.store.set_pinned(lambda key: key.block_id in ids, request.pinned)
        return self.store.set_pinned(self._matcher(request.mount_id, request.path_prefix, request.keep), request.pinned)

    @rpcutil.unary
    async def PinBlocks(self, request: pb.PinBlocksRequest, context: grpc.aio.ServicerContext) -> pb.PinBlocksResponse:
        return pb.PinBlocksResponse(blocks=self._pin(request))

    async def close(self) -> None:
        await self.uploads.close()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.mounts.close()
        await self.store.close()
