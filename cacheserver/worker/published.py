"""The statuses a worker publishes to the processes of its node, in shared memory.

Every reusable status the worker keeps for its node's readers (worker/kept.py: read-only
mounts' files, until the master's validity ends) and answers one of them with is written to
a table (common/statustable.py) in an anonymous memory file (memfd): no path leads to it,
only a descriptor the worker hands over its short-circuit socket to a reader that presents a
data token. The file is sealed against writes by anyone but the worker's own mapping
(F_SEAL_FUTURE_WRITE): a reader can map it read-only and nothing else, so no process of the
node can change what the others read. Writable mounts' statuses are never reusable, so never
published: they stay close-to-open.

The table holds STRATA_WORKER_STATUS_TABLE_BYTES (statusTable.bytes); when it is full (or
half its slots are used) the worker starts a new, empty one and marks the old one retired:
readers then ask for the new descriptor, and the statuses asked for again are published in
it. The old one's memory goes once the last reader unmaps it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import threading

from strata.contract.proto import strata_pb2 as pb
from ..common.statustable import MIN_TABLE_BYTES, TableWriter
from .settings import STATUS_TABLE_BYTES_SETTING, StatusTableSettings

log = logging.getLogger(__name__)

# Seals of the table's file: its size is fixed, and no new writable mapping or write(2) can
# be made (the worker's mapping, made before, stays writable). Linux 5.1 and later.
_F_SEAL_FUTURE_WRITE = 0x0010
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | _F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL


class PublishedStatuses:
    """The node's status table: published to by the worker, read by its node's processes."""

    def __init__(self, settings: StatusTableSettings | None = None) -> None:
        self.size = (settings or StatusTableSettings()).bytes
        self._lock = threading.Lock()
        self._fd = -1
        self._table: TableWriter | None = None
        self.generation = 0
        if self.size and self.size < MIN_TABLE_BYTES:
            raise ValueError(f"{STATUS_TABLE_BYTES_SETTING}={self.size}: a status table needs at least "
                             f"{MIN_TABLE_BYTES} bytes (0 turns it off)")

    def publish(self, info: pb.FileInfo, until: float) -> None:
        """`info` is valid until `until` (time.monotonic()): readers of the node may answer
        with it until then."""
        if not self.size or not info.valid_for_ms or info.is_dir:
            return
        path, data = info.path.encode(), info.SerializeToString()
        with self._lock:
            table = self._current()
            if table is not None and not table.put(path, until, data):
                table = self._renew()
                if table is not None:
                    table.put(path, until, data)

    def drop(self, path: str) -> None:
        """The status of `path` no longer holds (the store has another version, or the master
        answered without reuse): readers do not answer with it any more."""
        with self._lock:
            if self._table is not None and not self._table.drop(path.encode()):
                self._renew()

    def descriptor(self) -> int | None:
        """A new read-only descriptor of the current table for a reader (the caller closes
        it); None when the table is off or cannot be made."""
        with self._lock:
            if self._current() is None:
                return None
            return os.open(f"/proc/self/fd/{self._fd}", os.O_RDONLY | os.O_CLOEXEC)

    def close(self) -> None:
        with self._lock:
            if self._table is not None:
                self._table.retire()
                self._table.table.close()
                self._table = None
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def _current(self) -> TableWriter | None:
        if self._table is None and self.size:
            return self._renew()
        return self._table

    def _renew(self) -> TableWriter | None:
        """Retire the table and start an empty one (None if the system refuses one: then
        nothing is published and readers ask as before)."""
        old, old_fd = self._table, self._fd
        self._table, self._fd = None, -1
        try:
            fd = os.memfd_create("strata-statuses", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.ftruncate(fd, self.size)
                table = mmap.mmap(fd, self.size)
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            except BaseException:
                os.close(fd)
                raise
        except OSError as exc:
            log.warning("no status table for the node's readers (%s): they ask for each status", exc)
            table, self.size = None, 0
        if old is not None:
            old.retire()
            old.table.close()
            os.close(old_fd)
        if table is None:
            return None
        self.generation += 1
        self._table, self._fd = TableWriter.create(table, self.generation), fd
        if old is not None:
            log.info("status table %d full: the node's readers move to table %d", self.generation - 1,
                     self.generation)
        return self._table
