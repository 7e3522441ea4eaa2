"""The node's status table as a client process reads it (see common/statustable.py).

The descriptor comes once from the node's worker over its short-circuit socket; the table is
mapped read-only (the worker sealed it against any other writer) and a stat is a hash lookup
in the mapping: no request. What the mapping says is used only until its validity ends
(CLOCK_MONOTONIC, which the worker's `until` is on too), and only when its record checks;
anything else is a miss, and the client asks as it would without the table.
"""

from __future__ import annotations

import mmap
import os
import time

from google.protobuf.message import DecodeError

from strata.contract.proto import strata_pb2 as pb
from ..common.statustable import TableError, TableView


class NodeTable:
    """One mapping of the node's status table (thread-safe: it only reads)."""

    def __init__(self, fd: int) -> None:
        """Map the table `fd` names (the caller keeps `fd`); TableError if it is none."""
        try:
            table = mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)
        except (OSError, ValueError) as exc:
            raise TableError(f"the node's status table cannot be mapped: {exc}") from exc
        try:
            self._view = TableView(table)
        except TableError:
            table.close()
            raise
        self.generation = self._view.generation

    @property
    def retired(self) -> bool:
        return self._view.retired

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
