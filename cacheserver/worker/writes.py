"""The worker's writes: a file is staged on local disk, then written with its write type
(THROUGH, CACHE_THROUGH: into the store; MUST_CACHE, ASYNC_THROUGH: into this worker's
cache, pinned) and committed on the master. The writer is answered only when the write
type's promise holds; a write that fails leaves nothing of the file listed, and takes out of
the store only the object it put there itself, never one another writer put there since.

Copies and appends stage the existing file's bytes first (from this worker's cache, the
store, or a peer holding a file not in the store yet), except a copy within one store,
which the store makes itself.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any, BinaryIO

from strata.contract.config import ServerConfig
from strata.contract.errors import InvalidArgument, NotFound, StrataError
from strata.contract.proto import strata_pb2 as pb
from ..common.blockrefs import key_of
from ..common.blockwire import check_write_chunk
from ..cache.store import BlockStore
from ..common.paths import received
from ..ufs import UfsStatus
from .masterlink import MasterLink
from .mounts import MountView, WorkerMounts
from .peers import Peers
from .reads import BlockReads
from .retention import WRITTEN_VERSION_PREFIX, Retention
from .uploads import UploadRecord, Uploads, now_ms

log = logging.getLogger(__name__)


def effective_write_type(request_type: pb.WriteType.ValueType, mount: MountView, config: ServerConfig) -> pb.WriteType.ValueType:
    """The request's write type, else the mount's, else the cluster's."""
    if request_type:
        return request_type
    if mount.info.options.write_type:
        return mount.info.options.write_type
    return config.cache_policy.write_type.to_proto()



async def _checked(chunks: AsyncIterator[pb.WriteFileChunk], call: str) -> AsyncIterator[pb.WriteFileChunk]:
    """The messages of a `call` stream, each once its bytes match its CRC-32C."""
    index = 0
    async for chunk in chunks:
        check_write_chunk(chunk, index, call)
        index += 1
        yield chunk

