"""Reads of a FUSE mount that did not come through an open of this process: handles a
predecessor process opened (each read at the version it opened), and reads the kernel makes
of files it opened without asking (a read-only mount, see session.py); and whether a handle
whose first read was refused because the file changed may go on as the new version.

An open answered from a status the client held (see client/core.py) whose first read is
refused because the file changed in the store goes on as the new version only where the page
cache cannot mix the two: the handle reads directly, or it is the only handle of the file
since its open dropped the cached pages and the length is the kernel's; else the read fails
with EIO as it would have (the next open asks the master)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from strata.contract.errors import FailedPrecondition, StrataError
from strata.contract.proto import strata_pb2 as pb
from .errnos import as_errno
from .handles import ReadHandle
from .openreads import Opened
from .state import OperationsState

log = logging.getLogger("strata.fuse")


class Reads(OperationsState):
    @as_errno
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

    @as_errno
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
