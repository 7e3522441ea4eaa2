"""The master's gRPC service: mount table, metadata, membership, block locations, stats."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from strata.contract.config import ServerConfig
from strata.contract.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    StrataError,
    Unavailable,
)
from strata.contract.modes import ReadType, WriteType
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc
from strata.contract.rpc import MAX_MESSAGE_BYTES, aio_channel, error_of
from strata.contract.urls import shown_url
from .. import rpcutil
from ..background import BackgroundTasks
from ..blockrefs import key_of
from ..cache.keys import BlockKey
from ..namespace.metadata import LIST_PAGE_ENTRIES, FileEntry, Namespace, upload_rel
from ..namespace.mounts import Mount as NsMount
from ..namespace.mounts import MountOptions, MountTable
from ..namespace.paths import is_under, received, shown
from ..placement import rank_workers
from ..ufs import check_source_allowed
from ..uploads import sum_pending
from .blocks import MAX_LOCATE_BLOCKS, BlockIndex
from .membership import Membership, WorkerRecord

log = logging.getLogger(__name__)

# How many CacheBlocks calls a load keeps in flight, and how many blocks each carries.
LOAD_CONCURRENCY = 4
LOAD_BATCH_BLOCKS = 2
# Entries a page of ListStatusPages may hold at most: ~5,000 * 4 KiB paths stays well below
# the 64 MiB message limit.
MAX_LIST_PAGE_ENTRIES = 5000
# How long store totals of a mount (bytes, files) are reused before walking the store again.
UFS_TOTALS_MAX_AGE = 60.0
# Seconds the master gives the store to move an uploaded file into place (a server-side copy
# on object stores): writes and deletes of that path wait for it, so it must end; a worker
# whose move timed out uploads again.
PERSIST_MOVE_TIMEOUT = 120.0
# Seconds a prepared write holds back older uploads of its file (and, an append, the other
# writes of it) when its worker never says how it ended (stopped that long; a worker that
# restarts ends the writes of its previous run when it registers).
WRITE_LEASE = 600.0
# Seconds an upload's temporary file in a file:// store's upload folder must be unchanged (and
# held by no process) before the master removes it as left by a dead upload: an upload under
# way changes it all the time, and one hour leaves room for a stalled network file system.
DEAD_UPLOAD_AGE = 3600.0
# Seconds between two looks for them (the first when the master starts).
UPLOAD_SWEEP_INTERVAL = 600.0
# Seconds a write waits at PrepareWrite for the writes of its file it must not overlap (an
# append: all; any other write: an append) before it is refused; below the worker's deadline
# for that call (masterlink.MASTER_WRITE_TIMEOUT, 30 s).
WRITE_TURN_WAIT = 20.0


# A write's id is the namespace's generation when it was prepared, this, and a random part.
WRITE_ID_SEPARATOR = "."


def prepared_at(write_id: str) -> int | None:
    """The namespace generation a write was prepared at, from its id (None: an id without
    one, from a master before this one)."""
    generation, separator, _ = write_id.partition(WRITE_ID_SEPARATOR)
    return int(generation) if separator and generation.isdigit() else None


@dataclass(frozen=True)
class OpenWrite:
    """A write prepared and not yet committed or aborted."""

    lease_end: float  # time.monotonic()
    exclusive: bool  # an append: no other write of its file overlaps it
    worker_id: str


@dataclass
class LoadJob:
    path: str
    progress: pb.LoadProgress = field(default_factory=pb.LoadProgress)
    error: StrataError | None = None
    task: asyncio.Task[None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    # The file versions the job loads: what "still cached" is measured against.
    files: list[FileEntry] = field(default_factory=list)
    finished_at: float | None = None  # time.monotonic() when done

    def update(self, **fields: int | bool | str) -> None:
        for name, value in fields.items():
            setattr(self.progress, name, value)
        self.changed.set()

    def report(self, blocks: BlockIndex, settle: float) -> pb.LoadProgress:
        """The job's progress for Report: its path, why it failed, and (once done) how many
        of its bytes the cache holds now, so a preload whose blocks were evicted or lost with
        a worker shows as no longer whole. Workers report new blocks with their next
        heartbeat: for `settle` seconds after the end, what they answered counts too. While the
        job runs, bytes_cached is what the cache holds of the files listed so far."""
        progress = pb.LoadProgress()
        progress.CopyFrom(self.progress)
        progress.path = self.path
        if self.error is None:
            held = sum(blocks.cached_bytes_of_file(f.mount_id, f.path, f.version) for f in self.files)
            settling = self.finished_at is not None and time.monotonic() - self.finished_at < settle
            progress.bytes_cached = max(held, self.progress.bytes_loaded) if settling else held
        return progress

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()


@dataclass
class UfsTotals:
    total_bytes: int
    files: int
    at: float


def options_from_proto(options: pb.MountOptions, has_options: bool) -> MountOptions:
    if not has_options:
        return MountOptions()
    return MountOptions(
        options=dict(options.options),
        credentials=dict(options.credentials),
        read_only=options.read_only,
        metadata_sync_interval=options.metadata_sync_interval,
        read_type=ReadType.name_of(options.read_type),
        write_type=WriteType.name_of(options.write_type),
        pin=options.pin,
        ttl_seconds=options.ttl_seconds,
        stale_if_error=options.stale_if_error if options.HasField("stale_if_error") else True,
    )


def mount_to_proto(mount: NsMount, *, with_credentials: bool, pinned: list[str]) -> pb.MountInfo:
    o = mount.options
    return pb.MountInfo(
        path=mount.path,
        source=mount.source if with_credentials else shown_url(mount.source),
        mount_id=mount.mount_id,
        created_unix_ms=mount.created_unix_ms,
        pinned_prefixes=pinned,
        unusable=mount.unusable,
        options=pb.MountOptions(
            options=o.options,
            credentials=o.credentials if with_credentials and not mount.unusable else {},
            read_only=o.read_only,
            metadata_sync_interval=o.metadata_sync_interval,
            read_type=ReadType.proto_of(o.read_type),
            write_type=WriteType.proto_of(o.write_type),
            pin=o.pin,
            ttl_seconds=o.ttl_seconds,
            stale_if_error=o.stale_if_error,
        ),
    )


class MasterService(pb_grpc.MasterServicer):
    def __init__(self, config: ServerConfig, mounts: MountTable, namespace: Namespace, token: str) -> None:
        self.config = config
        self.mounts = mounts
        self.namespace = namespace
        self.token = token
        self.membership = Membership(timeout=config.heartbeat_interval * config.heartbeat_misses)
        self.blocks = BlockIndex()
        self.loads: dict[str, LoadJob] = {}
        self.ufs_totals: dict[int, UfsTotals] = {}
        self._totalling: dict[int, asyncio.Task[object]] = {}  # by mount id: the walk under way
        # From the clock, not 1: a master that starts again (on a new journal, its mounts made
        # again under new ids) must not hand out a version a worker already holds for the old
        # table, or the worker keeps the old table (and reads on under the forgotten ids).
        self._table_version = time.time_ns() // 1_000_000
        self._background = BackgroundTasks()
        self._worker_channels: rpcutil.ChannelCache[grpc.aio.Channel] = rpcutil.ChannelCache(
            lambda address: aio_channel(address, token), retire=self._close_channel)
        # Paths whose ASYNC_THROUGH upload is being moved into place in the store: writes,
        # deletes and renames of them wait (so no older upload lands after a newer write).
        self._moving: dict[str, asyncio.Event] = {}
        # Writes prepared and not yet committed or aborted: path -> write id -> its lease.
        # While one is open, older uploads of the path wait; while an append is open, the
        # other writes of the path wait at PrepareWrite.
        self._writing: dict[str, dict[str, OpenWrite]] = {}
        # Set (and replaced) whenever a write of the path ends: PrepareWrite waits on it.
        self._write_ended: dict[str, asyncio.Event] = {}
        # The run of each worker process last registered (RegisterWorkerRequest.incarnation).
        self._incarnations: dict[str, str] = {}
        # Metadata requests answered, by method (a metric: what clients' reuse of answers saves).
        self.metadata_requests: Counter[str] = Counter()

    # -- helpers ---------------------------------------------------------------------------

    def _close_channel(self, worker_id: str, channel: grpc.aio.Channel) -> None:
        self._background.spawn(channel.close(), f"close-channel-{worker_id}")

    def _bump_table(self) -> None:
        self._table_version += 1

    def _worker_stub(self, record: WorkerRecord) -> pb_grpc.WorkerStub:
        return pb_grpc.WorkerStub(self._worker_channels.get(record.info.worker_id, record.info.address))

    def _host_of(self, worker_id: str) -> str:
        record = self.membership.get(worker_id)
        return record.info.host if record else ""

    def _file_info(self, entry: FileEntry, *, reusable: bool = False) -> pb.FileInfo:
        """`entry` as a client gets it; `reusable`: an answer of GetStatus or ListStatus, with
        how long the client may reuse it (Namespace.valid_for)."""
        cached = 0 if entry.is_dir else self.blocks.cached_bytes_of_file(entry.mount_id, entry.path, entry.version)
        return pb.FileInfo(
            path=entry.path,
            name=entry.name,
            is_dir=entry.is_dir,
            length=entry.length,
            mtime_unix_ms=entry.mtime_unix_ms,
            version=entry.version,
            block_size=entry.block_size,
            persisted=entry.persisted,
            cached_bytes=cached,
            pinned=entry.pinned,
            mount_id=entry.mount_id,
            read_only=entry.read_only,
            readahead_blocks=0 if entry.is_dir else self.config.cache_policy.readahead_blocks,
            store_version=entry.store_version,
            valid_for_ms=int(self.namespace.valid_for(entry) * 1000) if reusable else 0,
        )

    def _pinned_prefixes(self, mount: NsMount) -> list[str]:
        prefixes = list(self.namespace.pinned_prefixes(mount.mount_id))
        if mount.options.pin:
            prefixes.append(mount.path)
        return sorted(set(prefixes))

    async def _broadcast(self, what: str, call: str, request: object) -> list[object]:
        """Send one request to every live worker; a worker that fails is logged, not fatal."""
        records = self.membership.live()

        async def one(record: WorkerRecord) -> object | None:
            try:
                result: object = await getattr(self._worker_stub(record), call)(request, timeout=60)
                return result
            except grpc.RpcError as exc:
                log.warning("%s on worker %s failed: %s", what, record.info.worker_id, exc.details() if hasattr(exc, "details") else exc)
                return None

        results = await asyncio.gather(*(one(r) for r in records))
        return [r for r in results if r is not None]

    async def _free_blocks(self, mount_id: int, prefix: str, keep: list[pb.BlockRef] | None = None) -> int:
        request = pb.FreeBlocksRequest(mount_id=mount_id, path_prefix=prefix, keep=keep or [])
        results = await self._broadcast("free", "FreeBlocks", request)
        return sum(r.bytes_freed for r in results)  # type: ignore[attr-defined]

    def _unpersisted_refs(self, path: str) -> list[pb.BlockRef]:
        """Written files at or below `path` whose cached blocks are the only copy: a free
        or an unpin must leave them alone."""
        return [pb.BlockRef(mount_id=e.mount_id, path=p, version=e.version) for p, e in self.namespace.unpersisted_below(path)]

    def _moving_under(self, path: str) -> list[asyncio.Event]:
        return [event for p, event in self._moving.items() if is_under(p, path)]

    async def _settled(self, path: str) -> None:
        """Wait until no upload at or below `path` is being moved into place."""
        while busy := self._moving_under(path):
            await busy[0].wait()

    def _end_write(self, path: str, write_id: str) -> None:
        open_writes = self._writing.get(path, {})
        open_writes.pop(write_id, None)
        if not open_writes:
            self._writing.pop(path, None)
        ended = self._write_ended.pop(path, None)
        if ended is not None:
            ended.set()

    def _end_writes_of(self, worker_id: str) -> None:
        """A worker started again: the writes its previous run had open are over."""
        for path, open_writes in list(self._writing.items()):
            for write_id in [w for w, write in open_writes.items() if write.worker_id == worker_id]:
                log.info("write %s of %s ended with the previous run of worker %s", write_id, path, worker_id)
                self._end_write(path, write_id)

    def _open_writes(self, path: str) -> list[OpenWrite]:
        """The writes of `path` prepared and not yet ended (nor their leases run out)."""
        now = time.monotonic()
        open_writes = {w: write for w, write in self._writing.get(path, {}).items() if write.lease_end > now}
        if open_writes:
            self._writing[path] = open_writes
        else:
            self._writing.pop(path, None)
        return list(open_writes.values())

    def _write_open(self, path: str) -> bool:
        """Is a write of `path` prepared and not yet ended (nor its lease run out)?"""
        return bool(self._open_writes(path))

    def _overlapped(self, path: str, exclusive: bool) -> bool:
        """Would a write of `path` now overlap one it must not (an append: any)?"""
        return any(exclusive or write.exclusive for write in self._open_writes(path))

    async def _turn(self, path: str, exclusive: bool, deadline: float) -> None:
        """Wait until no upload of `path` is being moved into place and no write it must not
        overlap is open; Unavailable at `deadline` (time.monotonic())."""
        while True:
            await self._settled(path)
            if not self._overlapped(path, exclusive):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                what = "other writes of it" if exclusive else "an append to it"
                raise Unavailable(f"cannot write {path} now: {what} did not end within {WRITE_TURN_WAIT:g}s; "
                                  "try again")
            ended = self._write_ended.setdefault(path, asyncio.Event())
            try:  # a lease that runs out ends a write too: look again at least every second
                await asyncio.wait_for(ended.wait(), min(left, 1.0))
            except TimeoutError:
                pass

    async def _remove_upload(self, mount: NsMount, version: str) -> None:
        """Remove a dropped write's upload from the store's upload folder (best effort: a
        leftover there is never listed)."""
        try:
            await self.mounts.store(mount).rm(upload_rel(version))
        except NotFound:
            pass
        except StrataError as exc:
            log.info("could not remove the upload of version %s from %s: %s", version, shown_url(mount.source), exc)

    # -- mount table ---------------------------------------------------------------------------

    @rpcutil.unary
    async def Mount(self, request: pb.MountRequest, context: grpc.aio.ServicerContext) -> pb.MountResponse:
        path = received(request.path)
        check_source_allowed(request.source, self.config.local_sources.allowed_roots)
        options = options_from_proto(request.options, request.HasField("options"))
        existing = self.mounts.get(path)
        if (existing is not None and not existing.unusable and existing.source == request.source
                and existing.options == options):
            # Same mount again (the operator re-ensures mounts): keep its id and its cache.
            return pb.MountResponse(mount=mount_to_proto(existing, with_credentials=False, pinned=self._pinned_prefixes(existing)))
        if request.check:
            async with options.open_store(request.source) as store:
                await store.check()
        mount = self.mounts.add(path, request.source, options, replace=request.replace)
        if existing is not None and existing.mount_id != mount.mount_id:
            self._background.spawn(self._free_blocks(existing.mount_id, ""), f"free-replaced-{existing.mount_id}")
        self._bump_table()
        self._total_store(mount)
        log.info("mounted %s -> %s (mount id %d)", mount.path, shown_url(mount.source), mount.mount_id)
        return pb.MountResponse(mount=mount_to_proto(mount, with_credentials=False, pinned=self._pinned_prefixes(mount)),
                                changed=True)

    @rpcutil.unary
    async def Unmount(self, request: pb.UnmountRequest, context: grpc.aio.ServicerContext) -> pb.UnmountResponse:
        mount = self.mounts.remove(received(request.path))
        self._bump_table()
        self.ufs_totals.pop(mount.mount_id, None)
        totalling = self._totalling.pop(mount.mount_id, None)
        if totalling is not None:
            totalling.cancel()
        for path in [p for p in self.loads if is_under(p, mount.path)]:
            self.loads.pop(path).cancel()
        if request.free:
            await self._free_blocks(mount.mount_id, "")
        log.info("unmounted %s", mount.path)
        return pb.UnmountResponse()

    @rpcutil.unary
    async def ListMounts(self, request: pb.ListMountsRequest, context: grpc.aio.ServicerContext) -> pb.ListMountsResponse:
        return pb.ListMountsResponse(
            mounts=[mount_to_proto(m, with_credentials=False, pinned=self._pinned_prefixes(m)) for m in self.mounts.list()]
        )

    @rpcutil.unary
    async def GetMountTable(self, request: pb.GetMountTableRequest, context: grpc.aio.ServicerContext) -> pb.GetMountTableResponse:
        return pb.GetMountTableResponse(
            version=self._table_version,
            mounts=[mount_to_proto(m, with_credentials=True, pinned=self._pinned_prefixes(m)) for m in self.mounts.list()],
        )

    # -- metadata ------------------------------------------------------------------------------

    @rpcutil.unary
    async def GetStatus(self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext) -> pb.FileInfo:
        path = received(request.path)
        self.metadata_requests["GetStatus"] += 1
        if request.refresh:
            self.namespace.invalidate(path)
        return self._file_info(await self.namespace.get_status(path), reusable=True)

    @rpcutil.unary
    async def ListStatus(self, request: pb.ListStatusRequest, context: grpc.aio.ServicerContext) -> pb.ListStatusResponse:
        self.metadata_requests["ListStatus"] += 1
        response = pb.ListStatusResponse()
        size = 0
        async for page in self._listing_pages(request, LIST_PAGE_ENTRIES):
            size += page.ByteSize()
            if size > MAX_MESSAGE_BYTES:
                raise ResourceExhausted(
                    f"the listing of {shown(request.path)} is larger than one message may be ({MAX_MESSAGE_BYTES} bytes); "
                    "list it in pages (ListStatusPages, which clients of this version use)"
                )
            response.files.extend(page.files)
        return response

    @rpcutil.streaming
    async def ListStatusPages(self, request: pb.ListStatusRequest,
                              context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ListStatusResponse]:
        self.metadata_requests["ListStatus"] += 1
        if request.page_size > MAX_LIST_PAGE_ENTRIES:
            raise InvalidArgument(f"a listing's page holds at most {MAX_LIST_PAGE_ENTRIES} entries, "
                                  f"asked for {request.page_size}")
        async for page in self._listing_pages(request, request.page_size or LIST_PAGE_ENTRIES):
            yield page

    async def _listing_pages(self, request: pb.ListStatusRequest, size: int) -> AsyncIterator[pb.ListStatusResponse]:
        """A listing as messages of at most `size` entries, each made once the one before
        was taken (gRPC's flow control paces a slow reader; between pages the master serves
        other requests)."""
        async for entries in self.namespace.list_pages(received(request.path), recursive=request.recursive, page=size):
            yield pb.ListStatusResponse(files=[self._file_info(e, reusable=True) for e in entries])

    @rpcutil.unary
    async def Delete(self, request: pb.DeleteRequest, context: grpc.aio.ServicerContext) -> pb.DeleteResponse:
        path = received(request.path)
        mount, _ = self.mounts.resolve(path)
        await self._settled(path)
        dropped = await self.namespace.delete(path, request.recursive)
        for written in dropped.values():
            if not written.persisted:
                self._background.spawn(self._remove_upload(mount, written.version), f"remove-upload-{written.version}")
        await self._free_blocks(mount.mount_id, path)
        return pb.DeleteResponse()

    @rpcutil.unary
    async def Rename(self, request: pb.RenameRequest, context: grpc.aio.ServicerContext) -> pb.RenameResponse:
        src, dst = received(request.src), received(request.dst)
        mount, _ = self.mounts.resolve(src)
        await self._settled(src)
        await self._settled(dst)
        await self.namespace.rename(src, dst)
        # Blocks are keyed by path: the old path's blocks can never be read again.
        await self._free_blocks(mount.mount_id, src)
        return pb.RenameResponse()

    @rpcutil.unary
    async def SetTimes(self, request: pb.SetTimesRequest, context: grpc.aio.ServicerContext) -> pb.FileInfo:
        return self._file_info(await self.namespace.set_mtime(received(request.path), request.mtime_unix_ms))

    @rpcutil.unary
    async def LocateBlocks(self, request: pb.LocateBlocksRequest, context: grpc.aio.ServicerContext) -> pb.LocateBlocksResponse:
        """The holders of each block asked for, from the block index alone: answered from
        memory whatever the store does, bounded by MAX_LOCATE_BLOCKS."""
        if len(request.blocks) > MAX_LOCATE_BLOCKS:
            raise InvalidArgument(f"LocateBlocks asks for {len(request.blocks)} blocks; at most "
                                  f"{MAX_LOCATE_BLOCKS} a request")
        response = pb.LocateBlocksResponse()
        for ref in request.blocks:
            holders = sorted(self.blocks.holders(key_of(ref)))
            response.blocks.append(pb.BlockLocation(
                index=ref.index, worker_ids=holders, hosts=sorted({self._host_of(w) for w in holders} - {""})))
        return response

    @rpcutil.unary
    async def GetBlockLocations(
        self, request: pb.GetBlockLocationsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetBlockLocationsResponse:
        entry = await self.namespace.get_status(received(request.path))
        if entry.is_dir:
            raise InvalidArgument(f"{entry.path} is a directory; block locations exist for files only")
        response = pb.GetBlockLocationsResponse(file=self._file_info(entry))
        size = entry.block_size or self.config.block_size
        for index in range((entry.length + size - 1) // size):
            key = BlockKey.of_file(entry.mount_id, entry.path, entry.version, block_size=size,
                                   file_length=entry.length, index=index)
            holders = sorted(self.blocks.holders(key))
            offset = index * size
            response.blocks.append(
                pb.BlockLocation(
                    index=index,
                    offset=offset,
                    length=min(size, entry.length - offset),
                    worker_ids=holders,
                    hosts=sorted({self._host_of(w) for w in holders} - {""}),
                )
            )
        return response

    async def _check_not_overtaken(self, path: str, request: pb.CommitFileRequest) -> None:
        """A write that put its object into the store (THROUGH, CACHE_THROUGH) commits it
        only if no older upload was moved into place over it. Older uploads wait while a
        write of their file is open, but the master forgets open writes when it restarts (and
        a write's lease runs out): an upload that landed after this write was prepared (the
        journal's generations say so) may have replaced this write's object, so the store
        is asked which one it holds. FailedPrecondition if not ours: the writer is told, and
        the acknowledged upload's bytes stay what the file reads."""
        prepared = prepared_at(request.write_id)
        if not request.persisted or prepared is None:
            return
        while True:
            await self._settled(path)
            written = self.namespace.written(path)
            if written is None or written.landed <= prepared or written.version == request.version:
                return
            mount, rel = self.mounts.resolve(path)
            status = await self.mounts.store(mount).info(rel)
            if self._moving_under(path) or self.namespace.written(path) != written:
                continue  # another upload moved meanwhile: look again
            if status.version == (request.ufs_version or request.version):
                return  # this write's object came after the upload: it stands
            raise FailedPrecondition(
                f"{path}: the upload of an earlier ASYNC_THROUGH write (version {written.version}) was moved "
                f"into place in {self.mounts.store(mount).url(rel)} while this write was under way, over this "
                "write's object; the store holds the earlier one, which the file reads now. Write it again"
            )

    @rpcutil.unary
    async def CommitFile(self, request: pb.CommitFileRequest, context: grpc.aio.ServicerContext) -> pb.CommitFileResponse:
        path = received(request.path)
        await self._check_not_overtaken(path, request)
        # The answer is the entry just recorded: asking the store again could fail (a store
        # outage during an ASYNC_THROUGH write) after the file was committed.
        entry = self.namespace.commit_file(
            path,
            length=request.length,
            version=request.version,
            persisted=request.persisted,
            ufs_version=request.ufs_version or None,
            block_size=request.block_size,
        )
        self._end_write(path, request.write_id)
        return pb.CommitFileResponse(file=self._file_info(entry))

    @rpcutil.unary
    async def PrepareWrite(self, request: pb.PrepareWriteRequest, context: grpc.aio.ServicerContext) -> pb.PrepareWriteResponse:
        path = received(request.path)
        self.namespace.writable(path)  # before the worker puts a byte into the store
        deadline = time.monotonic() + WRITE_TURN_WAIT
        while True:
            await self._turn(path, request.exclusive, deadline)
            if not request.overwrite:
                try:
                    await self.namespace.get_status(path)
                except NotFound:
                    pass
                else:
                    raise AlreadyExists(f"{path} already exists; write with overwrite to replace it")
            if not self._moving_under(path) and not self._overlapped(path, request.exclusive):
                break  # nothing began while the store was asked
        # Older uploads of the file wait until this write ends: committed, it supersedes them;
        # failed, the file stays as it was (and its upload goes on). An append also holds
        # back the other writes of the file: each builds on the file as the one before left it.
        write_id = f"{self.namespace.generation}{WRITE_ID_SEPARATOR}{uuid.uuid4().hex}"
        self._writing.setdefault(path, {})[write_id] = OpenWrite(time.monotonic() + WRITE_LEASE, request.exclusive,
                                                                 request.worker_id)
        return pb.PrepareWriteResponse(write_id=write_id)

    @rpcutil.unary
    async def PersistFile(self, request: pb.PersistFileRequest, context: grpc.aio.ServicerContext) -> pb.PersistFileResponse:
        path = received(request.path)
        if not request.version:
            raise InvalidArgument(f"persist of {path}: the version must not be empty")
        await self._settled(path)
        target = self.namespace.pending_write(path, request.version)
        mount, _ = self.mounts.resolve(path)
        if target is not None and self._write_open(path):
            raise Unavailable(f"a newer write of {path} is in progress; the upload of version {request.version} waits for it")
        if target is None:
            written = self.namespace.written(path)
            if written is not None and written.version == request.version and written.persisted:
                # Moved into place before (an answer the worker did not get).
                return pb.PersistFileResponse(file=self._file_info(await self.namespace.get_status(path)))
            log.info("dropping the upload of %s version %s: the file was removed or replaced", path, request.version)
            self._background.spawn(self._remove_upload(mount, request.version), f"remove-upload-{request.version}")
            return pb.PersistFileResponse(superseded=True)
        mount, rel = target
        store = self.mounts.store(mount)
        moving = self._moving[path] = asyncio.Event()
        try:
            try:
                status = await asyncio.wait_for(store.move_file(upload_rel(request.version), rel), PERSIST_MOVE_TIMEOUT)
            except TimeoutError:
                raise Unavailable(
                    f"store {store.source} did not move the upload of {path} into place within "
                    f"{PERSIST_MOVE_TIMEOUT:.0f}s; the worker uploads it again"
                ) from None
            except NotFound:
                raise Unavailable(
                    f"the upload of {path} version {request.version} is not in {store.url(upload_rel(request.version))}; "
                    "the worker uploads it again"
                ) from None
            entry = self.namespace.mark_persisted(path, status.version, version=request.version)
        finally:
            del self._moving[path]
            moving.set()
        log.info("%s (version %s) is in the store", path, request.version)
        return pb.PersistFileResponse(file=self._file_info(entry))

    @rpcutil.unary
    async def AbortWrite(self, request: pb.AbortWriteRequest, context: grpc.aio.ServicerContext) -> pb.AbortWriteResponse:
        path = received(request.path)
        await self._settled(path)
        self._end_write(path, request.write_id)
        if request.version and self.namespace.drop_unpersisted(path, request.version) is not None:
            log.info("dropped the unacknowledged write of %s (version %s)", path, request.version)
        return pb.AbortWriteResponse()

    async def remove_dead_uploads(self) -> int:
        """Remove the temporary files uploads to file:// stores left when their process died
        (killed mid-write: they stayed in the upload folder for ever); how many."""
        removed = 0
        for mount in self.mounts.list():
            if mount.unusable:
                continue
            try:
                removed += await self.mounts.store(mount).remove_dead_uploads(DEAD_UPLOAD_AGE)
            except (StrataError, OSError) as exc:
                log.warning("cannot clean the upload folder of %s (%s): %s", mount.path, shown_url(mount.source), exc)
        return removed

    async def sweep_dead_uploads(self) -> None:
        while True:
            await self.remove_dead_uploads()
            await asyncio.sleep(UPLOAD_SWEEP_INTERVAL)

    # -- cache management ------------------------------------------------------------------

    @rpcutil.streaming
    async def Load(self, request: pb.LoadRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.LoadProgress]:
        path = received(request.path)
        await self.namespace.get_status(path)  # NotFound now rather than inside the job
        job = self.loads.get(path)
        if job is None or job.progress.done:
            job = LoadJob(path=path)
            self.loads[path] = job
            job.task = asyncio.ensure_future(self._run_load(job))
        while True:
            job.changed.clear()
            snapshot = pb.LoadProgress()
            snapshot.CopyFrom(job.progress)
            if snapshot.done and job.error is not None:
                raise job.error
            yield snapshot
            if snapshot.done:
                return
            await job.changed.wait()

    async def _run_load(self, job: LoadJob) -> None:
        try:
            entry = await self.namespace.get_status(job.path)
            files = [entry] if not entry.is_dir else [
                e for e in await self.namespace.list_status(job.path, recursive=True) if not e.is_dir
            ]
            job.files = files
            job.update(bytes_total=sum(f.length for f in files), files_total=len(files))
            semaphore = asyncio.Semaphore(LOAD_CONCURRENCY)
            await asyncio.gather(*(self._load_file(job, f, semaphore) for f in files))
        except StrataError as exc:
            job.error = exc
        except Exception as exc:  # noqa: BLE001 - the job reports every failure
            log.exception("load of %s failed", job.path)
            job.error = StrataError(f"load of {job.path} failed: {exc}")
        finally:
            if job.error is not None:
                log.warning("load of %s failed: %s", job.path, job.error)
                job.update(error=str(job.error))
            job.finished_at = time.monotonic()
            job.update(done=True)

    async def _load_file(self, job: LoadJob, entry: FileEntry, semaphore: asyncio.Semaphore) -> None:
        size = entry.block_size or self.config.block_size
        refs = [
            pb.BlockRef(mount_id=entry.mount_id, path=entry.path, version=entry.version, index=i,
                        block_size=size, file_length=entry.length, in_store=entry.persisted)
            for i in range((entry.length + size - 1) // size)
        ]
        by_owner: dict[str, list[pb.BlockRef]] = {}
        workers = {r.info.worker_id: r for r in self.membership.placement()}
        if refs and not workers:
            raise StrataError(f"cannot load {entry.path}: no live workers")
        for ref in refs:
            block_id = key_of(ref).block_id
            by_owner.setdefault(rank_workers(block_id, workers)[0], []).append(ref)

        async def send(worker_id: str, batch: list[pb.BlockRef]) -> None:
            async with semaphore:
                try:
                    await self._worker_stub(workers[worker_id]).CacheBlocks(pb.CacheBlocksRequest(blocks=batch), timeout=600)
                except grpc.RpcError as exc:
                    raise error_of(exc, f"loading {entry.path} on worker {worker_id}") from exc
            job.update(bytes_loaded=job.progress.bytes_loaded + sum(min(r.block_size, r.file_length - r.index * r.block_size) for r in batch))

        await asyncio.gather(*(
            send(worker_id, batch[i:i + LOAD_BATCH_BLOCKS])
            for worker_id, batch in by_owner.items()
            for i in range(0, len(batch), LOAD_BATCH_BLOCKS)
        ))
        job.update(files_loaded=job.progress.files_loaded + 1)

    @rpcutil.unary
    async def Free(self, request: pb.FreeRequest, context: grpc.aio.ServicerContext) -> pb.FreeResponse:
        path = received(request.path)
        mount, _ = self.mounts.resolve(path)
        prefix = "" if path == mount.path else path
        freed = await self._free_blocks(mount.mount_id, prefix, keep=self._unpersisted_refs(path))
        return pb.FreeResponse(bytes_freed=freed)

    @rpcutil.unary
    async def SetPinned(self, request: pb.SetPinnedRequest, context: grpc.aio.ServicerContext) -> pb.SetPinnedResponse:
        path = received(request.path)
        mount, _ = self.mounts.resolve(path)
        self.namespace.set_pinned(path, request.pinned)
        self._bump_table()
        keep = [] if request.pinned else self._unpersisted_refs(path)
        await self._broadcast(
            "pin", "PinBlocks", pb.PinBlocksRequest(mount_id=mount.mount_id, path_prefix=path, pinned=request.pinned, keep=keep)
        )
        return pb.SetPinnedResponse()

    # -- membership --------------------------------------------------------------------------

    @rpcutil.unary
    async def RegisterWorker(
        self, request: pb.RegisterWorkerRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterWorkerResponse:
        info = request.worker
        if not info.worker_id or not info.address:
            raise InvalidArgument("RegisterWorker: worker_id and address are required")
        previous = self._incarnations.get(info.worker_id)
        self._incarnations[info.worker_id] = request.incarnation
        if previous is not None and previous != request.incarnation:
            self._end_writes_of(info.worker_id)
        self.membership.register(info, request.stats, incarnation=request.incarnation, stopping=request.stopping)
        self.blocks.drop_worker(info.worker_id)
        self.blocks.add(info.worker_id, request.blocks)
        log.info("worker %s registered at %s (host %s, %d blocks)", info.worker_id, info.address, info.host, len(request.blocks))
        return pb.RegisterWorkerResponse(mount_table_version=self._table_version)

    @rpcutil.unary
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext) -> pb.HeartbeatResponse:
        if not self.membership.heartbeat(request.worker_id, request.stats, stopping=request.stopping):
            return pb.HeartbeatResponse(reregister=True, mount_table_version=self._table_version)
        self.blocks.add(request.worker_id, request.added)
        self.blocks.remove(request.worker_id, request.removed)
        return pb.HeartbeatResponse(mount_table_version=self._table_version)

    @rpcutil.unary
    async def ListWorkers(self, request: pb.ListWorkersRequest, context: grpc.aio.ServicerContext) -> pb.ListWorkersResponse:
        return pb.ListWorkersResponse(workers=[self.membership.to_proto(r) for r in self.membership.live()])

    @rpcutil.unary
    async def DecommissionWorkers(
        self, request: pb.DecommissionWorkersRequest, context: grpc.aio.ServicerContext
    ) -> pb.DecommissionWorkersResponse:
        serving = self.membership.serve(w for w in request.serving if w not in request.worker_ids)
        if serving:
            log.info("workers %s are wanted again: out of decommissioning (a run of them still stopping "
                     "stays out of placement)", ", ".join(serving))
        leaving = self.membership.decommission(request.worker_ids)
        if leaving:
            log.info("decommissioning workers %s", ", ".join(leaving))
        return pb.DecommissionWorkersResponse()

    def expire_workers(self) -> None:
        for worker_id in self.membership.expire():
            log.warning("worker %s stopped heartbeating; dropped from placement", worker_id)
            self.blocks.drop_worker(worker_id)
            self._worker_channels.drop(worker_id)

    # -- report ------------------------------------------------------------------------------

    def _total_store(self, mount: NsMount) -> None:
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

    @rpcutil.unary
    async def GetCapacity(self, request: pb.GetCapacityRequest, context: grpc.aio.ServicerContext) -> pb.GetCapacityResponse:
        capacity, used = self._live_capacity()
        return pb.GetCapacityResponse(capacity=capacity, used=used)

    def _live_capacity(self) -> tuple[int, int]:
        """Bytes the live workers' tiers may hold, and hold."""
        live = self.membership.live()
        return (sum(t.capacity for r in live for t in r.stats.tiers),
                sum(t.used for r in live for t in r.stats.tiers))

    @rpcutil.unary
    async def Report(self, request: pb.ReportRequest, context: grpc.aio.ServicerContext) -> pb.ReportResponse:
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
            totals = self.ufs_totals.get(mount.mount_id)
            if not mount.unusable and (totals is None or time.monotonic() - totals.at > UFS_TOTALS_MAX_AGE):
                self._total_store(mount)
            by_host: dict[str, int] = {}
            for worker_id, n in self.blocks.cached_bytes_by_worker(mount.mount_id).items():
                host = self._host_of(worker_id) or worker_id
                by_host[host] = by_host.get(host, 0) + n
            response.mounts.append(pb.MountReport(
                mount=mount_to_proto(mount, with_credentials=False, pinned=self._pinned_prefixes(mount)),
                cached_bytes=by_mount.get(mount.mount_id, 0),
                cached_bytes_by_host=by_host,
                ufs_total_bytes=totals.total_bytes if totals else 0,
                ufs_files=totals.files if totals else 0,
                ufs_totals_age_ms=int((time.monotonic() - totals.at) * 1000) if totals else -1,
                loads=[job.report(self.blocks, settle) for p, job in sorted(self.loads.items()) if is_under(p, mount.path)],
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

    async def close(self) -> None:
        for job in self.loads.values():
            job.cancel()
        await self._background.close()
        for channel in self._worker_channels.take_all():
            await channel.close()

