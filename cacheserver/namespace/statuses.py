"""A store's listing as the master keeps it: columns of plain values, not an object a file.

The master keeps what a store listed for as long as the mount's metadata sync interval (an
hour, say) and a walk of a tree lists every file in it. As `UfsStatus` objects, a file cost
~320 bytes and one object the garbage collector looks at in each full collection (seconds of
the master's time at a million files). Here a file is its path and version as UTF-8 bytes in
two shared buffers (`Texts`), two 8-byte numbers and a byte, and its position in its folder's
listing (`Folder`): ~80 bytes with the paths a store gives, nothing the collector looks at,
and no small object a file: a walk's short-lived objects, freed, leave the allocator's pages
empty (a string a file kept among them held those pages, so the resident size stayed at
twice what was held). `UfsStatus` objects are made again when an entry is read.
"""

from __future__ import annotations

import bisect
from abc import abstractmethod
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

from ..ufs import UfsStatus


class _Listing(Sequence[UfsStatus]):
    """A listing's entries, made as they are read."""

    __slots__ = ()

    @abstractmethod
    def _entry(self, index: int) -> UfsStatus:
        """The entry at `index` (negative: from the end)."""

    @overload
    def __getitem__(self, index: int) -> UfsStatus: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[UfsStatus]: ...

    def __getitem__(self, index: int | slice) -> UfsStatus | Sequence[UfsStatus]:
        if isinstance(index, slice):
            return [self._entry(i) for i in range(*index.indices(len(self)))]
        return self._entry(index)


