"""What this process knows of file metadata between calls to the master: FileInfo by path
for as long as the kernel may reuse it (`attr_timeout_for`), so `ls -l` costs one listing,
not one call per file; and inode numbers derived from the namespace path, so the same file
has the same number on every mount (tools that key on st_ino, such as find and tar, see one
file across remounts)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable

from strata.contract.proto import strata_pb2 as pb
from ..common.pathmap import PathMap
from ..common.paths import is_under
from .settings import DEFAULT_ATTR_TIMEOUT

# Metadata is reused at most this long, whatever the mounts' sync intervals say: changes made
# through other Strata clients show up in the master at once, but not in this kernel's cache.
MAX_ATTR_TIMEOUT = 60.0
# The same for read-only Strata mounts: no Strata client changes them, and the master itself
# sees a change in the store only at its next metadata sync (the mount's interval).
MAX_READ_ONLY_ATTR_TIMEOUT = 3600.0
# Paths whose attributes or last-open version are remembered, at most.
REMEMBERED = 100_000


_blake2b = hashlib.blake2b
_from_bytes = int.from_bytes


def inode_of(ns: str) -> int:
    """The inode number of a namespace path: the same on every mount, never 0 or 1 (the
    kernel's own root number), 63 bits so that signed readers see it positive. (Made for
    each entry of every listing: written for speed.)"""
    number = _from_bytes(_blake2b(ns.encode(), digest_size=8).digest(), "big") >> 1
    return number if number > 1 else 2



def inodes_in(folder: str, names: Iterable[str]) -> list[int]:
    """inode_of of each of `names` in `folder`, the folder's part of the hash taken once (made
    for every entry of a listing: about a third cheaper than inode_of of each path)."""
    folder_part = _blake2b((folder.rstrip("/") + "/").encode(), digest_size=8)
    numbers = []
    for name in names:
        digest = folder_part.copy()
        digest.update(name.encode())
        number = _from_bytes(digest.digest(), "big") >> 1
        numbers.append(number if number > 1 else 2)
    return numbers


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


class AttrCache:
    """FileInfo by namespace path for `ttl` seconds (at most `limit` paths, the least recently
    used go first), dropped with the tree below it when this mount changes the path
    (a PathMap, shared by the mount's threads under this cache's lock)."""

    def __init__(self, ttl: float, limit: int = REMEMBERED) -> None:
        self.ttl = ttl
        self._entries: PathMap[pb.FileInfo] | None = PathMap(limit=limit, ttl=ttl) if ttl > 0 else None
        self._lock = threading.Lock()

    def get(self, path: str) -> pb.FileInfo | None:
        if self._entries is None:
            return None
        with self._lock:
            info = self._entries.get(path)
            self._entries.touch(path)
            return info

    def put(self, info: pb.FileInfo) -> None:
        self.put_many([info])

    def put_many(self, infos: Iterable[pb.FileInfo]) -> None:
        """`put` of each (a page of a listing), under one hold of the lock."""
        if self._entries is None:
            return
        with self._lock:
            self._entries.put_many((info.path, info) for info in infos)

    def drop(self, path: str) -> None:
        """Forget `path` and everything below it."""
        if self._entries is None:
            return
        with self._lock:
            self._entries.drop_tree(path)
