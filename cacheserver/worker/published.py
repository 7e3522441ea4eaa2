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

With STRATA_WORKER_DATA_TABLE_BYTES set, a second table of the same kind holds the bytes of
small files (common/datatable.py): each reusable file whose only block the worker hands to a
reader on its node is published there too, after its bytes are checked against the block's
checksums, and handed over with the status table. A new process then opens such a file with
no request. Renewed when full as the status table is; a status dropped drops the file's
bytes too (a reader matches bytes to a valid status's version in any case).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import mmap
import os
import threading
from collections.abc import Callable, Sequence

from strata.contract.proto import strata_pb2 as pb
from ..common import datatable, statustable
from ..common.checksums import first_bad_chunk
from ..common.statustable import MIN_TABLE_BYTES, TableWriter
from .settings import DATA_TABLE_BYTES_SETTING, STATUS_TABLE_BYTES_SETTING, DataTableSettings, StatusTableSettings

log = logging.getLogger(__name__)

# Seals of the table's file: its size is fixed, and no new writable mapping or write(2) can
# be made (the worker's mapping, made before, stays writable). Linux 5.1 and later.
_F_SEAL_FUTURE_WRITE = 0x0010
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | _F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL


# A file is published at most this large, and at most this share of the data table (more
# would retire the table every few files).
MAX_PUBLISHED_FILE = 1 << 20
TABLE_SHARE_OF_A_FILE = 16


class SharedTable:
    """One table in a sealed memory file, renewed when full (thread-safe)."""

    def __init__(self, size: int, setting: str, what: str, magic: bytes, bytes_per_slot: int) -> None:
        if size and size < MIN_TABLE_BYTES:
            raise ValueError(f"{setting}={size}: a {what} table needs at least {MIN_TABLE_BYTES} bytes (0 turns it off)")
        self.size = size
        self.lock = threading.Lock()
        self.generation = 0
        self._what = what
        self._magic = magic
        self._bytes_per_slot = bytes_per_slot
        self._fd = -1
        self._table: TableWriter | None = None

    def put(self, path: bytes, until: float, info: bytes, payload: bytes = b"") -> None:
        """Publish (see TableWriter.put); into a new table when this one is full. Called
        with `lock` held."""
        table = self.current()
        if table is not None and not table.put(path, until, info, payload):
            table = self._renew()
            if table is not None:
                table.put(path, until, info, payload)

    def drop(self, path: bytes) -> None:
        with self.lock:
            if self._table is not None and not self._table.drop(path):
                self._renew()

    def descriptor(self) -> int | None:
        """A new read-only descriptor of the current table for a reader (the caller closes
        it); None when the table is off or cannot be made."""
        with self.lock:
            if self.current() is None:
                return None
            return os.open(f"/proc/self/fd/{self._fd}", os.O_RDONLY | os.O_CLOEXEC)

    def close(self) -> None:
        """Retire the table (readers move to a new one, made when next used) and let go of it."""
        with self.lock:
            if self._table is not None:
                self._table.retire()
                self._table.table.close()
                self._table = None
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def current(self) -> TableWriter | None:
        """The table written to (made on first use); None when off. Called with `lock` held."""
        if self._table is None and self.size:
            return self._renew()
        return self._table

    def _renew(self) -> TableWriter | None:
        """Retire the table and start an empty one (None if the system refuses one: then
        nothing is published and readers ask as before)."""
        old, old_fd = self._table, self._fd
        self._table, self._fd = None, -1
        try:
            fd = os.memfd_create(f"strata-{self._what}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.ftruncate(fd, self.size)
                table = mmap.mmap(fd, self.size)
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            except BaseException:
                os.close(fd)
                raise
        except OSError as exc:
            log.warning("no %s table for the node's readers (%s): they ask the worker", self._what, exc)
            table, self.size = None, 0
        if old is not None:
            old.retire()
            old.table.close()
            os.close(old_fd)
        if table is None:
            return None
        self.generation += 1
        self._table = TableWriter.create(table, self.generation, self._magic, self._bytes_per_slot)
        self._fd = fd
        if old is not None:
            log.info("%s table %d full: the node's readers move to table %d", self._what, self.generation - 1,
                     self.generation)
        return self._table


class PublishedStatuses:
    """The node's status table and data table: published to by the worker, read by its
    node's processes."""

    def __init__(self, settings: StatusTableSettings | None = None, data: DataTableSettings | None = None) -> None:
        self.statuses = SharedTable((settings or StatusTableSettings()).bytes, STATUS_TABLE_BYTES_SETTING,
                                    "statuses", statustable.MAGIC, statustable.BYTES_PER_SLOT)
        self.files = SharedTable((data or DataTableSettings()).bytes, DATA_TABLE_BYTES_SETTING, "files",
                                 datatable.MAGIC, datatable.BYTES_PER_SLOT)

    @property
    def generation(self) -> int:
        return self.statuses.generation

    def publish(self, info: pb.FileInfo, until: float) -> None:
        """`info` is valid until `until` (time.monotonic()): readers of the node may answer
        with it until then."""
        if not self.statuses.size or not info.valid_for_ms or info.is_dir:
            return
        path, data = info.path.encode(), info.SerializeToString()
        with self.statuses.lock:
            self.statuses.put(path, until, data)

    def publish_file(self, info: pb.FileInfo, read: Callable[[], bytes | None], checksums: Sequence[int],
                     chunk_size: int) -> None:
        """The file `info` describes is small and its only block's bytes are `read()` (None:
        they could not be read), with these checksums: publish them for the node's readers
        when the status is reusable (never a writable mount's), the file fits, and they are
        not published already. Bytes that fail their checksums are not published."""
        files = self.files
        limit = min(MAX_PUBLISHED_FILE, files.size // TABLE_SHARE_OF_A_FILE)
        if (not files.size or not info.valid_for_ms or info.is_dir or not 0 < info.length <= limit
                or chunk_size <= 0 or len(checksums) != -(-info.length // chunk_size)):
            return
        path = info.path.encode()
        record = datatable.record_of(info.mount_id, info.version, chunk_size, checksums, info.length)
        with files.lock:
            table = files.current()
            known = table.find(path) if table is not None else None
            if table is None or (known is not None and known[2] == record):
                return
        data = read()
        if data is None or len(data) != info.length or first_bad_chunk(data, 0, checksums, chunk_size) is not None:
            return
        with files.lock:
            files.put(path, math.inf, record, data)

    def drop(self, path: str) -> None:
        """The status of `path` no longer holds (the store has another version, or the master
        answered without reuse): readers do not answer with it any more."""
        self.statuses.drop(path.encode())
        self.files.drop(path.encode())

    def drop_files(self) -> None:
        """Blocks were freed: the published files go with them (readers move to an empty
        data table, filled again as files are opened)."""
        self.files.close()

    def descriptor(self) -> int | None:
        """A new read-only descriptor of the current status table for a reader (the caller
        closes it); None when the table is off or cannot be made."""
        return self.statuses.descriptor()

    def close(self) -> None:
        self.statuses.close()
        self.files.close()
