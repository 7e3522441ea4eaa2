"""Folder listings fetched ahead of the reader that walks a tree (find, os.walk, du, a data
loader indexing its dataset): while the kernel and the walker go through one folder, the
next folders it will read (the first subfolders of a folder just listed, the siblings after
a subfolder just listed, in the order readdir gives them) are listed from the master in a
thread of their own, so the master's work on the next folder overlaps this process's work
on this one instead of following it.

A listing fetched ahead is used only while the master would still give it: every entry in
it reusable (FileInfo.valid_for_ms > 0: read-only mounts synced every N s, as a held stat is)
and the request's send time plus the shortest of them not passed; every one is forgotten when
this mount changes anything. At most AHEAD listings are held, each of at most MAX_ENTRIES
entries (a larger folder is listed when it is read, page by page); none while the mount
reuses no metadata (attribute timeout 0)."""

from __future__ import annotations

import bisect
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from strata.contract.errors import StrataError
from strata.contract.proto import strata_pb2 as pb
from ..common.paths import parent

log = logging.getLogger(__name__)

# Folders listed ahead of the reader at most (held or being fetched).
AHEAD = 2
# Entries a listing fetched ahead holds at most: a larger folder is listed when read.
MAX_ENTRIES = 10_000
# Folders whose subfolders are remembered (to know which sibling comes next), at most.
PARENTS = 64


class ListPages(Protocol):
    """StrataClient.ls_pages: a folder's listing page by page, its reusable entries held by
    the client or not (`hold_reusable`: the caller keeps them, in the mount's attribute
    cache, when a listing fetched ahead is read)."""

    def __call__(self, path: str, *, hold_reusable: bool) -> Iterator[list[pb.FileInfo]]: ...


@dataclass
class _Ahead:
    asked: float  # time.monotonic() when the listing was asked for
    done: threading.Event = field(default_factory=threading.Event)
    entries: list[pb.FileInfo] | None = None  # None: failed, too large, or not there yet
    wanted: bool = True  # False once forgotten (a change, or more asked for after it) before it was fetched


class FolderPrefetch:
    """Listings of the folders a walk reads next, fetched by one thread (started at the
    first); none when `enabled` is false."""

    def __init__(self, list_pages: ListPages, *, enabled: bool, wait: float, hold_reusable: bool = True,
                 ahead: int = AHEAD, max_entries: int = MAX_ENTRIES) -> None:
        self._list_pages = list_pages
        self._hold_reusable = hold_reusable
        self.enabled = enabled
        self._wait = wait
        self._ahead_count = ahead
        self._max_entries = max_entries
        self._lock = threading.Lock()
        self._ahead: OrderedDict[str, _Ahead] = OrderedDict()
        self._subfolders: OrderedDict[str, list[str]] = OrderedDict()  # folder -> its subfolders, in readdir's order
        self._asked: queue.SimpleQueue[tuple[str, _Ahead]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def take(self, ns: str) -> tuple[list[pb.FileInfo], float] | None:
        """The listing of `ns` fetched ahead and when it was asked for (time.monotonic()), if
        it came whole (waiting for it at most `wait` seconds) and the master would still give
        it; None: list it now."""
        with self._lock:
            ahead = self._ahead.pop(ns, None)
        if ahead is None or not ahead.done.wait(self._wait) or not ahead.entries:
            return None
        shortest = min(e.valid_for_ms for e in ahead.entries)
        if not shortest or ahead.asked + shortest / 1000 <= time.monotonic():
            return None
        return ahead.entries, ahead.asked

    def listed(self, ns: str, entries: list[pb.FileInfo]) -> None:
        """`ns` was just read with these `entries`: fetch what a walk reads after it."""
        if not self.enabled:
            return
        subfolders = sorted(e.path for e in entries if e.is_dir and e.path != ns)
        with self._lock:
            if subfolders:
                self._subfolders[ns] = subfolders
                self._subfolders.move_to_end(ns)
                while len(self._subfolders) > PARENTS:
                    self._subfolders.popitem(last=False)
            siblings = self._subfolders.get(parent(ns), [])
            at = bisect.bisect_left(siblings, ns)
            following = siblings[at + 1:at + 1 + self._ahead_count] if at < len(siblings) and siblings[at] == ns else []
            for folder in (subfolders + following)[:self._ahead_count]:
                self._ask_locked(folder)

    def clear(self) -> None:
        """Forget every listing fetched ahead (this mount changed something)."""
        with self._lock:
            for ahead in self._ahead.values():
                ahead.wanted = False
            self._ahead.clear()

    def _ask_locked(self, folder: str) -> None:
        if folder in self._ahead:
            return
        ahead = self._ahead[folder] = _Ahead(time.monotonic())
        while len(self._ahead) > self._ahead_count:
            self._ahead.popitem(last=False)[1].wanted = False
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="strata-fuse-prefetch", daemon=True)
            self._thread.start()
        self._asked.put((folder, ahead))

    def _run(self) -> None:
        while True:
            folder, ahead = self._asked.get()
            try:
                if ahead.wanted:
                    ahead.entries = self._fetch(folder)
            except StrataError as exc:
                log.debug("strata fuse: listing %s ahead: %s", folder, exc)
            except Exception:  # noqa: BLE001 - the reader lists the folder itself
                log.exception("strata fuse: listing %s ahead failed", folder)
            finally:
                ahead.done.set()

    def _fetch(self, folder: str) -> list[pb.FileInfo] | None:
        entries: list[pb.FileInfo] = []
        for page in self._list_pages(folder, hold_reusable=self._hold_reusable):
            entries += page
            if len(entries) > self._max_entries:
                return None
        return entries

