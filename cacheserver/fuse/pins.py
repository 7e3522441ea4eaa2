"""The versions the reads of a FUSE mount read when the kernel opens files without asking.

A read-only mount whose metadata may be reused (a timeout above 0) lets the kernel open and
close its files without asking: the first OPEN and FLUSH are answered ENOSYS, after which
the kernel sends neither (nor RELEASE) and keeps each file's page cache across opens. Its
reads come with no file handle and read the version the kernel was last told of the file
(its pin): each reply that gives the kernel a file's attributes (LOOKUP, GETATTR) first has
it drop the pages it holds of the file when the version differs from the pin's, so the
kernel's timeouts, not opens, decide when a change is seen, as the mount's metadata sync
interval allows. Nothing is held per open file then (see Operations.read_at).
"""

from __future__ import annotations

import errno
import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic

from .interface import FuseError, Operations, S

log = logging.getLogger("strata.fuse")

# Nodes whose reads were refused waiting to be pinned at their new version, at most.
REPINS = 1024


class Pins(Generic[S]):
    """The pin of each node the kernel reads without a file handle, for the operations `ops`;
    `invalidate_data(nodeid, path)` has the kernel drop the pages and attributes it holds of a
    node (raising FuseError if it could not)."""

    def __init__(self, ops: Operations[S], invalidate_data: Callable[[int, str], None]) -> None:
        self.ops = ops
        self._invalidate_data = invalidate_data
        self._pins: dict[int, S] = {}
        # Nodes pinned at a new version the kernel has not been told the attributes of yet
        # (see _repin_changed): their reads fail until a reply tells it (see pin).
        self._untold: set[int] = set()
        self._repins: queue.Queue[tuple[int, S, S]] = queue.Queue(REPINS)
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the thread that pins changed nodes at their new version (see changed)."""
        threading.Thread(target=self._repin_changed, name="strata-fuse-repin", daemon=True).start()

    def pin(self, nodeid: int, path: str) -> None:
        """Before the kernel is told the attributes of `nodeid` (the kernel opens files without
        asking): its reads are of this status's version from now on, and the pages the kernel
        holds of another version are dropped first (a read in flight holds its pages locked:
        they are dropped once it is answered), then the node is pinned at the new one."""
        info = self.ops.status(path)
        if info is None:
            return
        with self._lock:
            old = self._pins.get(nodeid)
            if old is not None and old.version == info.version:
                self._pins[nodeid] = info
                self._untold.discard(nodeid)
                return
        if old is not None:
            self.ops.drop_reader(old)
        self._invalidate_data(nodeid, path)
        with self._lock:
            self._pins[nodeid] = info
            self._untold.discard(nodeid)

    def changed(self, nodeid: int, old: S, new: S) -> None:
        """A read of `nodeid` pinned at `old` was refused: the file is `new` in the store now.
        The kernel's pages of `old` are dropped and the node pinned at `new`, by another thread
        (the refused read holds a page locked until it is answered)."""
        try:
            self._repins.put_nowait((nodeid, old, new))
        except queue.Full:
            log.warning("strata fuse: %s changed; the kernel sees it when its metadata timeout ends", new.path)

    def _repin_changed(self) -> None:
        """Pin each node whose reads were refused (see changed) at its new version: its reader
        and the kernel's pages and attributes of the old one dropped first, so no page of the
        old version is kept once reads of the new one are answered (meanwhile reads of the old
        one fail). Its reads go on failing until the kernel is told the new attributes (the
        next read(2) asks for them, see AUTO_INVAL_DATA): the kernel cuts reads at the size it
        holds and fills a page past a short read with zeros, so the new version read at the
        old version's size would end in zeros (shorter) or be cut (longer)."""
        while True:
            nodeid, old, new = self._repins.get()
            with self._lock:
                if self._pins.get(nodeid) is not old:
                    continue  # forgotten, or pinned again since
            self.ops.drop_reader(old, new)
            try:
                self._invalidate_data(nodeid, new.path)
            except FuseError:
                continue  # logged; the kernel asks again when its timeout ends
            with self._lock:
                if self._pins.get(nodeid) is old:
                    self._pins[nodeid] = new
                    if new is not old:  # not a predecessor's node (see pinned)
                        self._untold.add(nodeid)

    def pinned(self, nodeid: int, path: str) -> S:
        """The status the reads of `nodeid` read: its pin, or (a node the kernel was told of by
        a predecessor process) the file's status now, pinned. The predecessor's version is not
        known: the kernel's pages are dropped once this read is answered (a file changed in
        the store while the mount was taken over may be read mixed until then)."""
        with self._lock:
            info = self._pins.get(nodeid)
            if nodeid in self._untold:
                raise FuseError(errno.EIO)
        if info is None:
            info = self.ops.status(path)
            if info is None:
                raise FuseError(errno.EISDIR)
            with self._lock:
                pinned = self._pins.setdefault(nodeid, info)
            if pinned is info:
                self.changed(nodeid, info, info)
            info = pinned
        return info

    def forget(self, nodeid: int) -> None:
        """The kernel forgot `nodeid`: so does its pin."""
        with self._lock:
            self._pins.pop(nodeid, None)
            self._untold.discard(nodeid)
