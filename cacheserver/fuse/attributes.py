"""The metadata calls of a FUSE mount: getattr, status, statfs, and the changes of attributes.

The kernel keeps attributes and directory entries for `attr_timeout` seconds (see
attrcache.attr_timeout_for) and this process keeps what a listing returned for as long. The
kernel also holds one size per file and cuts reads through the page cache there: while
handles read a file so, whoever asks about it is told their version's size and time. utimens
sets a file's modification time in Strata's namespace (kept while the file's content stays
the same), so rsync -a finds unchanged files unchanged. chmod and chown are accepted and
change nothing: modes and owners come from the store."""

from __future__ import annotations

import logging
import time
from typing import Any

from strata.contract.errors import NotFound, StrataError
from strata.contract.proto import strata_pb2 as pb
from .errnos import as_errno
from .handles import ReadHandle, WriteHandle
from .interface import UTIME_NOW, UTIME_OMIT
from .state import OperationsState

log = logging.getLogger("strata.fuse")

# Capacity and use shown by statfs (df) are refreshed at most this often.
STATFS_TTL = 5.0
STATFS_BLOCK = 4096


class Attributes(OperationsState):
    @as_errno
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

    @as_errno
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

    @as_errno
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

    def chmod(self, path: str, mode: int) -> int:
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        return 0

    @as_errno
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
