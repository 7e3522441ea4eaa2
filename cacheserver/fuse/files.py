"""The calls on open files of a FUSE mount: open, create, read, write, truncate, flush, fsync
and release.

- Reads: one client file object per open file. The kernel's page cache of a file is kept
  across opens while the file's version (its content identity) stays the one seen at the
  previous open; a changed file starts cold. While a file is open at another version (opened
  before it changed), a new open reads around the page cache (direct I/O): that cache is one
  per file, and the other handle's reads fill it with its version's pages.
- Writes: buffered in a local spool file and written as a whole through a worker, with the
  mount's write type (or the one given), on flush/fsync/close (see handles.py). Opening an
  existing file for writing without O_TRUNC first copies it into the spool.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from collections.abc import Iterator
from typing import Any

from strata.contract.errors import ResourceExhausted, StrataError
from .errnos import as_errno, errno_of
from .handles import ReadHandle, WriteHandle
from .interface import MAX_IO, FuseError
from .localcopies import LocalCopies, copy_name
from .openreads import Opened
from .reads import Reads

log = logging.getLogger("strata.fuse")


class Files(Reads):
    @as_errno
    def open(self, path: str, fi: Any) -> int:
        ns = self._ns(path)
        if fi.flags & os.O_ACCMODE == os.O_RDONLY:
            file = self.fs.open(ns, "rb")
            reader = ReadHandle(file)
            self._attrs.put(reader.info)
            copy = self._copies.usable(reader.info)
            try:
                with self._lock:  # decided and added at once: a handle of another version opened meanwhile counts
                    passing = self._copies.passing(ns)
                    if passing is not None and (copy is None or passing != copy_name(copy.info)):
                        raise LocalCopies.conflict(ns)
                    if copy is not None and (passing is not None or not self._open_reads.versions(ns)):
                        # The kernel reads the copy: this handle is never read, nor the page cache.
                        self._versions.pop(ns, None)
                        reader.direct = True
                        fi.backing_id = copy.backing_id
                    else:
                        keep, direct = self._page_cache_locked(ns, reader.info.version)
                        fi.keep_cache, fi.direct_io = int(keep), int(direct)
                        reader.direct = direct
                    fi.fh = self._add_locked(reader)
                    opened = Opened(ns, bool(fi.keep_cache), reader.direct, self._open_reads.changes(ns))
                    if copy is not None and fi.backing_id:
                        self._copies.opened(fi.fh, copy)
            except BaseException:
                if copy is not None:
                    self._copies.unused(copy)
                file.close()
                raise
            if copy is not None and not fi.backing_id:
                self._copies.unused(copy)
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

    @as_errno
    def create(self, path: str, mode: int, fi: Any) -> int:
        ns = self._ns(path)
        self._check_writable(ns)
        fi.fh = self._add(WriteHandle(ns, self.settings.spool_dir, dirty=True))
        self._forget(ns)
        return 0

    @as_errno
    def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
        handle = self._handle(fi)
        if self._copies.read_ahead(fi.fh, offset, size):
            # Not fetched: the kernel would fill pages no read uses, and drop them at the next
            # open (a readahead hint's error is seen by no one).
            raise FuseError(errno.EIO)
        data = handle.read(size, offset)
        if isinstance(handle, ReadHandle) and not handle.direct:  # the kernel's pages of this version
            self._copies.fill(handle.info, offset, data)
        return data

    @as_errno
    def write(self, path: str, data: bytes | memoryview, offset: int, fi: Any) -> int:
        return self._writer(fi).write(data, offset)

    @as_errno
    def append(self, path: str, data: bytes | memoryview, fi: Any) -> int:
        """write() at the end of the open file (one opened with O_APPEND)."""
        return self._writer(fi).append(data)

    def _writer(self, fi: Any) -> WriteHandle:
        handle = self._handle(fi)
        if not isinstance(handle, WriteHandle):
            raise FuseError(errno.EBADF)
        return handle

    @as_errno
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

    @as_errno
    def flush(self, path: str, fi: Any) -> int:
        return self._commit(fi)

    @as_errno
    def fsync(self, path: str, datasync: int, fi: Any) -> int:
        return self._commit(fi)

    @as_errno
    def release(self, path: str, fi: Any) -> int:
        with self._lock:
            handle = self._handles.pop(fi.fh, None)
            if handle is not None:
                self._open_reads.change(handle, -1)
        if not self.is_write_handle(fi.fh):
            self._records.remove(fi.fh)  # a predecessor's handle this process never read included
            self._copies.released(fi.fh)
        if handle is None:
            return 0
        if isinstance(handle, ReadHandle) and not handle.direct:
            self._copies.read_done(handle.info)
        try:
            if isinstance(handle, WriteHandle):
                handle.commit(self._upload)  # normally done by flush already
        finally:
            handle.close()
        return 0
