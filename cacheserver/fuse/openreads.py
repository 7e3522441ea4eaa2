"""What the read handles open of each file read, for the choice of each open between the
kernel's page cache and direct I/O (see StrataOperations._page_cache_locked): the versions
open per path, and the status the handles reading through the page cache read (the size the
kernel must hold of the file while they are open).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass

from strata.contract.proto import strata_pb2 as pb
from .handles import ReadHandle, WriteHandle


class OpenReads:
    """The versions that the open read handles of each path read, with how many handles read
    each: an open asks which versions of its path are open without going through every
    handle (thousands of open files would slow every open). Kept in step with the handles
    (added at open and at a successor's reopen, dropped at release) under the operations'
    lock. The same of the handles that read through the page cache (not directly), with
    their status: the size the kernel must hold of the file while they are open."""

    def __init__(self) -> None:
        self._by_path: dict[str, Counter[str]] = {}
        # How many times the handles of each path open changed (opens, releases, reopens).
        self._changes: dict[str, int] = {}
        self._cached: dict[str, dict[str, tuple[pb.FileInfo, int]]] = {}

    def change(self, handle: ReadHandle | WriteHandle, count: int) -> None:
        """A read handle opened (`count` 1) or released (-1); write handles do not count."""
        if isinstance(handle, ReadHandle):
            self._count(handle.info.path, handle.info.version, count)
            if not handle.direct:
                self._count_cached(handle.info, count)

    def move(self, path: str, old: pb.FileInfo, new: pb.FileInfo, *, direct: bool) -> None:
        """A read handle of `path` goes on as version `new` instead of `old`."""
        self._count(path, old.version, -1)
        self._count(path, new.version, 1)
        if not direct:
            self._count_cached(old, -1)
            self._count_cached(new, 1)

    def _count_cached(self, info: pb.FileInfo, count: int) -> None:
        versions = self._cached.setdefault(info.path, {})
        first, handles = versions.get(info.version, (info, 0))
        if handles + count > 0:
            versions[info.version] = (first, handles + count)
        else:
            versions.pop(info.version, None)
            if not versions:
                del self._cached[info.path]

    def cached(self, path: str) -> pb.FileInfo | None:
        """The status of `path` that handles open now read through the page cache (None: no
        such handle). They read one version (an open of another reads directly); should
        a successor's handles, whose way of reading is not known, read several, the longest:
        no read through the page cache is cut short."""
        versions = self._cached.get(path)
        return max((info for info, _ in versions.values()), key=lambda i: i.length) if versions else None

    def _count(self, path: str, version: str, count: int) -> None:
        versions = self._by_path.setdefault(path, Counter())
        versions[version] += count
        if versions[version] <= 0:
            del versions[version]
        self._changes[path] = self._changes.get(path, 0) + 1
        if not versions:
            del self._by_path[path]
            del self._changes[path]

    def versions(self, path: str) -> Collection[str]:
        """The versions of `path` open for reading."""
        return self._by_path.get(path, {}).keys()

    def alone(self, path: str, version: str, changes: int) -> bool:
        """Is one handle of `version` all that is open of `path`, with no handle of it opened
        or released since the count of changes was `changes`?"""
        return self._by_path.get(path) == Counter({version: 1}) and self._changes.get(path) == changes

    def changes(self, path: str) -> int:
        return self._changes.get(path, 0)


@dataclass(frozen=True)
class Opened:
    """How a read handle was opened: what the kernel was told and when (see OpenReads.alone)."""

    ns: str
    keep_cache: bool
    direct_io: bool
    changes: int
