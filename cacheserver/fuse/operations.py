"""The Strata namespace (or one subtree of it) as a POSIX file system: the operations the FUSE
session (session.py) calls by path, answered with the client library.

- Metadata: the kernel keeps attributes and directory entries for `attr_timeout` seconds
  (see `attr_timeout_for`); this process keeps what a listing returned for as long, so
  `ls -l` costs one listing, not one call per file.
- Reads: one client file object per open file. The kernel's page cache of a file is kept
  across opens while the file's version (its content identity) stays the one seen at the
  previous open; a changed file starts cold. While a file is open at another version (opened
  before it changed), a new open reads around the page cache (direct I/O): that cache is
  one per file, and the other handle's reads fill it with its version's pages. The kernel
  also holds one size per file and cuts reads through the page cache there: while handles
  read a file so, whoever asks about it is told their version's size and time. An open
  answered from a status the client held (see client/core.py) whose first read is refused
  because the file changed in the store goes on as the new version only where the page
  cache cannot mix the two: the handle reads directly, or it is the only handle of the file
  since its open dropped the cached pages and the length is the kernel's; else the read
  fails with EIO as it would have (the next open asks the master).
- Writes: buffered in a local spool file and written as a whole through a worker, with the
  mount's write type (or the one given), on flush/fsync/close (see handles.py). Opening an
  existing file for writing without O_TRUNC first copies it into the spool.
- mkdir makes a directory that exists in this process until a file is written below it
  (stores such as S3 have no empty directories); so does removing the last entry of a folder
  that exists in the store only as a key prefix: it stays a folder until rmdir, as on a disk
  (rm -r, shutil.rmtree and find -delete work).
- utimens sets a file's modification time in Strata's namespace (kept while the file's content
  stays the same), so rsync -a finds unchanged files unchanged. chmod and chown are accepted
  and change nothing: modes and owners come from the store.
- Inode numbers are derived from the namespace path: the same file has the same number on
  every mount (tools that key on st_ino, such as find and tar, see one file across remounts).
- File handles are numbered from the time the process started, with the lowest bit set for
  files open for writing: a successor process (see keeper.py) tells the handles of its
  predecessor from its own, and reads from writes.
- `user.strata.locations` lists the hosts holding each block (see locations.py).
- A read-only mount (`--read-only`, or a Strata mount with readOnly) refuses changes with EROFS.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import itertools
import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from cachetools import TTLCache

from strata.contract.constants import XATTR_LOCATIONS
from strata.contract.errors import (
    AlreadyExists,
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    StrataError,
    Unauthenticated,
    Unavailable,
)
from strata.contract.proto import strata_pb2 as pb
from ..client.fs import StrataFileSystem
from ..common.paths import is_under, join, parent
from .handles import ReadHandle, ReadRecords, WriteHandle
from .interface import MAX_IO, UTIME_NOW, UTIME_OMIT, FuseError
from .locations import format_locations
from .openreads import Opened, OpenReads

log = logging.getLogger("strata.fuse")

# Metadata is reused at most this long, whatever the mounts' sync intervals say: changes made
# through other Strata clients show up in the master at once, but not in this kernel's cache.
MAX_ATTR_TIMEOUT = 60.0
# The same for read-only Strata mounts: no Strata client changes them, and the master itself
# sees a change in the store only at its next metadata sync (the mount's interval).
MAX_READ_ONLY_ATTR_TIMEOUT = 3600.0
# Files of a read-only mount read at once whose client file objects are kept (see read_at).
DEFAULT_READERS = 256
# A mount point over no Strata mount (yet): check again after this long.
DEFAULT_ATTR_TIMEOUT = 1.0
# Capacity and use shown by statfs (df) are refreshed at most this often.
STATFS_TTL = 5.0
# Paths whose attributes or last-open version are remembered, at most.
REMEMBERED = 100_000
STATFS_BLOCK = 4096
ENOATTR = getattr(errno, "ENOATTR", errno.ENODATA)

_ERRNO = {
    NotFound: errno.ENOENT,
    AlreadyExists: errno.EEXIST,
    PermissionDenied: errno.EACCES,
    Unauthenticated: errno.EACCES,
    InvalidArgument: errno.EINVAL,
    ResourceExhausted: errno.ENOSPC,
    Unavailable: errno.EIO,
    DataLoss: errno.EIO,
    FailedPrecondition: errno.EIO,
}


def inode_of(ns: str) -> int:
    """The inode number of a namespace path: the same on every mount, never 0 or 1 (the
    kernel's own root number), 63 bits so that signed readers see it positive."""
    digest = hashlib.blake2b(ns.encode(), digest_size=8).digest()
    return max(2, int.from_bytes(digest, "big") >> 1)


def errno_of(exc: StrataError) -> int:
    for cls, code in _ERRNO.items():
        if isinstance(exc, cls):
            return code
    return errno.EIO


def attr_timeout_for(mounts: Iterable[pb.MountInfo], root: str) -> float:
    """How long metadata of a FUSE mount of `root` may be reused: the shortest metadata sync
    interval of the Strata mounts it shows (0: never reuse), never more than MAX_ATTR_TIMEOUT,
    or MAX_READ_ONLY_ATTR_TIMEOUT for a read-only Strata mount (-1, "never sync", counts as
    that)."""
    shown = [m for m in mounts if is_under(m.path, root) or is_under(root, m.path)]
    if not shown:
        return DEFAULT_ATTR_TIMEOUT

    def longest(mount: pb.MountInfo) -> float:
        most = MAX_READ_ONLY_ATTR_TIMEOUT if mount.options.read_only else MAX_ATTR_TIMEOUT
        interval = mount.options.metadata_sync_interval
        return most if interval < 0 else min(float(interval), most)

    return min(longest(m) for m in shown)


@dataclass(frozen=True)
class FuseSettings:
    root: str = "/"             # namespace path shown at the mount point
    read_only: bool = False     # refuse every change with EROFS
    write_type: pb.WriteType.ValueType = pb.WRITE_TYPE_UNSPECIFIED  # of files written; unspecified: the mount's
    attr_timeout: float = DEFAULT_ATTR_TIMEOUT  # seconds metadata is reused (kernel and here)
    spool_dir: str | None = None  # where written files are buffered; None: the temp directory
    handles_dir: Path | None = None  # what each read handle reads, for a successor (handles.ReadRecords)
    readers: int = DEFAULT_READERS  # client file objects kept for files the kernel opened without asking


F = TypeVar("F", bound=Callable[..., Any])


def _errors(fn: F) -> F:
    """Turn the client's errors into the errno the caller of the system call sees."""

    @functools.wraps(fn)
    def wrapper(self: StrataOperations, *args: Any) -> Any:
        try:
            return fn(self, *args)
        except FuseError:
            raise
        except StrataError as exc:
            code = errno_of(exc)
            (log.debug if code == errno.ENOENT else log.warning)("%s%r: %s", fn.__name__, args[:1], exc)
            raise FuseError(code) from exc
        except IsADirectoryError as exc:
            raise FuseError(errno.EISDIR) from exc
        except OSError as exc:
            if exc.errno:
                raise
            log.exception("%s%r failed", fn.__name__, args[:1])
            raise FuseError(errno.EIO) from exc
        except Exception as exc:
            log.exception("%s%r failed", fn.__name__, args[:1])
            raise FuseError(errno.EIO) from exc

    return wrapper  # type: ignore[return-value]


class _AttrCache:
    """FileInfo by namespace path for `ttl` seconds (at most REMEMBERED paths, the least
    recently used go first), dropped when this mount changes the path."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._entries: TTLCache[str, pb.FileInfo] | None = TTLCache(REMEMBERED, ttl) if ttl > 0 else None
        self._lock = threading.Lock()

    def get(self, path: str) -> pb.FileInfo | None:
        if self._entries is None:
            return None
        with self._lock:
            return self._entries.get(path)

    def put(self, info: pb.FileInfo) -> None:
        if self._entries is None:
            return
        with self._lock:
            self._entries[info.path] = info

    def drop(self, path: str) -> None:
        """Forget `path` and everything below it."""
        if self._entries is None:
            return
        with self._lock:
            for key in [k for k in self._entries if is_under(k, path)]:
                del self._entries[key]


class StrataOperations:
    """Paths are below the mount point ("/" is the mount's root); times are in nanoseconds."""

    def __init__(self, fs: StrataFileSystem, settings: FuseSettings) -> None:
        self.fs = fs
        self.client = fs.client
        self.settings = settings
        self.root = settings.root
        self._attrs = _AttrCache(settings.attr_timeout)
        self._handles: dict[int, ReadHandle | WriteHandle] = {}
        self._open_reads = OpenReads()
        self._records = ReadRecords(settings.handles_dir)
        # Handle numbers of this process start above any its predecessor used (one per microsecond at most).
        self._ids = itertools.count(time.time_ns() // 1000)
        self._versions: OrderedDict[str, str] = OrderedDict()
        self._readers: OrderedDict[tuple[str, str], ReadHandle] = OrderedDict()  # by (path, version), see read_at
        self._new_dirs: set[str] = set()  # made by mkdir, not (yet) known to the master
        self._lock = threading.Lock()
        self._statfs: tuple[float, dict[str, int]] | None = None
        self._uid, self._gid = os.getuid(), os.getgid()

    # -- helpers -------------------------------------------------------------------------------

    def _ns(self, path: str) -> str:
        """The namespace path of a path below the mount point."""
        return join(self.root, path.lstrip("/")) if path != "/" else self.root

    def _info(self, ns: str) -> pb.FileInfo:
        info = self._attrs.get(ns)
        if info is None:
            info = self.client.stat(ns)
            self._attrs.put(info)
        return info

    def _stat(self, ns: str, *, is_dir: bool, size: int = 0, mtime_ns: int = 0, read_only: bool = False) -> dict[str, Any]:
        mode = (stat.S_IFDIR | 0o755) if is_dir else (stat.S_IFREG | 0o644)
        if read_only or self.settings.read_only:
            mode &= ~0o222
        return {
            "st_ino": inode_of(ns), "st_mode": mode, "st_nlink": 2 if is_dir else 1, "st_size": size,
            "st_uid": self._uid, "st_gid": self._gid,
            "st_mtime": mtime_ns, "st_ctime": mtime_ns, "st_atime": mtime_ns,
            "st_blocks": (size + 511) // 512,
            # Tools size their buffers by this (cp, Python's shutil): large reads and writes.
            "st_blksize": MAX_IO,
        }

    def _info_stat(self, info: pb.FileInfo) -> dict[str, Any]:
        return self._stat(info.path, is_dir=info.is_dir, size=info.length, mtime_ns=info.mtime_unix_ms * 1_000_000,
                          read_only=info.read_only)

    def _writers(self, ns: str) -> list[WriteHandle]:
        with self._lock:
            return [h for h in self._handles.values() if isinstance(h, WriteHandle) and h.path == ns and not h.discarded]

    def _add(self, handle: ReadHandle | WriteHandle) -> int:
        with self._lock:
            return self._add_locked(handle)

    def _add_locked(self, handle: ReadHandle | WriteHandle) -> int:
        fh = next(self._ids) << 1 | isinstance(handle, WriteHandle)
        self._handles[fh] = handle
        self._open_reads.change(handle, 1)
        return fh

    @staticmethod
    def is_write_handle(fh: int) -> bool:
        return bool(fh & 1)

    def open_files(self) -> int:
        with self._lock:
            return len(self._handles)

    def has_handle(self, fh: int) -> bool:
        return fh in self._handles

    @_errors
    def reopen(self, path: str, fh: int) -> None:
        """Open `path` for reading as handle `fh` (one a predecessor process opened), at the
        version the predecessor opened it with."""
        self._reopen(fh, self._ns(path), self._records.get(fh))

    def adopt(self) -> int:
        """Open again, before serving, every read handle a predecessor recorded, each at its
        version: until its next read a handle of an older version would not count when a new
        open decides whether the page cache may be used. The number adopted (a handle that
        cannot be opened now is opened at its next read)."""
        adopted = 0
        for fh, info in self._records.all().items():
            try:
                self._reopen(fh, info.path, info)
                adopted += 1
            except StrataError as exc:
                log.warning("cannot open %s again for handle %d now (at its next read then): %s", info.path, fh, exc)
        return adopted

    def _reopen(self, fh: int, ns: str, info: pb.FileInfo | None) -> None:
        file = self.fs.open(ns, "rb", file_info=info)
        file.may_reopen = lambda old, new: False  # how the predecessor opened it is not known here
        handle = ReadHandle(file)
        with self._lock:
            old = self._handles.setdefault(fh, handle)
            if old is handle:
                self._open_reads.change(handle, 1)
        if old is not handle:  # another thread was first
            handle.close()

    def _handle(self, fi: Any) -> ReadHandle | WriteHandle:
        handle = self._handles.get(fi.fh)
        if handle is None:
            raise FuseError(errno.EBADF)
        return handle

    def _check_writable(self, ns: str) -> None:
        """EROFS unless a file may be written at `ns` (checked on the closest existing parent)."""
        if self.settings.read_only:
            raise FuseError(errno.EROFS)
        path = ns
        while True:
            try:
                info = self._info(path)
            except NotFound:
                if path in self._new_dirs or path == "/":
                    return
                path = parent(path)
                continue
            if info.read_only:
                raise FuseError(errno.EROFS)
            return

    def _upload(self, ns: str, chunks: Iterator[bytes]) -> pb.FileInfo:
        info = self.client.write_file(ns, chunks, write_type=self.settings.write_type)
        self._attrs.drop(ns)
        with self._lock:
            self._page_cache_locked(ns, info.version)
        return info

    def _page_cache_locked(self, ns: str, version: str) -> tuple[bool, bool]:
        """Record that `ns` is opened (or was written) at `version`: (whether the pages the
        kernel holds of it may be kept, whether a handle of it must read around them).

        The kernel keeps one page cache per file, filled by the reads of every handle open on
        it, whichever version each handle reads. While a handle of another version is open,
        its reads may put that version's pages there: a handle of this version then reads
        directly (direct I/O), and the next open that uses the page cache starts it cold.
        Otherwise what the kernel holds is kept when the version is the one seen last.
        Called with `self._lock` held."""
        if any(other != version for other in self._open_reads.versions(ns)):
            self._versions.pop(ns, None)
            return False, True
        same = self._versions.get(ns) == version
        self._versions[ns] = version
        self._versions.move_to_end(ns)
        while len(self._versions) > REMEMBERED:
            self._versions.popitem(last=False)
        return same, False

    def _may_switch(self, opened: Opened, fh: int, old: pb.FileInfo, new: pb.FileInfo) -> bool:
        """May read handle `fh`, whose first read was refused because `old` changed in the
        store, go on as `new`? Only where the kernel's page cache cannot hold pages of `old`
        for it: a handle that reads directly; or one that dropped them at its open (no keep
        cache), with no other handle of the file opened or released since, and the length
        the kernel has (it cuts cached reads at the size it was told). If so, it is counted as
        `new` from now on."""
        ns = opened.ns
        with self._lock:
            alone = self._open_reads.alone(ns, old.version, opened.changes)
            if not (opened.direct_io or (alone and not opened.keep_cache and new.length == old.length)):
                return False
            self._open_reads.move(ns, old, new, direct=opened.direct_io)
            if not opened.direct_io:
                self._versions[ns] = new.version
                self._versions.move_to_end(ns)
        try:
            self._records.add(fh, new)  # a successor opens it again as `new`
        except BaseException:
            with self._lock:
                self._open_reads.move(ns, new, old, direct=opened.direct_io)
            raise
        self._attrs.put(new)
        return True

    def _page_cached(self, ns: str) -> pb.FileInfo | None:
        with self._lock:
            return self._open_reads.cached(ns)

    def _forget(self, ns: str) -> None:
        self._attrs.drop(ns)
        with self._lock:
            for key in [k for k in self._versions if is_under(k, ns)]:
                del self._versions[key]

    def commit_all(self) -> None:
        """Upload every changed open file (before unmounting)."""
        with self._lock:
            writers = [h for h in self._handles.values() if isinstance(h, WriteHandle)]
        for writer in writers:
            try:
                writer.commit(self._upload)
            except StrataError as exc:
                log.error("could not write %s: %s", writer.path, exc)

    # -- metadata --------------------------------------------------------------------------------

    @_errors
    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        """The kernel holds one size of a file and cuts reads through the page cache there:
        while handles read a file so, it is told their version's status, whoever asks (a
        handle of another version reads directly, and is not cut); else an open file's own."""
        handle = self._handles.get(fh.fh) if fh is not None else None
        if isinstance(handle, ReadHandle):
            return self._info_stat(self._page_cached(handle.info.path) or handle.info)
        ns = self._ns(path)
        writers = [handle] if isinstance(handle, WriteHandle) else self._writers(ns)
        if writers:
            w = writers[-1]
            return self._stat(ns, is_dir=False, size=w.size, mtime_ns=w.mtime_ns)
        cached = self._page_cached(ns)
        if cached is not None:
            return self._info_stat(cached)
        try:
            return self._info_stat(self._info(ns))
        except NotFound:
            if ns in self._new_dirs:
                return self._stat(ns, is_dir=True, mtime_ns=time.time_ns())
            raise

    @_errors
    def status(self, path: str) -> pb.FileInfo | None:
        """The status of the file at `path` (None: a directory, or a file being written here)."""
        ns = self._ns(path)
        if self._writers(ns):
            return None
        try:
            info = self._info(ns)
        except NotFound:
            if ns in self._new_dirs:
                return None
            raise
        return None if info.is_dir else info

    @_errors
    def read_at(self, info: pb.FileInfo, size: int, offset: int, changed: Callable[[pb.FileInfo], None]) -> bytes:
        """Bytes of the file as status `info` names it, for a read that comes with no open file
        (a read-only mount whose kernel opens files without asking, see session.py). A client
        file object per file and version is kept for the reads that follow, at most
        `settings.readers` (the least recently read go first): what this process holds stays
        bounded however many files are open. A version no longer in the store fails (EIO),
        and `changed` is told the status the master has now."""
        key = (info.path, info.version)
        with self._lock:
            reader = self._readers.get(key)
            if reader is not None:
                self._readers.move_to_end(key)
        if reader is None:
            file = self.fs.open(info.path, "rb", file_info=info)
            file.may_reopen = lambda old, new: False  # the kernel may hold pages of `info`'s version
            reader = ReadHandle(file)
            with self._lock:
                reader = self._readers.setdefault(key, reader)
                self._readers.move_to_end(key)
                while len(self._readers) > self.settings.readers:
                    self._readers.popitem(last=False)  # closed when its last read ends
        try:
            return reader.read(size, offset)
        except FailedPrecondition:  # the file changed in the store
            fresh = self.client.stat(info.path, fresh=True)
            if fresh.version != info.version:
                changed(fresh)
            raise

    def drop_reader(self, old: pb.FileInfo, new: pb.FileInfo | None = None) -> None:
        """The file object read_at keeps for `old`, if any, is no longer needed; `new`: the
        file's status now (what getattr and status answer from now on)."""
        with self._lock:
            self._readers.pop((old.path, old.version), None)
        if new is not None:
            self._attrs.put(new)

    def readers(self) -> int:
        with self._lock:
            return len(self._readers)

    @_errors
    def readdir(self, path: str, fh: Any) -> list[Any]:
        ns = self._ns(path)
        names: dict[str, int] = {}
        try:
            for entries in self.client.ls_pages(ns):  # a folder of any size, a page at a time
                if len(entries) == 1 and entries[0].path == ns and not entries[0].is_dir:
                    raise FuseError(errno.ENOTDIR)
                for entry in entries:
                    self._attrs.put(entry)
                    names[entry.name] = stat.S_IFDIR if entry.is_dir else stat.S_IFREG
        except NotFound:
            if ns not in self._new_dirs:
                raise
        with self._lock:
            for d in self._new_dirs:
                if parent(d) == ns:
                    names.setdefault(d.rsplit("/", 1)[1], stat.S_IFDIR)
            for h in self._handles.values():
                if isinstance(h, WriteHandle) and not h.discarded and parent(h.path) == ns:
                    names.setdefault(h.path.rsplit("/", 1)[1], stat.S_IFREG)
        up = parent(ns) if ns != self.root else ns
        return [(".", {"st_mode": stat.S_IFDIR, "st_ino": inode_of(ns)}, 0),
                ("..", {"st_mode": stat.S_IFDIR, "st_ino": inode_of(up)}, 0)] + [
            (n, {"st_mode": mode, "st_ino": inode_of(join(ns, n))}, 0) for n, mode in sorted(names.items())]

    @_errors
    def statfs(self, path: str) -> dict[str, int]:
        cached = self._statfs
        if cached is not None and time.monotonic() - cached[0] < STATFS_TTL:
            return cached[1]
        try:
            capacity = self.client.capacity()  # a volume's data credential may not ask for a report
            total, used = capacity.capacity, min(capacity.used, capacity.capacity)
        except StrataError as exc:  # df must not fail because the master is busy
            log.warning("statfs: %s", exc)
            total = used = 0
        free = (total - used) // STATFS_BLOCK
        result = {"f_bsize": STATFS_BLOCK, "f_frsize": STATFS_BLOCK, "f_blocks": total // STATFS_BLOCK,
                  "f_bfree": free, "f_bavail": free, "f_namemax": 255}
        self._statfs = (time.monotonic(), result)
        return result

    @_errors
    def listxattr(self, path: str) -> list[str]:
        ns = self._ns(path)
        if self._writers(ns) or not self._info(ns).is_dir:
            return [XATTR_LOCATIONS]
        return []

    @_errors
    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        ns = self._ns(path)
        if name != XATTR_LOCATIONS:
            raise FuseError(ENOATTR)
        if self._writers(ns):
            return b""  # not written to the cache yet
        if self._info(ns).is_dir:
            raise FuseError(ENOATTR)
        return format_locations(self.client.block_locations(ns).blocks).encode()

    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int:
        raise FuseError(errno.ENOTSUP)

    def removexattr(self, path: str, name: str) -> int:
        raise FuseError(errno.ENOTSUP)

    def chmod(self, path: str, mode: int) -> int:
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        return 0

    @_errors
    def utimens(self, path: str, times: Any = None) -> int:
        ns = self._ns(path)
        mtime_ns = times[1] if times is not None else UTIME_NOW
        if mtime_ns == UTIME_OMIT:  # only the access time, which is not kept
            return 0
        if mtime_ns == UTIME_NOW:
            mtime_ns = time.time_ns()
        writers = self._writers(ns)
        for writer in writers:  # an open file: its bytes go to the store first, then its time
            writer.commit(self._upload)
            writer.mtime_ns = mtime_ns
        self._check_writable(ns)
        try:
            self.client.set_mtime(ns, mtime_ns // 1_000_000)
        except NotFound:
            if ns not in self._new_dirs and not writers:
                raise
        finally:
            self._attrs.drop(ns)
        return 0

    # -- files -----------------------------------------------------------------------------------

    @_errors
    def open(self, path: str, fi: Any) -> int:
        ns = self._ns(path)
        if fi.flags & os.O_ACCMODE == os.O_RDONLY:
            file = self.fs.open(ns, "rb")
            reader = ReadHandle(file)
            self._attrs.put(reader.info)
            with self._lock:  # decided and added at once: a handle of another version opened meanwhile counts
                keep, direct = self._page_cache_locked(ns, reader.info.version)
                fi.keep_cache, fi.direct_io = int(keep), int(direct)
                reader.direct = direct
                fi.fh = self._add_locked(reader)
                opened = Opened(ns, keep, direct, self._open_reads.changes(ns))
            file.may_reopen = functools.partial(self._may_switch, opened, fi.fh)
            try:
                self._records.add(fi.fh, reader.info)
            except BaseException:
                self.release(path, fi)
                raise
            return 0
        self._check_writable(ns)
        handle = WriteHandle(ns, self.settings.spool_dir, dirty=bool(fi.flags & os.O_TRUNC))
        if not fi.flags & os.O_TRUNC:
            existing = [w for w in self._writers(ns) if w is not handle]
            try:
                if existing:  # another open writer holds the newest bytes
                    handle.fill([existing[-1].read(existing[-1].size, 0)])
                elif self._info(ns).length:
                    handle.fill(self._read_all(ns))
            except BaseException:
                handle.close()
                raise
        fi.fh = self._add(handle)
        return 0

    def _read_all(self, ns: str) -> Iterator[bytes]:
        with self.fs.open(ns, "rb") as f:
            while data := f.read(MAX_IO * 4):
                yield data

    @_errors
    def create(self, path: str, mode: int, fi: Any) -> int:
        ns = self._ns(path)
        self._check_writable(ns)
        fi.fh = self._add(WriteHandle(ns, self.settings.spool_dir, dirty=True))
        self._forget(ns)
        return 0

    @_errors
    def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
        return self._handle(fi).read(size, offset)

    @_errors
    def write(self, path: str, data: bytes | memoryview, offset: int, fi: Any) -> int:
        return self._writer(fi).write(data, offset)

    @_errors
    def append(self, path: str, data: bytes | memoryview, fi: Any) -> int:
        """write() at the end of the open file (one opened with O_APPEND)."""
        return self._writer(fi).append(data)

    def _writer(self, fi: Any) -> WriteHandle:
        handle = self._handle(fi)
        if not isinstance(handle, WriteHandle):
            raise FuseError(errno.EBADF)
        return handle

    @_errors
    def truncate(self, path: str, length: int, fh: Any = None) -> int:
        ns = self._ns(path)
        handle = self._handles.get(fh.fh) if fh is not None else None
        writers = [handle] if isinstance(handle, WriteHandle) else self._writers(ns)
        if writers:
            for writer in writers:
                writer.truncate(length)
            return 0
        self._check_writable(ns)
        writer = WriteHandle(ns, self.settings.spool_dir)
        try:
            if length:
                writer.fill(self._read_all(ns))
            writer.truncate(length)
            writer.commit(self._upload)
        finally:
            writer.close()
        return 0

    def _commit(self, fi: Any) -> int:
        handle = self._handle(fi)
        if isinstance(handle, WriteHandle):
            try:
                handle.commit(self._upload)
            except StrataError as exc:
                log.error("could not write %s: %s", handle.path, exc)
                raise FuseError(errno_of(exc) if isinstance(exc, ResourceExhausted) else errno.EIO) from exc
        return 0

    @_errors
    def flush(self, path: str, fi: Any) -> int:
        return self._commit(fi)

    @_errors
    def fsync(self, path: str, datasync: int, fi: Any) -> int:
        return self._commit(fi)

    @_errors
    def release(self, path: str, fi: Any) -> int:
        with self._lock:
            handle = self._handles.pop(fi.fh, None)
            if handle is not None:
                self._open_reads.change(handle, -1)
        if not self.is_write_handle(fi.fh):
            self._records.remove(fi.fh)  # a predecessor's handle this process never read included
        if handle is None:
            return 0
        try:
            if isinstance(handle, WriteHandle):
                handle.commit(self._upload)  # normally done by flush already
        finally:
            handle.close()
        return 0

    # -- changes ---------------------------------------------------------------------------------

    @_errors
    def unlink(self, path: str) -> int:
        ns = self._ns(path)
        self._check_writable(ns)
        writers = self._writers(ns)
        for writer in writers:
            writer.discard()
        try:
            self.client.rm(ns)
        except NotFound:
            if not writers:
                raise
        finally:
            self._forget(ns)
        self._keep_folder(parent(ns))
        return 0

    def _keep_folder(self, ns: str) -> None:
        """A folder whose last entry was just removed stays a folder in this process until
        rmdir (in stores such as S3 it vanishes with its last key)."""
        if ns != self.root and is_under(ns, self.root):
            with self._lock:
                self._new_dirs.add(ns)

    @_errors
    def mkdir(self, path: str, mode: int) -> int:
        ns = self._ns(path)
        self._check_writable(ns)
        try:
            self._info(ns)
        except NotFound:
            with self._lock:
                if ns in self._new_dirs:
                    raise FuseError(errno.EEXIST) from None
                self._new_dirs.add(ns)
            return 0
        raise FuseError(errno.EEXIST)

    def _children(self, ns: str) -> bool:
        """True if this process holds something below `ns` the master does not know yet."""
        with self._lock:
            return any(d != ns and is_under(d, ns) for d in self._new_dirs) or any(
                isinstance(h, WriteHandle) and not h.discarded and is_under(h.path, ns) for h in self._handles.values())

    @_errors
    def rmdir(self, path: str) -> int:
        ns = self._ns(path)
        self._check_writable(ns)
        if self._children(ns):
            raise FuseError(errno.ENOTEMPTY)
        try:
            if self.client.ls(ns):
                raise FuseError(errno.ENOTEMPTY)
            self.client.rm(ns)
        except NotFound:
            if ns not in self._new_dirs:
                raise
        except FailedPrecondition as exc:  # not empty after all (a race with another client)
            raise FuseError(errno.ENOTEMPTY) from exc
        finally:
            with self._lock:
                self._new_dirs.discard(ns)
            self._forget(ns)
        self._keep_folder(parent(ns))
        return 0

    @_errors
    def rename(self, old: str, new: str) -> int:
        src, dst = self._ns(old), self._ns(new)
        self._check_writable(src)
        self._check_writable(dst)
        for writer in self._writers(src):  # the store must hold what is being moved
            writer.commit(self._upload)
        with self._lock:
            only_here = src in self._new_dirs
        try:
            self._move(src, dst)
        except NotFound:
            if not only_here:
                raise
        finally:
            self._forget(src)
            self._forget(dst)
        with self._lock:
            for d in [d for d in self._new_dirs if is_under(d, src)]:
                self._new_dirs.discard(d)
                self._new_dirs.add(dst + d[len(src):])
            for h in self._handles.values():
                if isinstance(h, WriteHandle) and is_under(h.path, src):
                    h.path = dst + h.path[len(src):]
        return 0

    def _move(self, src: str, dst: str) -> None:
        """rename(2): replaces an existing file, or an empty directory with a directory."""
        try:
            self.client.mv(src, dst)
            return
        except AlreadyExists:
            source, target = self.client.stat(src), self.client.stat(dst)
            if target.is_dir and not source.is_dir:
                raise FuseError(errno.EISDIR) from None
            if source.is_dir and not target.is_dir:
                raise FuseError(errno.ENOTDIR) from None
            if target.is_dir and self.client.ls(dst):
                raise FuseError(errno.ENOTEMPTY) from None
        self.client.rm(dst)
        self.client.mv(src, dst)
