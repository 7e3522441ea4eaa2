"""The node's status table as a client process reads it (see common/statustable.py).

The descriptor comes once from the node's worker over its short-circuit socket; the table is
mapped read-only (the worker sealed it against any other writer) and a stat is a hash lookup
in the mapping: no request. What the mapping says is used only until its validity ends
(CLOCK_MONOTONIC, which the worker's `until` is on too), and only when its record checks;
anything else is a miss, and the client asks as it would without the table.

With it may come the node's data table (common/datatable.py): the bytes of small files, found
for the version a valid status names and checked chunk by chunk before they are returned.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time

from google.protobuf.message import DecodeError

from strata.contract.proto import strata_pb2 as pb
from ..common import datatable
from ..common.statustable import MAGIC, TableError, TableView


def _mapped(fd: int, magic: bytes, what: str) -> TableView:
    """The table `fd` names, mapped read-only (the caller keeps `fd`); TableError if it is none."""
    try:
        table = mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)
    except (OSError, ValueError) as exc:
        raise TableError(f"the node's {what} table cannot be mapped: {exc}") from exc
    try:
        return TableView(table, magic)
    except TableError:
        table.close()
        raise


class NodeTable:
    """One mapping of the node's status table, and of its data table if any (thread-safe:
    it only reads)."""

    def __init__(self, fd: int, data_fd: int | None = None) -> None:
        """Map the tables `fd` and `data_fd` name (the caller keeps them); TableError if `fd`
        names none. A data table that cannot be mapped is left out (opens ask the worker)."""
        self._view = _mapped(fd, MAGIC, "status")
        self.generation = self._view.generation
        self._data: TableView | None = None
        if data_fd is not None:
            with contextlib.suppress(TableError):
                self._data = _mapped(data_fd, datatable.MAGIC, "data")

    @property
    def retired(self) -> bool:
        """Whether the worker moved on from either table (the reader asks for both again)."""
        return self._view.retired or (self._data is not None and self._data.retired)

    @property
    def has_data(self) -> bool:
        return self._data is not None

    def file_bytes(self, info: pb.FileInfo) -> bytes | None:
        """The checked bytes of the file `info` (a valid status) names, when the data table
        holds that version of it; None otherwise."""
        if self._data is None:
            return None
        return datatable.file_bytes(self._data, info.path, info.mount_id, info.version, info.length)

    def status(self, path: str) -> pb.FileInfo | None:
        """The status of `path` (as the master answers paths: "/a/b") the table holds while it
        is valid, its valid_for_ms what is left of that; None otherwise."""
        found = self._view.find(path.encode())
        if found is None:
            return None
        left = found[0] - time.monotonic()
        if left <= 0.001:
            return None
        try:
            info = pb.FileInfo.FromString(found[2])
        except DecodeError:
            return None
        if info.path != path:
            return None
        info.valid_for_ms = int(left * 1000)
        return info

    def close(self) -> None:
        self._view.table.close()
        if self._data is not None:
            self._data.table.close()
