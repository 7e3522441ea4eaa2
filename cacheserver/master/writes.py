"""Writes and their leases: a write is prepared (its turn among the writes of its file),
committed or aborted; uploads of ASYNC_THROUGH writes are moved into place in the store
(persisted) while newer writes of their file hold them back; dead uploads are swept."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from strata.contract.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, StrataError, Unavailable
from strata.contract.proto import strata_pb2 as pb
from strata.contract.urls import shown_url
from ..background import BackgroundTasks
from ..namespace.permissions import upload_rel
from ..namespace.tree import Namespace
from ..namespace.mounts import Mount as NsMount
from ..namespace.mounts import MountTable
from ..common.paths import is_under, received
from .messages import FileInfos

log = logging.getLogger(__name__)

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


class Writes:
    """The writes under way of each path and the uploads being moved into place."""

    def __init__(self, *, mounts: MountTable, namespace: Namespace, infos: FileInfos,
                 background: BackgroundTasks) -> None:
        self.mounts = mounts
        self.namespace = namespace
        self.infos = infos
        self._background = background
        # Paths whose ASYNC_THROUGH upload is being moved into place in the store: writes,
        # deletes and renames of them wait (so no older upload lands after a newer write).
        self._moves_in_progress: dict[str, asyncio.Event] = {}
        # Writes prepared and not yet committed or aborted: path -> write id -> its lease.
        # While one is open, older uploads of the path wait; while an append is open, the
        # other writes of the path wait at PrepareWrite.
        self._leases: dict[str, dict[str, OpenWrite]] = {}
        # Set (and replaced) whenever a write of the path ends: PrepareWrite waits on it.
        self._write_ended: dict[str, asyncio.Event] = {}

    def moves_under(self, path: str) -> list[asyncio.Event]:
        return [event for p, event in self._moves_in_progress.items() if is_under(p, path)]

    async def wait_for_moves_under(self, path: str) -> None:
        """Wait until no upload at or below `path` is being moved into place."""
        while busy := self.moves_under(path):
            await busy[0].wait()

    def _end_write(self, path: str, write_id: str) -> None:
        open_writes = self._leases.get(path, {})
        open_writes.pop(write_id, None)
        if not open_writes:
            self._leases.pop(path, None)
        ended = self._write_ended.pop(path, None)
        if ended is not None:
            ended.set()

    def end_writes_of(self, worker_id: str) -> None:
        """A worker started again: the writes its previous run had open are over."""
        for path, open_writes in list(self._leases.items()):
            for write_id in [w for w, write in open_writes.items() if write.worker_id == worker_id]:
                log.info("write %s of %s ended with the previous run of worker %s", write_id, path, worker_id)
                self._end_write(path, write_id)

    def _open_writes(self, path: str) -> list[OpenWrite]:
        """The writes of `path` prepared and not yet ended (nor their leases run out)."""
        now = time.monotonic()
        open_writes = {w: write for w, write in self._leases.get(path, {}).items() if write.lease_end > now}
        if open_writes:
            self._leases[path] = open_writes
        else:
            self._leases.pop(path, None)
        return list(open_writes.values())

    def _has_open_write(self, path: str) -> bool:
        """Is a write of `path` prepared and not yet ended (nor its lease run out)?"""
        return bool(self._open_writes(path))

    def _would_overlap(self, path: str, exclusive: bool) -> bool:
        """Would a write of `path` now overlap one it must not (an append: any)?"""
        return any(exclusive or write.exclusive for write in self._open_writes(path))

    async def _wait_for_turn_to_write(self, path: str, exclusive: bool, deadline: float) -> None:
        """Wait until no upload of `path` is being moved into place and no write it must not
        overlap is open; Unavailable at `deadline` (time.monotonic())."""
        while True:
            await self.wait_for_moves_under(path)
            if not self._would_overlap(path, exclusive):
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

    async def remove_upload(self, mount: NsMount, version: str) -> None:
        """Remove a dropped write's upload from the store's upload folder (best effort: a
        leftover there is never listed)."""
        try:
            await self.mounts.store(mount).rm(upload_rel(version))
        except NotFound:
            pass
        except StrataError as exc:
            log.info("could not remove the upload of version %s from %s: %s", version, shown_url(mount.source), exc)

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
            await self.wait_for_moves_under(path)
            written = self.namespace.written(path)
            if written is None or written.landed <= prepared or written.version == request.version:
                return
            mount, rel = self.mounts.resolve(path)
            status = await self.mounts.store(mount).info(rel)
            if self.moves_under(path) or self.namespace.written(path) != written:
                continue  # another upload moved meanwhile: look again
            if status.version == (request.ufs_version or request.version):
                return  # this write's object came after the upload: it stands
            raise FailedPrecondition(
                f"{path}: the upload of an earlier ASYNC_THROUGH write (version {written.version}) was moved "
                f"into place in {self.mounts.store(mount).url(rel)} while this write was under way, over this "
                "write's object; the store holds the earlier one, which the file reads now. Write it again"
            )

    async def commit_file(self, request: pb.CommitFileRequest) -> pb.CommitFileResponse:
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
        return pb.CommitFileResponse(file=self.infos.of(entry))

    async def prepare_write(self, request: pb.PrepareWriteRequest) -> pb.PrepareWriteResponse:
        path = received(request.path)
        self.namespace.writable(path)  # before the worker puts a byte into the store
        deadline = time.monotonic() + WRITE_TURN_WAIT
        while True:
            await self._wait_for_turn_to_write(path, request.exclusive, deadline)
            if not request.overwrite:
                try:
                    await self.namespace.get_status(path)
                except NotFound:
                    pass
                else:
                    raise AlreadyExists(f"{path} already exists; write with overwrite to replace it")
            if not self.moves_under(path) and not self._would_overlap(path, request.exclusive):
                break  # nothing began while the store was asked
        # Older uploads of the file wait until this write ends: committed, it supersedes them;
        # failed, the file stays as it was (and its upload goes on). An append also holds
        # back the other writes of the file: each builds on the file as the one before left it.
        write_id = f"{self.namespace.generation}{WRITE_ID_SEPARATOR}{uuid.uuid4().hex}"
        self._leases.setdefault(path, {})[write_id] = OpenWrite(time.monotonic() + WRITE_LEASE, request.exclusive,
                                                                request.worker_id)
        return pb.PrepareWriteResponse(write_id=write_id)

    async def persist_file(self, request: pb.PersistFileRequest) -> pb.PersistFileResponse:
        path = received(request.path)
        if not request.version:
            raise InvalidArgument(f"persist of {path}: the version must not be empty")
        await self.wait_for_moves_under(path)
        target = self.namespace.pending_write(path, request.version)
        mount, _ = self.mounts.resolve(path)
        if target is not None and self._has_open_write(path):
            raise Unavailable(f"a newer write of {path} is in progress; the upload of version {request.version} waits for it")
        if target is None:
            written = self.namespace.written(path)
            if written is not None and written.version == request.version and written.persisted:
                # Moved into place before (an answer the worker did not get).
                return pb.PersistFileResponse(file=self.infos.of(await self.namespace.get_status(path)))
            log.info("dropping the upload of %s version %s: the file was removed or replaced", path, request.version)
            self._background.spawn(self.remove_upload(mount, request.version), f"remove-upload-{request.version}")
            return pb.PersistFileResponse(superseded=True)
        mount, rel = target
        store = self.mounts.store(mount)
        moving = self._moves_in_progress[path] = asyncio.Event()
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
            del self._moves_in_progress[path]
            moving.set()
        log.info("%s (version %s) is in the store", path, request.version)
        return pb.PersistFileResponse(file=self.infos.of(entry))

    async def abort_write(self, request: pb.AbortWriteRequest) -> pb.AbortWriteResponse:
        path = received(request.path)
        await self.wait_for_moves_under(path)
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
