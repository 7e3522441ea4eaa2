"""The worker's gRPC service: serve blocks from the tiered store, fetch misses from the
store (one request per block however many readers wait), take writes."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from pydantic import BaseModel

from .. import constants, rpcutil
from ..cache.files import write_atomically
from ..cache.keys import BlockKey
from ..cache.store import BlockCorrupt, BlockStore, CachedBlock
from ..config import ServerConfig
from ..errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, StrataError, Unavailable
from ..blockrefs import block_count, key_of, ref_of
from ..namespace.paths import is_under, normalize
from ..placement import rank_workers
from ..proto import strata_pb2 as pb
from ..proto import strata_pb2_grpc as pb_grpc
from .geometry import FileStatuses
from .mounts import MountView, WorkerMounts

log = logging.getLogger(__name__)

# Background readahead fetches one worker runs at once.
READAHEAD_CONCURRENCY = 4
# Seconds a worker waits for the master's status of a file whose block it fetches.
FILE_STATUS_TIMEOUT = 10.0
# Blocks one CacheBlocks call fetches at once (a load sends a few blocks per call).
CACHE_BLOCKS_CONCURRENCY = 4


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
        self.staging_dir = staging_dir
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        self.counters = Counters()
        self._readahead = asyncio.Semaphore(READAHEAD_CONCURRENCY)
        self._readahead_pending: set[str] = set()
        self._background: set[asyncio.Task[object]] = set()
        self._uploading: set[Path] = set()  # staged ASYNC_THROUGH files being uploaded
        self.statuses = FileStatuses(self._file_status)

    async def _file_status(self, path: str) -> pb.FileInfo:
        try:
            info: pb.FileInfo = await self._master().GetStatus(pb.GetStatusRequest(path=path),
                                                               timeout=FILE_STATUS_TIMEOUT)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Unavailable(f"the master did not tell the status of {path} within "
                                  f"{FILE_STATUS_TIMEOUT:g}s") from exc
            raise rpcutil.raise_from_rpc_error(exc, f"status of {path} from the master") from exc
        return info

    async def _check_in_store(self, ref: pb.BlockRef) -> None:
        """Refuse to fetch a block from the store unless the namespace says the reader's
        file is that file now and it is in the store: bytes fetched are kept (or served)
        under the reader's name for them, so that name must be the true one."""
        if ref.in_store:
            info = await self.statuses.check(ref)
            if info.persisted:
                return
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
            await self._check_in_store(ref)
            data = await mount.store.read_range(mount.rel(key.path), key.offset, key.offset + key.length)
            self.counters.misses += 1
            self.counters.ufs_bytes_read += len(data)
            return data

        block, hit = await self.store.get_or_fetch(
            key, fetch, promote=promote, pin=mount.is_pinned(ref.path)
        )
        if hit:
            self.counters.hits += 1
        return block, hit

    async def read_uncached(self, ref: pb.BlockRef, offset: int, length: int) -> bytes:
        """Bytes straight from the store, when the cache cannot take the block."""
        await self._check_in_store(ref)
        mount = await self.mounts.get(ref.mount_id)
        start = key_of(ref).offset + offset
        data = await mount.store.read_range(mount.rel(ref.path), start, start + length)
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
        staged = self.staging_dir / f"{uuid.uuid4().hex}.part"
        first: pb.WriteFileChunk | None = None
        length = 0
        keep_staged = False
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
            if not first.overwrite:
                await self._refuse_existing(path)
            write_type = effective_write_type(first.write_type, mount, self.config)
            file = await self._write(staged, mount, path, length, write_type)
            keep_staged = write_type == pb.ASYNC_THROUGH
            return pb.WriteFileResponse(file=file)
        finally:
            if not keep_staged:
                staged.unlink(missing_ok=True)

    async def _refuse_existing(self, path: str) -> None:
        try:
            await self._master().GetStatus(pb.GetStatusRequest(path=path), timeout=30)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return
            raise rpcutil.raise_from_rpc_error(exc, f"checking {path}") from exc
        raise AlreadyExists(f"{path} already exists; write with overwrite to replace it")

    async def _commit(self, path: str, length: int, version: str, persisted: bool, ufs_version: str) -> pb.FileInfo:
        try:
            response = await self._master().CommitFile(pb.CommitFileRequest(
                path=path, length=length, version=version, block_size=self.config.block_size,
                persisted=persisted, worker_id=self.worker_id, ufs_version=ufs_version,
            ), timeout=30)
        except grpc.RpcError as exc:
            raise rpcutil.raise_from_rpc_error(exc, f"committing {path} on the master") from exc
        file: pb.FileInfo = response.file
        return file

    async def _write(self, staged: Path, mount: MountView, path: str, length: int, write_type: pb.WriteType.ValueType) -> pb.FileInfo:
        rel = mount.rel(path)
        if write_type in (pb.THROUGH, pb.CACHE_THROUGH):
            status = await mount.store.write_file(rel, staged)
            if write_type == pb.CACHE_THROUGH:
                await self._cache_file(staged, mount_id=mount.mount_id, path=path, version=status.version,
                                       length=length, pin=False, in_store=True)
            return await self._commit(path, length, status.version, True, status.version)
        # MUST_CACHE and ASYNC_THROUGH: the cache holds the only copy, so its blocks are
        # pinned (never evicted) until the file is in the store.
        version = f"w-{uuid.uuid4().hex}"
        refs = await self._cache_file(staged, mount_id=mount.mount_id, path=path, version=version,
                                      length=length, pin=True, in_store=False)
        file = await self._commit(path, length, version, False, "")
        if write_type == pb.ASYNC_THROUGH:
            # What a restarted worker needs to finish the upload (see resume_uploads).
            pending = PendingUpload(path=path, mount_id=mount.mount_id, version=version, length=length,
                                    block_size=self.config.block_size)
            write_atomically(pending_file(staged), pending.model_dump_json().encode())
            self._uploading.add(staged)
            self._spawn(self._persist(staged, mount, path, length, version, refs), f"persist-{path}")
        return file

    async def resume_uploads(self) -> int:
        """Start the ASYNC_THROUGH uploads a previous run of this worker left staged (it was
        stopped or killed before they reached the store); runs on each registration with the
        master. One whose file has changed or gone since is dropped. Returns how many were
        started."""
        started = 0
        for staged in staged_files(self.staging_dir):
            if staged in self._uploading:
                continue
            record = pending_file(staged)
            try:
                pending = PendingUpload.model_validate_json(record.read_bytes())
            except (OSError, ValueError) as exc:
                log.warning("dropping staged upload %s: no readable record of it (%s)", staged.name, exc)
                staged.unlink(missing_ok=True)
                record.unlink(missing_ok=True)
                continue
            current: pb.FileInfo | None = None
            try:
                current = await self._master().GetStatus(pb.GetStatusRequest(path=pending.path), timeout=30)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    log.warning("the staged upload of %s waits for the next start: %s", pending.path, exc.details())
                    continue
            try:
                mount = await self.mounts.get(pending.mount_id)
            except NotFound:
                current = None  # the mount is gone
            if current is None or current.version != pending.version or current.persisted:
                log.info("dropping the staged upload of %s: the file changed or went since", pending.path)
                staged.unlink(missing_ok=True)
                record.unlink(missing_ok=True)
                continue
            refs = [pb.BlockRef(mount_id=pending.mount_id, path=pending.path, version=pending.version, index=i,
                                block_size=pending.block_size, file_length=pending.length, in_store=False)
                    for i in range(block_count(pending.length, pending.block_size))]
            log.info("resuming the upload of %s (%d bytes) to %s", pending.path, pending.length, mount.info.source)
            self._uploading.add(staged)
            self._spawn(self._persist(staged, mount, pending.path, pending.length, pending.version, refs),
                        f"persist-{pending.path}")
            started += 1
        return started

    async def _persist(self, staged: Path, mount: MountView, path: str, length: int, version: str, refs: list[pb.BlockRef]) -> None:
        """ASYNC_THROUGH: upload the staged copy, record it persisted, unpin its blocks."""
        try:
            status = await mount.store.write_file(mount.rel(path), staged)
            await self._commit(path, length, version, True, status.version)
            for ref in refs:
                ref.in_store = True
            await self._unpin(refs, pinned=mount.is_pinned(path))
            log.info("persisted %s (%d bytes) to %s", path, length, mount.info.source)
        except (StrataError, OSError) as exc:
            log.error("could not persist %s to the store: %s; its cached copy stays pinned", path, exc)
        finally:
            staged.unlink(missing_ok=True)
            pending_file(staged).unlink(missing_ok=True)
            self._uploading.discard(staged)

    async def _unpin(self, refs: list[pb.BlockRef], *, pinned: bool) -> None:
        if pinned:
            return
        by_target: dict[str, list[pb.BlockRef]] = {}
        peers = {p.worker_id: p for p in self._peers()}
        for ref in refs:
            ranked = rank_workers(key_of(ref).block_id, peers or [self.worker_id])
            by_target.setdefault(ranked[0], []).append(ref)
        for target, refs_there in by_target.items():
            while refs_there:  # in messages the peer accepts (rpcutil.WORKER_MAX_RECEIVE_BYTES)
                batch, refs_there = rpcutil.split_batch(refs_there)
                request = pb.PinBlocksRequest(blocks=batch, pinned=False)
                if target == self.worker_id or target not in peers:
                    self._pin(request)
                else:
                    try:
                        await self._peer_stub(peers[target]).PinBlocks(request, timeout=30)
                    except grpc.RpcError as exc:
                        log.warning("could not unpin blocks on %s: %s", target, exc)
        # A peer may have been down when the block was placed; unpin any local copies too.
        self._pin(pb.PinBlocksRequest(blocks=refs, pinned=False))

    # -- cache management --------------------------------------------------------------------

    def _matcher(self, mount_id: int, prefix: str) -> Callable[[BlockKey], bool]:
        return lambda key: key.mount_id == mount_id and (not prefix or is_under(key.path, prefix))

    @rpcutil.unary
    async def FreeBlocks(self, request: pb.FreeBlocksRequest, context: grpc.aio.ServicerContext) -> pb.FreeBlocksResponse:
        freed = self.store.free(self._matcher(request.mount_id, request.path_prefix))
        return pb.FreeBlocksResponse(bytes_freed=freed)

    def _pin(self, request: pb.PinBlocksRequest) -> int:
        if request.blocks:
            ids = {key_of(ref).block_id for ref in request.blocks}
            return self.store.set_pinned(lambda key: key.block_id in ids, request.pinned)
        return self.store.set_pinned(self._matcher(request.mount_id, request.path_prefix), request.pinned)

    @rpcutil.unary
    async def PinBlocks(self, request: pb.PinBlocksRequest, context: grpc.aio.ServicerContext) -> pb.PinBlocksResponse:
        return pb.PinBlocksResponse(blocks=self._pin(request))

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.mounts.close()
        await self.store.close()


class PendingUpload(BaseModel):
    """The record kept next to a staged ASYNC_THROUGH file until it is in the store."""

    path: str
    mount_id: int
    version: str
    length: int
    block_size: int


def pending_file(staged: Path) -> Path:
    return staged.with_suffix(".upload.json")


def staged_files(staging_dir: Path) -> list[Path]:
    return sorted(p for p in staging_dir.glob("*.part") if p.is_file()) if staging_dir.is_dir() else []


def remove_stale_staging(staging_dir: Path) -> None:
    """Staged files of writes a previous run did not finish are useless (the writer got an
    error); those of ASYNC_THROUGH writes waiting for their upload stay (resume_uploads)."""
    for path in staged_files(staging_dir):
        if pending_file(path).exists():
            continue
        try:
            os.unlink(path)
        except OSError as exc:
            log.warning("cannot remove stale staging file %s: %s", path, exc)
    for record in staging_dir.glob("*.upload.json") if staging_dir.is_dir() else []:
        if not record.with_name(record.name.removesuffix(".upload.json") + ".part").exists():
            record.unlink(missing_ok=True)
