"""What the kernel holds of each node's size and modification time, as far as this process
knows: what its last reply carrying them (LOOKUP, GETATTR, SETATTR, CREATE, MKDIR) said.

The kernel keeps a file's attributes for the mount's metadata timeout (up to a minute) and
acts on the size it holds: reads through its page cache end there (a longer version is cut,
a shorter one is read on with zeros), a mapping faults past it, and a write of a file opened
with O_APPEND lands there. A file can change in the store meanwhile, and an open asks the
client, whose answer may be fresher than the kernel's: an open that finds the file at a size
or time other than the one the kernel was last told has the kernel forget what it holds
(FUSE_NOTIFY_INVAL_INODE, attributes only) before the open is answered, so the program's
first fstat or read asks again, with its file handle, and gets the version it opened.

Replies and notifications are written under one lock, so what is remembered is what the
kernel took last: it applies each in the order written, and drops an answer to a request it
sent before an invalidation (its attribute version), holding nothing then until it asks
again. The kernel also changes the size itself (a write; a read that ends short of the size,
which it takes as the new end): then nothing is remembered of that node, and its next open
invalidates. A successor process (mountkeeper.py) starts knowing nothing, so the first open of each
node invalidates.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .wire import Attr


class KernelAttrs:
    def __init__(self) -> None:
        self._shown: dict[int, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def reply(self, nodeid: int, attr: Attr, send: Callable[[], bool]) -> None:
        """Send a reply that gives the kernel `attr` of `nodeid` (`send` is False when the
        kernel did not take it) and remember what it holds."""
        with self._lock:
            if send():
                self._shown[nodeid] = (attr.size, attr.mtime_ns)
            else:
                self._shown.pop(nodeid, None)

    def ensure(self, nodeid: int, attr: Attr, invalidate: Callable[[], None]) -> None:
        """Before an open of `nodeid` is answered: unless the kernel was last told the size and
        time of `attr` (what the open file is), have it forget what it holds (`invalidate`,
        which raises if it could not)."""
        with self._lock:
            if self._shown.get(nodeid) != (attr.size, attr.mtime_ns):
                invalidate()
                self._shown.pop(nodeid, None)

    def read_short(self, nodeid: int, end: int) -> None:
        """A read of `nodeid` returned bytes up to `end` only: the kernel takes a shorter end
        than the size it holds as the file's size."""
        with self._lock:
            shown = self._shown.get(nodeid)
            if shown is not None and end < shown[0]:
                del self._shown[nodeid]

    def forget(self, nodeid: int) -> None:
        """The kernel may hold another size of `nodeid` (it wrote), or forgot the node."""
        with self._lock:
            self._shown.pop(nodeid, None)