class Texts(Sequence[str]):
    """Strings kept as UTF-8 in one buffer with the end of each (8 bytes a string besides
    its bytes, where a `str` object costs ~50), made again when read."""

    __slots__ = ("_bytes", "_ends")

    def __init__(self) -> None:
        self._bytes = bytearray()
        self._ends = array("q")

    def append(self, text: str) -> None:
        self._bytes += text.encode("utf-8", "surrogateescape")
        self._ends.append(len(self._bytes))

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self._ends)
        if not 0 <= index < len(self._ends):
            raise IndexError(f"index {index} of {len(self._ends)} strings")
        return self.text(index)

    def text(self, index: int) -> str:
        """The string at `index`, 0 <= index < len(self) (the listings' fast path)."""
        end = self._ends[index]
        return self._bytes[self._ends[index - 1] if index else 0:end].decode("utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        data, start = self._bytes, 0
        for end in self._ends:
            yield data[start:end].decode("utf-8", "surrogateescape")
            start = end


class Statuses(_Listing):
    """Statuses sorted by path (as stores' listings and walks come), kept as columns."""

    __slots__ = ("_paths", "_versions", "_lengths", "_mtimes", "_dirs")

    def __init__(self, statuses: Iterable[UfsStatus] = ()) -> None:
        self._paths = Texts()
        self._versions = Texts()
        self._lengths = array("q")
        self._mtimes = array("q")
        self._dirs = bytearray()
        for status in statuses:
            self.append(status)

    def append(self, status: UfsStatus) -> None:
        """Add a status after the others (its path sorts after theirs)."""
        self._paths.append(status.path)
        self._versions.append(status.version)
        self._lengths.append(status.length)
        self._mtimes.append(status.mtime_unix_ms)
        self._dirs.append(status.is_dir)

    def __len__(self) -> int:
        return len(self._paths)

    def sorted_by_path(self) -> Statuses:
        """These statuses sorted by path, as new columns: for a walk whose pages came out of
        order (positions and paths are sorted, never a status object a file)."""
        order = sorted(range(len(self._paths)), key=self._paths.text)
        return Statuses(self.at(index) for index in order)

    def _entry(self, index: int) -> UfsStatus:
        if index < 0:
            index += len(self._lengths)
        if not 0 <= index < len(self._lengths):
            raise IndexError(f"index {index} of {len(self._lengths)} statuses")
        return self.at(index)

    def at(self, index: int) -> UfsStatus:
        """The entry at `index`, 0 <= index < len(self) (the listings' fast path)."""
        return UfsStatus(self._paths.text(index), bool(self._dirs[index]), self._lengths[index], self._mtimes[index],
                         self._versions.text(index))

    def __iter__(self) -> Iterator[UfsStatus]:
        for path, is_dir, length, mtime, version in zip(self._paths, self._dirs, self._lengths, self._mtimes,
                                                         self._versions):
            yield UfsStatus(path, bool(is_dir), length, mtime, version)

    @property
    def paths(self) -> Texts:
        return self._paths

    def find(self, rel: str) -> UfsStatus | None:
        """The status of `rel`, by bisection of the paths; None if it is not listed."""
        at = self.position(rel)
        return self[at] if at < len(self._paths) and self._paths[at] == rel else None

    def position(self, rel: str) -> int:
        """Where `rel` is or would be in this listing (by bisection)."""
        return bisect.bisect_left(range(len(self._paths)), rel, key=self._paths.text)

    def path_at(self, index: int) -> str:
        """The path at `index`, 0 <= index < len(self)."""
        return self._paths.text(index)


class Folder(_Listing):
    """One folder's listing out of a walk's statuses: the positions of its entries in the
    walk's columns (8 bytes an entry, where a copy of the columns took ~33)."""

    __slots__ = ("_walk", "_at")

    def __init__(self, walk: Statuses) -> None:
        self._walk = walk
        self._at = array("q")

    def append(self, position: int) -> None:
        """Add the walk's entry at `position` (after the others: the walk is sorted)."""
        self._at.append(position)

    def __len__(self) -> int:
        return len(self._at)

    def _entry(self, index: int) -> UfsStatus:
        return self._walk[self._at[index]]

    def at(self, index: int) -> UfsStatus:
        """The entry at `index`, 0 <= index < len(self) (the listings' fast path)."""
        return self._walk.at(self._at[index])

    def __iter__(self) -> Iterator[UfsStatus]:
        at = self._walk.at
        for position in self._at:
            yield at(position)

    def find(self, rel: str) -> UfsStatus | None:
        """The status of `rel`, by bisection; None if it is not in this folder."""
        at = self.position(rel)
        return self[at] if at < len(self._at) and self.path_at(at) == rel else None

    def position(self, rel: str) -> int:
        """Where `rel` is or would be in this folder (by bisection)."""
        paths = self._walk.paths
        return bisect.bisect_left(self._at, rel, key=paths.text)

    def path_at(self, index: int) -> str:
        return self._walk.path_at(self._at[index])


class Prefix(_Listing):
    """The first `end` statuses of a walk's columns: those a walk under way has put in (the
    ones after them may be half written)."""

    __slots__ = ("_walk", "_end")

    def __init__(self, walk: Statuses, end: int) -> None:
        self._walk = walk
        self._end = end

    def __len__(self) -> int:
        return self._end

    def _entry(self, index: int) -> UfsStatus:
        if index < 0:
            index += self._end
        if not 0 <= index < self._end:
            raise IndexError(f"index {index} of {self._end} statuses")
        return self._walk.at(index)

    def at(self, index: int) -> UfsStatus:
        """The entry at `index`, 0 <= index < len(self) (the listings' fast path)."""
        return self._walk.at(index)

    def find(self, rel: str) -> UfsStatus | None:
        """The status of `rel`, by bisection; None if it is not among these."""
        at = self.position(rel)
        return self._walk.at(at) if at < self._end and self._walk.path_at(at) == rel else None

    def position(self, rel: str) -> int:
        """Where `rel` is or would be among these (by bisection)."""
        return bisect.bisect_left(range(self._end), rel, key=self._walk.path_at)


def find_listed(statuses: Sequence[UfsStatus], rel: str) -> UfsStatus | None:
    """The entry for `rel` in a listing sorted by path (as every store answer and cached
    listing is), by bisection: a folder of 100,000 files is neither scanned for each stat
    it answers nor indexed (an index would hold another ~100 bytes a file)."""
    if isinstance(statuses, (Statuses, Folder, Prefix)):
        return statuses.find(rel)
    at = bisect.bisect_left(statuses, rel, key=lambda s: s.path)
    return statuses[at] if at < len(statuses) and statuses[at].path == rel else None


class InOrder:
    """Lookups in a listing sorted by path of paths asked for in that order (the entries of a
    page of a listing): each tries the entry after the one found last before it bisects, so
    a page of a folder costs a step an entry."""

    __slots__ = ("_statuses", "_next")

    def __init__(self, statuses: Sequence[UfsStatus]) -> None:
        self._statuses = statuses
        self._next = 0

    def find(self, rel: str) -> UfsStatus | None:
        """The status of `rel`, None if it is not listed."""
        statuses = self._statuses
        if not isinstance(statuses, (Statuses, Folder, Prefix)):
            return find_listed(statuses, rel)
        at = self._next
        status = statuses.at(at) if at < len(statuses) else None
        if status is None or status.path != rel:
            at = statuses.position(rel)
            status = statuses.at(at) if at < len(statuses) else None
            if status is None or status.path != rel:
                return None
        self._next = at + 1
        return status
