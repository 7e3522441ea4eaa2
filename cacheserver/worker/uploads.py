"""ASYNC_THROUGH uploads: an acknowledged write's staged copy goes to the store in the
background, retried with capped exponential back-off for as long as it takes, across worker
restarts, until it is in the store or the file is removed or replaced.

On disk, in the worker's staging folder:

    <id>.part              the staged bytes of one write (fsynced before the write is acknowledged)
    <id>.upload.json       its record (`UploadRecord`): path, version, length, ...

The record is written before the write's blocks are placed and rewritten with
`acknowledged: true` once the master committed the file; only then is the writer answered.
A record that never got there belongs to a write whose writer got an error: its commit (if
any) is withdrawn and its blocks released. An acknowledged one is uploaded: first into the
store's upload folder, then the master moves it into place (`PersistFile`), so an upload of
a file removed or replaced meanwhile never shows in the store.

An acknowledged write whose staged copy is gone or cut short (the folder lost or damaged
while the record and the write's blocks were kept) is staged again from its blocks, which
this worker holds pinned and whose checksums are verified as they are read: an upload is
never dropped while its bytes exist. While a block is missing too, the record stays (the
write shows as pending) and the upload is tried again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from pydantic import BaseModel

from strata.contract.errors import NotFound, StrataError
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc
from ..common.blockrefs import block_count
from ..common.durable import fsync_dir, replacing, write_file
from ..namespace.permissions import upload_rel
from ..pendinguploads import sum_pending
from ..retry import call_with_backoff
from .mounts import WorkerMounts
from .settings import UploadSettings

log = logging.getLogger(__name__)

# The staging folder under the worker's data folder (in Kubernetes a volume of its own, see
# operator/builders/worker.py): staged writes and the records of their uploads.
STAGING_FOLDER = "staging"
STAGED_SUFFIX = ".part"
RECORD_SUFFIX = ".upload.json"
# Seconds for one master call of an upload (a status, an abort).
MASTER_CALL_TIMEOUT = 30.0
# Seconds for the master to move an upload into place: its own limit (master.writes
# PERSIST_MOVE_TIMEOUT, 120 s) and some room for the answer.
PERSIST_CALL_TIMEOUT = 150.0


class UploadRecord(BaseModel):
    """The record kept next to a staged ASYNC_THROUGH file until it is in the store."""

    path: str
    mount_id: int
    version: str
    length: int
    block_size: int
    # False until the master committed the file and the writer may be answered. Records of
    # the first format were written after the commit: True.
    acknowledged: bool = True
    # When the write was staged (ms since the epoch); 0 in the first format: the staged
    # file's mtime stands in.
    staged_unix_ms: int = 0
    # The master's id of the write (PrepareWrite), ended by its commit or its withdrawal.
    write_id: str = ""

    def refs(self) -> list[pb.BlockRef]:
        return [pb.BlockRef(mount_id=self.mount_id, path=self.path, version=self.version, index=i,
                            block_size=self.block_size, file_length=self.length, in_store=False)
                for i in range(block_count(self.length, self.block_size))]


class Superseded(Exception):
    """The file was removed or replaced (or its mount is gone): the upload is dropped.
    Not a StrataError, so the retry helper never retries it."""


# Releases a write's cached blocks: (refs, keep_pinned).
Release = Callable[[list[pb.BlockRef], bool], Awaitable[None]]
# One whole block from this worker's cache, its checksums verified; None when it is not here.
ReadBlock = Callable[[pb.BlockRef], Awaitable[bytes | None]]


def record_file(staged: Path) -> Path:
    return staged.with_name(staged.name.removesuffix(STAGED_SUFFIX) + RECORD_SUFFIX)


def staged_file(record: Path) -> Path:
    return record.with_name(record.name.removesuffix(RECORD_SUFFIX) + STAGED_SUFFIX)


def staged_files(staging_dir: Path) -> list[Path]:
    return sorted(p for p in staging_dir.glob(f"*{STAGED_SUFFIX}") if p.is_file()) if staging_dir.is_dir() else []


def record_files(staging_dir: Path) -> list[Path]:
    return sorted(p for p in staging_dir.glob(f"*{RECORD_SUFFIX}") if p.is_file()) if staging_dir.is_dir() else []


def _read_record(path: Path) -> UploadRecord | None:
    """The record in `path`; None (logged) when it cannot be read. Records are written
    atomically: an unreadable one is not ours to guess at."""
    try:
        return UploadRecord.model_validate_json(path.read_bytes())
    except (OSError, ValueError) as exc:
        log.error("upload record %s cannot be read (%s); its write is not uploaded", path, exc)
        return None


def _holds(staged: Path, length: int) -> bool:
    """The staged copy is there with the write's length."""
    try:
        return staged.stat().st_size == length
    except FileNotFoundError:
        return False


