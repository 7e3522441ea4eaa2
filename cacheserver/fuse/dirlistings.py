"""The folders whose listing the kernel may keep a copy of (FOPEN_CACHE_DIR), and until when
that copy is what readdir would give: the request's send time plus the shortest validity of
its entries (FileInfo.valid_for_ms: files of read-only mounts synced every N s). An opendir
within it lets the kernel answer from its copy (a second walk of a dataset asks nothing);
after it, or for a folder with an entry the master does not mark reusable, the kernel drops
its copy and reads the folder anew."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

# Folders remembered at most (the least recently listed go first: the kernel reads those anew).
REMEMBERED_FOLDERS = 100_000


class KernelListings:
    """Until when each folder's last listing stands (time.monotonic()), for at most `limit`
    folders; shared by the mount's threads."""

    def __init__(self, limit: int = REMEMBERED_FOLDERS) -> None:
        self._limit = limit
        self._until: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def listed(self, folder: str, until: float | None) -> None:
        """`folder` was just listed to the kernel: its listing stands until `until` (None: it
        may change at any time)."""
        with self._lock:
            self._until.pop(folder, None)
            if until is None:
                return
            self._until[folder] = until
            while len(self._until) > self._limit:
                self._until.popitem(last=False)

    def unchanged(self, folder: str) -> bool:
        """True while the last listing of `folder` stands."""
        with self._lock:
            until = self._until.get(folder)
        return until is not None and time.monotonic() < until

    def clear(self) -> None:
        """Forget every listing (this mount changed something)."""
        with self._lock:
            self._until.clear()
