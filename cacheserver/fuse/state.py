"""What the operations of a FUSE mount share: the open file handles, the metadata cache, the
versions last opened (for the kernel's page cache), the folders made here, and the helpers
every kind of call uses.

File handles are numbered from the time the process started, with the lowest bit set for
files open for writing: a successor process (see mountkeeper.py) tells the handles of its
predecessor from its own, and reads from writes."""

from __future__ import annotations

import errno
import itertools
import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from strata.contract.errors import NotFound, StrataError
from strata.contract.proto import strata_pb2 as pb
from ..client.fs import StrataFileSystem
from ..common.paths import is_under, join, parent
from .attrcache import REMEMBERED, AttrCache, inode_of
from .dirlistings import KernelListings
from .handles import ReadHandle, ReadRecords, WriteHandle
from .interface import MAX_IO, FuseError
from .openreads import OpenReads
from .localcopies import LocalCopies
from .prefetch import FolderPrefetch
from .settings import FuseSettings

log = logging.getLogger("strata.fuse")

# Bytes read at a time into a local copy's gaps (localcopies.py).
COPY_PIECE = 8 * 1024 * 1024


class OperationsState:
    """Paths are below the mount point ("/" is the mount's root); times are in nanoseconds."""

    def __init__(self, fs: StrataFileSystem, settings: FuseSettings) -> None:
        self.fs = fs
        self.client = fs.client
        self.settings = settings
        self.root = settings.root
        self._attrs = AttrCache(settings.attr_timeout, settings.max_nodes)
        self._listings = KernelListings()
        # Local copies of files the kernel reads itself (passthrough), if the mount makes them.
        self._copies = LocalCopies(settings.passthrough_dir if settings.read_only else None,
                                   settings.passthrough_room, self._ranges_of, self._held_here,
                                   lambda ns: self._page_cached(ns) is not None)
        # A read-only mount that reuses metadata has the kernel open its files without asking
        # (session.py) unless it passes files through: a listed entry is used from the
        # attribute cache alone, and the client keeps no second copy of it. Elsewhere opens go
        # by the client's held answers.
        self._hold_listed = not (settings.read_only and settings.attr_timeout > 0) or self._copies.wanted
        self._prefetch = FolderPrefetch(self.client.ls_pages, enabled=settings.attr_timeout > 0,
                                        wait=self.client.settings.master_timeout, hold_reusable=self._hold_listed)
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

    def _ranges_of(self, info: pb.FileInfo, ranges: list[tuple[int, int]]) -> Iterator[tuple[int, bytes]]:
        """The bytes of ranges (offset, length) of version `info` in pieces, each checked on its
        way from the worker."""
        with self.fs.open(info.path, "rb", file_info=info) as file:
            for offset, length in ranges:
                for start in range(offset, offset + length, COPY_PIECE):
                    yield start, file.pread(min(COPY_PIECE, offset + length - start), start)

    def _held_here(self, info: pb.FileInfo) -> bool:
        """Whether the worker on this host holds every block of version `info` (the master's word)."""
        located = self.client.block_locations(info.path)
        return (located.file.version == info.version and len(located.blocks) > 0
                and all(self.client.host in block.hosts for block in located.blocks))

    def drop_copies(self) -> None:
        """Remove the local copies (the mount ended)."""
        self._copies.close()

    def passes_through(self) -> bool:
        return self._copies.wanted

    def pass_through(self, register: Callable[[int], int], unregister: Callable[[int], None],
                     drop_pages: Callable[[str], None], *, resumed: bool) -> None:
        self._copies.attach(register, unregister, lambda ns: drop_pages(self._below_mount(ns)), resumed=resumed)

    def _ns(self, path: str) -> str:
        """The namespace path of a path below the mount point."""
        return join(self.root, path.lstrip("/")) if path != "/" else self.root

    def _below_mount(self, ns: str) -> str:
        """The path below the mount point of namespace path `ns` (one below the root)."""
        return "/" + ns[len(self.root):].lstrip("/")

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

    def _page_cached(self, ns: str) -> pb.FileInfo | None:
        with self._lock:
            return self._open_reads.cached(ns)

    def _forget(self, ns: str) -> None:
        self._attrs.drop(ns)
        self._prefetch.clear()
        self._listings.clear()
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