def _read_at(path: Path, offset: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def remove_stale_staging(staging_dir: Path) -> None:
    """Staged files of writes a previous run did not finish are useless (the writer got an
    error); those with an upload record stay (`Uploads.resume`). A record stays without its
    staged file too (its write is withdrawn, or staged again from its blocks and uploaded),
    unless it cannot be read."""
    for path in staged_files(staging_dir):
        if record_file(path).exists():
            continue
        try:
            os.unlink(path)
        except OSError as exc:
            log.warning("cannot remove stale staging file %s: %s", path, exc)
    for record in record_files(staging_dir):
        if not staged_file(record).exists() and _read_record(record) is None:
            record.unlink(missing_ok=True)
    for partial in staging_dir.glob(".*.tmp") if staging_dir.is_dir() else []:  # a record or copy cut short
        partial.unlink(missing_ok=True)


@dataclass
class _Upload:
    staged: Path
    record: UploadRecord
    task: asyncio.Task[None] | None = field(default=None)
    # The staged copy was compared with the write's blocks (once: an upload retried through
    # a store outage does not read it all again at every attempt).
    compared: bool = False


class Uploads:
    """The staged ASYNC_THROUGH writes of one worker and their uploads."""

    def __init__(self, staging_dir: Path, *, master: pb_grpc.MasterStub, mounts: WorkerMounts,
                 release: Release, read_block: ReadBlock, settings: UploadSettings | None = None) -> None:
        self.staging_dir = staging_dir
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        self._master = master
        self._mounts = mounts
        self._release = release
        self._read_block = read_block
        self.settings = settings or UploadSettings()
        self._uploads: dict[Path, _Upload] = {}
        self._load()

    # -- records ---------------------------------------------------------------------------

    def new_staged(self) -> Path:
        return self.staging_dir / f"{uuid.uuid4().hex}{STAGED_SUFFIX}"

    def _load(self) -> None:
        for record_path in record_files(self.staging_dir):
            record = _read_record(record_path)
            if record is None:
                continue  # left in place
            staged = staged_file(record_path)
            if not record.staged_unix_ms:
                stamped = staged if staged.exists() else record_path
                record = record.model_copy(update={"staged_unix_ms": int(stamped.stat().st_mtime * 1000)})
            self._uploads[staged] = _Upload(staged, record)

    def begin(self, staged: Path, record: UploadRecord) -> None:
        """Make a staged write durable and known before its blocks are placed: its bytes
        fsynced, its record (not acknowledged yet) written."""
        with staged.open("rb+") as f:
            os.fsync(f.fileno())
        write_file(record_file(staged), record.model_dump_json().encode())
        self._uploads[staged] = _Upload(staged, record)

    async def acknowledge(self, staged: Path) -> None:
        """The master committed the write: record that, then start its upload."""
        upload = self._uploads[staged]
        acknowledged = upload.record.model_copy(update={"acknowledged": True})
        await asyncio.to_thread(write_file, record_file(staged), acknowledged.model_dump_json().encode())
        upload.record = acknowledged
        self._start(upload)

    def _forget(self, upload: _Upload) -> None:
        record_file(upload.staged).unlink(missing_ok=True)
        upload.staged.unlink(missing_ok=True)
        self._uploads.pop(upload.staged, None)

    # -- running -----------------------------------------------------------------------------

    def resume(self) -> int:
        """Start the uploads (and the withdrawals of unacknowledged writes) a previous run
        left, once the master can be asked; returns how many were started."""
        started = 0
        for upload in list(self._uploads.values()):
            if upload.task is None:
                self._start(upload)
                started += 1
        return started

    def _start(self, upload: _Upload) -> None:
        work = self._upload(upload) if upload.record.acknowledged else self._withdraw(upload)
        upload.task = asyncio.ensure_future(work)
        upload.task.set_name(f"upload-{upload.record.path}")
        upload.task.add_done_callback(lambda task: self._ended(upload, task))

    def _ended(self, upload: _Upload, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return  # stopping: the record stays for the next run
        if task.exception() is not None:
            log.error("upload of %s stopped by an unexpected error; it resumes on the next registration",
                      upload.record.path, exc_info=task.exception())
            upload.task = None

    async def abort(self, staged: Path) -> None:
        """A write that could not be acknowledged: withdraw it now, or (master unreachable)
        from the next run on."""
        upload = self._uploads.get(staged)
        if upload is None:
            return
        try:
            await self._withdraw_once(upload.record)
        except (grpc.RpcError, StrataError) as exc:
            log.warning("could not withdraw the failed write of %s (%s); retried on the next registration",
                        upload.record.path, exc)
            return
        await self._release(upload.record.refs(), False)
        self._forget(upload)

    async def _withdraw(self, upload: _Upload) -> None:
        await call_with_backoff(
            lambda: self._withdraw_once(upload.record), what=f"withdrawing the failed write of {upload.record.path}",
            attempts=None, base_delay=self.settings.base_delay, max_delay=self.settings.max_delay,
            retry_on=(grpc.RpcError, StrataError),
        )
        await self._release(upload.record.refs(), False)
        self._forget(upload)

    async def _withdraw_once(self, record: UploadRecord) -> None:
        await self._master.AbortWrite(pb.AbortWriteRequest(path=record.path, version=record.version,
                                                             write_id=record.write_id), timeout=MASTER_CALL_TIMEOUT)

    async def _upload(self, upload: _Upload) -> None:
        record = upload.record
        try:
            await call_with_backoff(
                lambda: self._upload_once(upload), what=f"upload of {record.path} ({record.length} bytes)",
                attempts=None, base_delay=self.settings.base_delay, max_delay=self.settings.max_delay,
                retry_on=(grpc.RpcError, StrataError, OSError, TimeoutError),
            )
        except Superseded as exc:
            log.info("dropping the upload of %s: %s", record.path, exc)
            await self._release(record.refs(), False)
            self._forget(upload)
            return
        try:
            view = await self._mounts.get(record.mount_id)
            pinned = view.is_pinned(record.path)
        except StrataError:
            pinned = False
        await self._release(record.refs(), pinned)
        self._forget(upload)
        log.info("persisted %s (%d bytes, version %s)", record.path, record.length, record.version)

    async def _upload_once(self, upload: _Upload) -> None:
        """One try; an error no other type covers (a store library's own) is retried too:
        acknowledged data is never given up."""
        try:
            await self._try_upload(upload)
        except (Superseded, StrataError, grpc.RpcError, OSError, TimeoutError):
            raise
        except Exception as exc:  # noqa: BLE001 - retried like any store error
            raise StrataError(f"upload of {upload.record.path} failed: {exc!r}") from exc

    async def _try_upload(self, upload: _Upload) -> None:
        """The file still wants this upload? Upload it to the store's upload folder and have
        the master move it into place."""
        record = upload.record
        try:
            current = await self._master.GetStatus(pb.GetStatusRequest(path=record.path), timeout=MASTER_CALL_TIMEOUT)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise Superseded(f"{record.path} was removed") from None
            raise
        if current.version != record.version:
            raise Superseded(f"{record.path} was replaced (now version {current.version})")
        if current.persisted:
            return
        try:
            mount = await self._mounts.get(record.mount_id)
        except NotFound as exc:
            raise Superseded(str(exc)) from None
        if not await self._staged_matches(upload):
            await self._restage(upload)
        upload.compared = True
        made = await asyncio.wait_for(mount.store.write_file(upload_rel(record.version), upload.staged),
                                      self.settings.timeout_for(record.length))
        if made.length != record.length:
            # The staged copy is not the acknowledged write (damaged since): moved into place,
            # it would be the file, and the write's pinned blocks, its only whole copy, let go.
            message = (f"the upload of {record.path} (version {record.version}) from {upload.staged} made "
                       f"{made.length} bytes, the write has {record.length}: not moved into place; the "
                       "file's blocks stay pinned in the cache and the upload is tried again")
            log.error("%s", message)
            raise StrataError(message)
        response = await self._master.PersistFile(pb.PersistFileRequest(path=record.path, version=record.version),
                                                    timeout=PERSIST_CALL_TIMEOUT)
        if response.superseded:
            raise Superseded(f"{record.path} was removed or replaced while it was uploaded")

    async def _staged_matches(self, upload: _Upload) -> bool:
        """Does the staged copy hold the write's bytes? Its length, and the first time it is
        uploaded, the bytes of every block of the write this worker holds (read with their
        checksums verified): a copy damaged on disk with its length intact would otherwise be
        uploaded as the acknowledged file, and the blocks, its only good copy, let go."""
        record = upload.record
        if not await asyncio.to_thread(_holds, upload.staged, record.length):
            return False
        if upload.compared:
            return True
        for ref in record.refs():
            block = await self._read_block(ref)
            if block is None:
                continue  # not here to compare with: the length stands for it
            staged = await asyncio.to_thread(_read_at, upload.staged, ref.index * ref.block_size, len(block))
            if staged != block:
                log.error("the staged copy of %s (version %s) differs from block %d of the write: made again "
                          "from the write's blocks", record.path, record.version, ref.index)
                return False
        return True

    async def _restage(self, upload: _Upload) -> None:
        """Make the staged copy of an acknowledged write again from its blocks here (pinned;
        checksums verified as they are read), written beside it and renamed into place. A
        block that is not here: StrataError, and the upload is tried again later."""
        record = upload.record
        # Durable as any staged copy; its file and folder are fsynced here, off the event loop.
        with replacing(upload.staged, sync_file=False, sync_folder=False) as out:
            for ref in record.refs():
                data = await self._read_block(ref)
                if data is None:
                    raise StrataError(
                        f"the staged copy of {record.path} (version {record.version}, {record.length} bytes) is "
                        f"gone or cut short, and block {ref.index} of it is not cached on this worker: it cannot "
                        "be uploaded; the upload waits, and is tried again")
                await asyncio.to_thread(out.write, data)
            out.flush()
            await asyncio.to_thread(os.fsync, out.fileno())
        await asyncio.to_thread(fsync_dir, upload.staged.parent)
        log.warning("the staged copy of %s (version %s) was gone or cut short: made again from its %d cached "
                    "blocks", record.path, record.version, len(record.refs()))

    # -- reporting ---------------------------------------------------------------------------

    def pending(self) -> list[pb.PendingUploads]:
        """Acknowledged uploads not in the store yet, per mount."""
        parts: dict[int, list[pb.PendingUploads]] = {}
        for upload in self._uploads.values():
            r = upload.record
            if r.acknowledged:
                parts.setdefault(r.mount_id, []).append(
                    pb.PendingUploads(mount_id=r.mount_id, count=1, bytes=r.length, oldest_unix_ms=r.staged_unix_ms))
        return [sum_pending(p, mount_id) for mount_id, p in sorted(parts.items())]

    def is_pending(self, staged: Path) -> bool:
        return staged in self._uploads

    async def drain(self) -> int:
        """Wait, at most `drain_timeout` seconds, for the uploads under way (and those of
        writes acknowledged meanwhile) to end; returns how many acknowledged writes are
        still not in the store."""
        deadline = time.monotonic() + self.settings.drain_timeout
        while (left := deadline - time.monotonic()) > 0:
            running = [u.task for u in self._uploads.values() if u.task is not None and not u.task.done()]
            if not running:
                break
            await asyncio.wait(running, timeout=left)
        waiting = sum(1 for u in self._uploads.values() if u.record.acknowledged)
        if waiting:
            log.warning("stopping with %d acknowledged write(s) not yet in the store; they stay staged in %s "
                        "and are uploaded when a worker starts on that folder", waiting, self.staging_dir)
        return waiting

    async def close(self) -> None:
        tasks = [u.task for u in self._uploads.values() if u.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def now_ms() -> int:
    return int(time.time() * 1000)
