"""The directory calls of a FUSE mount: readdir, mkdir, rmdir, unlink and rename.

mkdir makes a directory that exists in this process until a file is written below it (stores
such as S3 have no empty directories); so does removing the last entry of a folder that
exists in the store only as a key prefix: it stays a folder until rmdir, as on a disk (rm -r,
shutil.rmtree and find -delete work)."""

from __future__ import annotations

import errno
import stat
import time
from collections.abc import Iterable
from typing import Any

from strata.contract.errors import AlreadyExists, FailedPrecondition, NotFound
from strata.contract.proto import strata_pb2 as pb
from ..common.paths import is_under, join, parent
from .attrcache import inode_of, inodes_in
from .errnos import as_errno
from .handles import WriteHandle
from .interface import DirEntry, FuseError
from .state import OperationsState


class Directories(OperationsState):
    @as_errno
    def readdir(self, path: str, fh: Any) -> list[DirEntry]:
        ns = self._ns(path)
        entries: list[DirEntry] = []
        unchanged_until: float | None = None  # while the master gives the same listing (none: it may not)
        try:
            asked = time.monotonic()
            ahead = self._prefetch.take(ns)
            pages: Iterable[list[pb.FileInfo]]
            if ahead is not None:
                pages, asked = [ahead[0]], ahead[1]
            else:  # a folder of any size, a page at a time
                pages = self.client.ls_pages(ns, hold_reusable=self._hold_listed)
            for page, infos in enumerate(pages):
                if len(infos) == 1 and infos[0].path == ns and not infos[0].is_dir:
                    raise FuseError(errno.ENOTDIR)
                self._attrs.put_many(infos)
                shortest = min((info.valid_for_ms for info in infos), default=0)
                until = asked + shortest / 1000 if shortest else 0.0
                unchanged_until = until if page == 0 else min(until, unchanged_until or 0.0)
                names = [info.name for info in infos]
                entries += zip(names, inodes_in(ns, names),
                               [stat.S_IFDIR if info.is_dir else stat.S_IFREG for info in infos])
                if page == 0:  # what a walk reads next is in the first page
                    self._prefetch.listed(ns, infos)
        except NotFound:
            if ns not in self._new_dirs:
                raise
        with self._lock:
            extra = [(d.rsplit("/", 1)[1], stat.S_IFDIR) for d in self._new_dirs if parent(d) == ns] + [
                (h.path.rsplit("/", 1)[1], stat.S_IFREG) for h in self._handles.values()
                if isinstance(h, WriteHandle) and not h.discarded and parent(h.path) == ns]
        if extra:  # folders made and files being written here, not in the master's listing yet
            listed = {name for name, _, _ in entries}
            entries += [(name, inode_of(join(ns, name)), mode) for name, mode in dict(extra).items()
                        if name not in listed]
            unchanged_until = None
        entries.sort()
        self._listings.listed(ns, unchanged_until if self.settings.read_only else None)
        up = parent(ns) if ns != self.root else ns
        return [(".", inode_of(ns), stat.S_IFDIR), ("..", inode_of(up), stat.S_IFDIR), *entries]

    def listing_unchanged(self, path: str) -> bool:
        return self._listings.unchanged(self._ns(path))

    @as_errno
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

    @as_errno
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

    @as_errno
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

    @as_errno
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