class Writes:
    """Writes, appends and copies taken by one worker."""

    def __init__(self, *, config: ServerConfig, store: BlockStore, mounts: WorkerMounts, link: MasterLink,
                 uploads: Uploads, retention: Retention, reads: BlockReads, peers: Peers) -> None:
        self.config = config
        self._store = store
        self._mounts = mounts
        self._link = link
        self._uploads = uploads
        self._retention = retention
        self._reads = reads
        self._peers = peers

    # -- entry points ------------------------------------------------------------------------

    async def write_file(self, chunks: AsyncIterator[pb.WriteFileChunk]) -> pb.FileInfo:
        """Write the file a stream of chunks carries (the first names path, write type and
        overwrite). A write this worker refuses is refused from the first message, before
        the rest of the stream is taken onto its disk."""
        checked = _checked(chunks, "WriteFile")
        first = await anext(checked, None)
        if first is None:
            raise InvalidArgument("WriteFile: empty stream; the first message must name the path")
        path = received(first.path)
        (await self._mounts.resolve(path)).check_writable(path)
        staged = self._uploads.new_staged()
        length = len(first.data)
        try:
            with staged.open("wb") as out:
                out.write(first.data)
                async for chunk in checked:
                    out.write(chunk.data)
                    length += len(chunk.data)
            mount = await self._mounts.resolve(path)  # the mount as it is now, after the stream
            mount.check_writable(path)
            write_type = effective_write_type(first.write_type, mount, self.config)
            write_id = await self._link.prepare_write(path, overwrite=first.overwrite)
            return await self._write(staged, mount, path, length, write_type, write_id)
        finally:
            if not self._uploads.is_pending(staged):
                staged.unlink(missing_ok=True)

    async def append_file(self, chunks: AsyncIterator[pb.WriteFileChunk]) -> pb.FileInfo:
        """Append a stream of chunks to the file the first names (a new file if none). The
        append is prepared before the file is read: no other write of it overlaps (two
        appends each built on the same file would keep only one's bytes)."""
        staged = self._uploads.new_staged()
        path, write_id = "", ""
        try:
            first: pb.WriteFileChunk | None = None
            length = 0
            with staged.open("wb") as out:
                async for chunk in _checked(chunks, "AppendFile"):
                    if first is None:
                        first = chunk
                        path = received(chunk.path)
                        (await self._mounts.resolve(path)).check_writable()
                        write_id = await self._link.prepare_write(path, overwrite=True, exclusive=True)
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
            if write_id:
                await asyncio.shield(self._link.abort_write(path, "", write_id))
            raise
        return await self._write_staged(staged, path, length, first.write_type, overwrite=True, write_id=write_id)

    async def copy_file(self, request: pb.CopyFileRequest) -> pb.FileInfo:
        src, dst = received(request.src), received(request.dst)
        if src == dst:
            raise InvalidArgument(f"cannot copy {src} onto itself")
        mount = await self._mounts.resolve(dst)
        mount.check_writable()
        located = await self._link.locate(src)
        source = located.file
        write_type = effective_write_type(request.write_type, mount, self.config)
        if source.persisted and source.mount_id == mount.mount_id and write_type in (pb.THROUGH, pb.CACHE_THROUGH):
            # Both in one store: the store copies (S3: server-side), no byte leaves it.
            write_id = await self._link.prepare_write(dst, overwrite=request.overwrite)
            return await self._write_through(mount, dst, int(source.length), write_id, cache_from=None,
                                             put=lambda: mount.store.copy(mount.rel(src), mount.rel(dst)))
        staged = self._uploads.new_staged()
        try:
            with staged.open("wb") as out:
                length = await self._stage_existing(src, out, located)
        except BaseException:
            staged.unlink(missing_ok=True)
            raise
        return await self._write_staged(staged, dst, length, write_type, overwrite=request.overwrite)

    # -- staged files ------------------------------------------------------------------------

    async def _write_staged(self, staged: Path, path: str, length: int, write_type: pb.WriteType.ValueType,
                            overwrite: bool, write_id: str = "") -> pb.FileInfo:
        """Write a staged file to `path` with the write type (the mount's if unspecified), as
        the write `write_id` if it was prepared already; the staged file is removed unless an
        ASYNC_THROUGH upload still needs it."""
        try:
            try:
                mount = await self._mounts.resolve(path)
                mount.check_writable()
            except BaseException:
                if write_id:
                    await asyncio.shield(self._link.abort_write(path, "", write_id))
                raise
            effective = effective_write_type(write_type, mount, self.config)
            write_id = write_id or await self._link.prepare_write(path, overwrite=overwrite)
            return await self._write(staged, mount, path, length, effective, write_id)
        finally:
            if not self._uploads.is_pending(staged):
                staged.unlink(missing_ok=True)

    async def _stage_existing(self, path: str, out: BinaryIO, located: pb.GetBlockLocationsResponse | None = None) -> int:
        """Write the bytes of the file at `path` to `out`; its length. NotFound if no file."""
        located = located or await self._link.locate(path)
        info: pb.FileInfo = located.file
        for block in located.blocks:
            ref = pb.BlockRef(mount_id=info.mount_id, path=info.path, version=info.version, index=block.index,
                              block_size=info.block_size, file_length=info.length, in_store=info.persisted)
            data = await self._block_bytes(ref, list(block.worker_ids))
            await asyncio.to_thread(out.write, data)
        return int(info.length)

    async def _block_bytes(self, ref: pb.BlockRef, holders: list[str]) -> bytes:
        """One block of a file for a copy: from this worker's cache, else the store, else
        (a file not in the store yet) from a peer holding it."""
        data = await self._reads.whole_block(ref)
        if data is not None:
            return data
        if ref.in_store:
            return await self._reads.read_uncached(ref, 0, key_of(ref).length)
        return await self._peers.read_block(ref, holders)

    # -- write types -------------------------------------------------------------------------

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
                await asyncio.to_thread(self._uploads.begin, staged, record)
            refs = await self._cache_file(staged, mount_id=mount.mount_id, path=path, version=version,
                                          length=length, pin=True, in_store=False)
            file = await self._link.commit_file(path, length, version, persisted=False, ufs_version="",
                                                write_id=write_id)
            if write_type == pb.ASYNC_THROUGH:
                await self._uploads.acknowledge(staged)
            return file
        except BaseException:
            if write_type == pb.ASYNC_THROUGH and self._uploads.is_pending(staged):
                await asyncio.shield(self._uploads.abort(staged))
            else:
                await asyncio.shield(self._withdraw(path, version, refs, write_id))
            raise

    async def _withdraw(self, path: str, version: str, refs: list[pb.BlockRef], write_id: str) -> None:
        """Undo a MUST_CACHE write that could not be acknowledged: its commit, if the master
        recorded it, and its blocks."""
        await self._link.abort_write(path, version, write_id)
        await self._retention.release(refs, False)

    async def _write_through(self, mount: MountView, path: str, length: int, write_id: str, *,
                             put: Callable[[], Coroutine[Any, Any, UfsStatus]], cache_from: Path | None) -> pb.FileInfo:
        """Put the file into the store (`put`), cache it from `cache_from` if given, then
        commit it. Not acknowledged (an error anywhere): nothing of it stays listed."""
        rel = mount.rel(path)
        try:
            status = await put()
        except BaseException:
            await asyncio.shield(self._link.abort_write(path, "", write_id))
            raise
        try:
            if cache_from is not None:
                try:
                    await self._cache_file(cache_from, mount_id=mount.mount_id, path=path, version=status.version,
                                           length=length, pin=False, in_store=True)
                except (StrataError, OSError) as exc:  # the file is in the store: it is written
                    log.warning("wrote %s to the store but could not cache it: %s", path, exc)
            return await self._link.commit_file(path, length, status.version, persisted=True,
                                                ufs_version=status.version, write_id=write_id)
        except BaseException:
            # Not acknowledged: what went to the store must not stay listed.
            await asyncio.shield(self._remove_own(mount, path, status))
            await asyncio.shield(self._link.abort_write(path, "", write_id))
            raise

    @staticmethod
    async def _remove_own(mount: MountView, path: str, put: UfsStatus) -> None:
        """Remove the object a write that failed put into the store, if the store still holds
        that very object (its version): another writer's, put there since and maybe
        acknowledged, stays. Stores have no delete-if-version, so an object landing between
        the look and the delete is removed with ours; that window is one store round trip."""
        rel = mount.rel(path)
        try:
            current = await mount.store.info(rel)
        except NotFound:
            return
        except (StrataError, OSError) as exc:
            log.warning("left %s in the store after its write failed: cannot tell whether it is still this "
                        "write's object (%s)", path, exc)
            return
        if current.version != put.version:
            log.info("left %s in the store after its write failed: it holds another writer's object now "
                     "(version %s, ours %s)", path, current.version, put.version)
            return
        try:
            await mount.store.rm(rel)
        except NotFound:
            pass
        except (StrataError, OSError) as exc:
            log.warning("could not remove %s from the store after its write failed: %s", path, exc)

    async def _cache_file(self, staged: Path, *, mount_id: int, path: str, version: str, length: int, pin: bool,
                          in_store: bool) -> list[pb.BlockRef]:
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
                await self._store.put(key_of(ref), data, pin=pin)
                refs.append(ref)
        return refs
