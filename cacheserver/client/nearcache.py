"""The near cache: small files' statuses and bytes kept on the disk of a host that runs no
worker, for the processes that come after (a training loader of each epoch).

A reader on such a host asks a worker on another host for every file it opens: one request
and its answer a file on each side. With a near cache folder (`ClientSettings.near_cache`)
the client keeps what such an open brought, a small file's status and its whole bytes, in one
record a path, and a new process of the host opens that file from its record with no request
at all, while the status may still be reused under the Mount's freshness contract: the same
rule as for the answers a process holds (client/held.py). After that the status is asked
again (the worker, else the master) and the record's bytes still serve it when the status
names the same version; a changed file is read anew. A status the master does not mark
reusable (a writable, close-to-open Mount) is never reused from here; only bytes of the
version its fresh status names are.

A record (`<folder>/strata-near-v1/<2 hex>/<32 hex>`, named by a hash of the cluster and the
path, so no path of the namespace reaches the disk) holds, in order: the head (MAGIC, the
status's length, the chunk size, the bytes' length, until when the status may be reused on
CLOCK_MONOTONIC and the boot it counts from), the status (a FileInfo), one CRC-32C a chunk of
the bytes (common/checksums.py), a CRC-32C of all that, then the bytes. Every read checks the
head's CRC and every chunk of the bytes it returns; a record that fails a check, is short, or
names another path is a miss, removed, and the open goes on as without the near cache.

Records are written as a new file renamed over the old one and never changed in place, so a
reader sees a whole record or none (not fsynced: a record torn by a power cut fails its check).
A process killed while writing leaves only a temporary file, removed by a later sweep.

Records are written by a thread of the process's own, not by the reader that brought the
bytes: a cold epoch asks for one file after another, and a record's create, write and rename
(0.1-1 ms each, more while the disk is busy) would add to every request. A record waits in
memory until it is written, PENDING_BYTES of them at most (past that a record is not kept:
the file is read through the workers next time); `forget` drops a waiting record of its path
and waits for one of its path being written, so no record outlives a `forget`. The thread
ends when it has had nothing to write for WRITER_LINGER seconds, and a process's exit waits
for it (it is no daemon), so what waits is written first; `close` writes it within a
deadline. A forked child starts a thread of its own.

The folder is bounded: each of its FANOUT subfolders holds at most 1/FANOUT of the quota, counted
by each process from one scan of the subfolder when it first writes there plus what it wrote
since; past that share it scans again and removes the records least recently used (to within
TOUCH_EVERY) until the subfolder is at SWEEP_TO of its share. An insert never scans more than
one subfolder. A folder that cannot be written (full, read-only) never fails a read: it is
said once, and reads go on through the workers.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import stat
import struct
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c
from google.protobuf.message import DecodeError

from strata.contract.proto import strata_pb2 as pb
from ..common.checksums import CHUNK_SIZE, compute_checksums, first_bad_chunk
from ..common.durable import replacing

log = logging.getLogger(__name__)

MAGIC = b"STRATANC"
# The folder of this record format inside the configured one (another format, another folder).
FORMAT_FOLDER = "strata-near-v1"
# Subfolders, each with its share of the quota: an insert scans one of them, never all.
FANOUT = 256
# A sweep leaves a subfolder at this part of its share, so the next inserts do not sweep again at once.
SWEEP_TO = 0.75
# Seconds between two updates of a record's time of use (one syscall on a hit at most this often).
TOUCH_EVERY = 60.0
# Seconds after which a temporary file is taken for one its writer left (a process killed while writing).
STALE_TEMPORARY = 600.0
# Bytes of a record read first: its head, status and checksums, and the whole of a file of a few KiB.
FIRST_READ = 4096
# Seconds an unwritable folder is not written again after a failed write.
WRITE_PAUSE = 60.0
# Bytes of records waiting to be written at most (see the module docstring).
PENDING_BYTES = 64 << 20
# Seconds the writing thread waits for another record before it ends.
WRITER_LINGER = 0.2
# Head: magic, status length, chunk size, bytes' length, until (CLOCK_MONOTONIC seconds; 0: not
# reusable), boot id (the boot CLOCK_MONOTONIC counts from).
_HEAD = struct.Struct("<8sIIId16s")
_CRC = struct.Struct("<I")
_NO_BOOT = bytes(16)


@functools.cache
def boot_id() -> bytes:
    """This boot's id (a status's `until` means nothing after a reboot); zeros if unknown, and
    then no status is kept for reuse."""
    try:
        return uuid.UUID(Path("/proc/sys/kernel/random/boot_id").read_text().strip()).bytes
    except (OSError, ValueError):
        return _NO_BOOT


class RecordError(ValueError):
    """A record that fails a check: a miss, and the record goes."""


@dataclass(frozen=True)
class NearRecord:
    info: pb.FileInfo  # the status as it was kept (valid_for_ms: as the answer gave it, until reusable() sets it)
    until: float       # time.monotonic() until which `info` may be reused; 0: never
    data: bytes        # the file's bytes, every chunk checked

    def reusable(self) -> pb.FileInfo | None:
        """The status while it may be reused, its valid_for_ms what is left of that; else None."""
        left = self.until - time.monotonic()
        if left <= 0.001:
            return None
        self.info.valid_for_ms = int(left * 1000)  # the record's own copy, decoded for this find
        return self.info

    def holds(self, info: pb.FileInfo) -> bool:
        """Whether these are the bytes of the file `info` names (mount, version, length)."""
        kept = self.info
        return (kept.mount_id, kept.version, kept.length, kept.block_size) == \
            (info.mount_id, info.version, info.length, info.block_size) and kept.path == info.path


def encode(info: pb.FileInfo, until: float, data: bytes | memoryview, chunk_size: int = CHUNK_SIZE) -> bytes:
    """The record of `info` (reusable until `until`, 0 for never) and the file's `data`."""
    status = info.SerializeToString(deterministic=True)
    boot = boot_id()
    if boot == _NO_BOOT:
        until = 0.0
    checksums = compute_checksums(data, chunk_size)
    meta = (_HEAD.pack(MAGIC, len(status), chunk_size, len(data), until, boot) + status
            + struct.pack(f"<{len(checksums)}I", *checksums))
    return meta + _CRC.pack(crc32c(meta)) + bytes(data)


def sizes(head: bytes) -> tuple[int, int]:
    """(bytes of a record before the file's bytes, the file's length), as the start of a
    record `head` (at least _HEAD.size bytes of it) says; RecordError if it is no record's."""
    if len(head) < _HEAD.size:
        raise RecordError(f"{len(head)} bytes, shorter than a head")
    magic, status_length, chunk_size, length = _HEAD.unpack_from(head, 0)[:4]
    if magic != MAGIC or chunk_size <= 0:
        raise RecordError("not a near cache record")
    return _HEAD.size + status_length + -(-length // chunk_size) * _CRC.size + _CRC.size, length


def decode_parts(meta: bytes, data: bytes, path: str) -> NearRecord:
    """The record of `path` made of `meta` (what comes before the file's bytes) and `data`,
    every check passed; RecordError naming the first that failed."""
    start, length = sizes(meta)
    if (len(meta), len(data)) != (start, length):
        raise RecordError(f"{len(meta)} + {len(data)} bytes where the head says {start} + {length}")
    _, status_length, chunk_size, _, until, boot = _HEAD.unpack_from(meta, 0)
    if crc32c(memoryview(meta)[:-_CRC.size]) != _CRC.unpack_from(meta, start - _CRC.size)[0]:
        raise RecordError("the head fails its CRC-32C")
    try:
        info = pb.FileInfo.FromString(meta[_HEAD.size:_HEAD.size + status_length])
    except DecodeError as exc:
        raise RecordError(f"the status does not parse: {exc}") from exc
    if info.path != path or info.length != length:
        raise RecordError(f"a record of {info.path!r} ({info.length} bytes), not of {path!r} ({length} bytes)")
    checksums = struct.unpack_from(f"<{-(-length // chunk_size)}I", meta, _HEAD.size + status_length)
    bad = first_bad_chunk(data, 0, checksums, chunk_size)
    if bad is not None:
        raise RecordError(f"chunk {bad} of the bytes fails its CRC-32C")
    return NearRecord(info, until if boot == boot_id() and boot != _NO_BOOT else 0.0, data)


@dataclass(frozen=True)
class _Waiting:
    """A record waiting to be written."""
    index: int  # its subfolder
    version: str
    record: bytes


class NearCache:
    """One near cache folder as one client uses it (thread-safe: records are whole files,
    written by one thread at a time; the counts of what it wrote are that thread's)."""

    def __init__(self, folder: str | os.PathLike[str], quota: int, cluster: str) -> None:
        """Records of the cluster `cluster` (its master's address) under `folder`, at most
        `quota` bytes in all; a folder that is another user's, or open to others, is not used
        (said once): anyone who can write it could plant bytes."""
        self.root = Path(folder) / FORMAT_FOLDER
        self._root = str(self.root)
        self.quota = quota
        self.share = quota // FANOUT
        self._cluster = cluster
        # Bytes each subfolder holds as this process counts them (its last scan plus what it
        # wrote since); -1: not scanned yet.
        self._held = [-1] * FANOUT
        self._made: set[str] = set()
        self._write_off_until = 0.0
        self._new_queue()
        self.usable = self._prepare()
        _caches.add(self)

    def _new_queue(self) -> None:
        """No record waiting and no writing thread (at the start, and in a forked child: the
        parent's thread is not there, nor the holders of its locks, and what waited is the
        parent's to write)."""
        self._waiting: OrderedDict[str, _Waiting] = OrderedDict()  # record file -> what to write there, oldest first
        self._waiting_bytes = 0
        self._changed = threading.Condition()  # guards the two above, `_writer` and `_in_flight`
        self._writer: threading.Thread | None = None  # None once it has decided to end
        self._in_flight: str | None = None  # the record file being written

    def _prepare(self) -> bool:
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            found = os.stat(self.root)
        except OSError as exc:
            log.warning("near cache %s cannot be made (%s): reads go through the workers", self.root, exc)
            return False
        if found.st_uid != os.getuid():
            log.warning("near cache %s belongs to uid %d, not this process's %d: not used", self.root,
                        found.st_uid, os.getuid())
            return False
        if stat.S_IMODE(found.st_mode) & 0o077:
            try:
                os.chmod(self.root, 0o700)
            except OSError as exc:
                log.warning("near cache %s is open to other users and cannot be closed (%s): not used", self.root, exc)
                return False
        return True

    def _where(self, path: str) -> tuple[int, str]:
        """The subfolder of `path`'s record and the record's file name (a str: pathlib costs
        more than the rest of a hit's lookup)."""
        digest = hashlib.blake2b(f"{self._cluster}\0{path}".encode(), digest_size=16).hexdigest()
        return int(digest[:2], 16), f"{self._root}/{digest[:2]}/{digest}"

    # -- reads -------------------------------------------------------------------------------

    def find(self, path: str) -> NearRecord | None:
        """The checked record of `path` (as the master answers paths: "/a/b"); None if there is
        none or it fails a check (then it is removed)."""
        if not self.usable:
            return None
        where = self._where(path)[1]
        try:
            fd = os.open(where, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            found = os.fstat(fd)
            # The head, status and checksums, then the file's bytes read as one object of
            # their own (no copy out of a larger one).
            first = os.pread(fd, FIRST_READ, 0)
            start, length = sizes(first)
            if found.st_size != start + length:
                raise RecordError(f"{found.st_size} bytes where the head says {start + length}")
            meta = first[:start] if len(first) >= start else first + os.pread(fd, start - len(first), len(first))
            data = first[start:] if len(first) >= start + length else os.pread(fd, length, start)
            if time.time() - found.st_mtime > TOUCH_EVERY:
                with contextlib.suppress(OSError):
                    os.utime(fd)  # used now: the last to go in a sweep
            return decode_parts(meta, data, path)
        except OSError:
            return None
        except RecordError as exc:
            log.warning("near cache record %s of %s fails a check (%s): removed, the file is read anew",
                        os.path.basename(where), path, exc)
            with contextlib.suppress(OSError):
                os.unlink(where)
            return None
        finally:
            os.close(fd)

    # -- writes ------------------------------------------------------------------------------

    def keep(self, info: pb.FileInfo, until: float, data: bytes | memoryview) -> None:
        """Keep the status `info`, reusable until `until` (time.monotonic(); 0: never), with the
        file's bytes. Never raises: a folder that cannot be written is said once a while."""
        if not self.usable or time.monotonic() < self._write_off_until or len(data) != info.length:
            return
        record = encode(info, until, data)
        if len(record) > self.share:
            return  # larger than a subfolder's share: not kept
        index, name = self._where(info.path)
        with self._changed:
            earlier = self._waiting.pop(name, None)
            if earlier is not None:
                self._waiting_bytes -= len(earlier.record)
            if self._waiting_bytes + len(record) > PENDING_BYTES:
                return  # the disk is behind: not kept
            self._waiting[name] = _Waiting(index, info.version, record)
            self._waiting_bytes += len(record)
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._write_waiting, name="strata-near-cache-writer")
                self._writer.start()
            else:
                self._changed.notify_all()  # the writer, and not only a flush that waits

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every record kept so far is written (or given up); False if `timeout`
        seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while self._waiting or self._in_flight is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Write what waits, for at most `timeout` seconds (a disk that does not answer keeps
        the rest unwritten: a cache can do without it)."""
        if not self.flush(timeout):
            log.warning("near cache %s: records still unwritten after %gs at close", self.root, timeout)

    def _write_waiting(self) -> None:
        """The writing thread: the records waiting, oldest first; ends after WRITER_LINGER
        seconds with none."""
        while True:
            with self._changed:
                if not self._waiting:
                    self._changed.wait(WRITER_LINGER)
                if not self._waiting:
                    self._writer = None
                    return
                name, waiting = self._waiting.popitem(last=False)
                self._waiting_bytes -= len(waiting.record)
                self._in_flight = name
            try:
                self._store(waiting.index, Path(name), waiting.record)
            finally:
                with self._changed:
                    self._in_flight = None
                    self._changed.notify_all()

    def _store(self, index: int, where: Path, record: bytes) -> None:
        if time.monotonic() < self._write_off_until:
            return
        try:
            self._write(where, record)
            self._count(index, where.parent, len(record))
        except OSError as exc:
            self._write_off_until = time.monotonic() + WRITE_PAUSE
            log.warning("near cache %s cannot be written (%s): reads go on through the workers; trying again in %gs",
                        self.root, exc, WRITE_PAUSE)

    def forget(self, path: str, version: str | None = None) -> None:
        """Remove the record of `path` (only one of `version`, if given)."""
        if not self.usable:
            return
        name = self._where(path)[1]
        with self._changed:
            waiting = self._waiting.get(name)
            if waiting is not None and version in (None, waiting.version):
                del self._waiting[name]
                self._waiting_bytes -= len(waiting.record)
            while self._in_flight == name:  # a record of the path being written lands first, then goes
                self._changed.wait()
        if version is not None:
            record = self.find(path)
            if record is None or record.info.version != version:
                return
        with contextlib.suppress(OSError):
            os.unlink(name)

    def _write(self, where: Path, record: bytes) -> None:
        folder = where.parent
        if folder.name not in self._made:
            folder.mkdir(mode=0o700, exist_ok=True)
            self._made.add(folder.name)
        try:
            with replacing(where, sync_file=False, sync_folder=False) as out:
                out.write(record)
        except FileNotFoundError:  # the folder was emptied meanwhile (by hand, or another tool): made again
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            folder.mkdir(mode=0o700, exist_ok=True)
            with replacing(where, sync_file=False, sync_folder=False) as out:
                out.write(record)

    def _count(self, index: int, folder: Path, size: int) -> None:
        """Count `size` bytes more in subfolder `index`; sweep it when it may be past its share."""
        if self._held[index] >= 0:
            self._held[index] += size
            if self._held[index] <= self.share:
                return
        self._held[index] = self.sweep(folder)

    def sweep(self, folder: Path) -> int:
        """Bring `folder` (a subfolder) within its share, the least recently used records first,
        and remove temporary files left by killed writers; the bytes it holds then."""
        now = time.time()
        records: list[tuple[float, int, str]] = []
        total = 0
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    found = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed meanwhile
                if entry.name.endswith(".tmp"):
                    if now - found.st_mtime > STALE_TEMPORARY:
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)
                        continue
                else:
                    records.append((found.st_mtime, found.st_size, entry.path))
                total += found.st_size
        if total <= self.share:
            return total
        records.sort()
        goal = int(self.share * SWEEP_TO)
        for _, size, path in records:
            if total <= goal:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            total -= size
        return total


# Every near cache of the process, to be set right in a forked child.
_caches: weakref.WeakSet[NearCache] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for cache in list(_caches):
        cache._new_queue()


os.register_at_fork(after_in_child=_after_fork_in_child)
