"""Opens a socket thread answers alone: a small file whose status the worker keeps (see
worker/kept.py) and whose only block it served before, from where that block lay.

An open of such a file (a training loader's, every epoch a new process) needs no fetch, no
tier move and no question to the master: the connection's thread opens the block file and
answers at once, instead of handing the request to the worker's event loop and waiting for
it there (two thread switches and a turn of the loop, most of what an open cost the worker).
An open that asks for the status alone (a stat, or a file too large to come whole with it)
is answered from a kept status the same way. Everything else goes to the loop as before: a status not kept or no longer valid, a block not
served since, a read type other than the mount's own, and a block that is no longer at its
place (evicted, moved to another tier, dropped as damaged: no file of its length there).

What the loop would have done besides goes to it afterwards, in batches: the store counts the
block as read (its eviction order) and the worker's counters count the hit and the bytes.
The reader checks the bytes against the block's checksums as on any path; the descriptor is
of the block file itself, so what it checks is what the store holds.
"""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import dataclass

from strata.contract.proto import strata_pb2 as pb
from ..common.checksums import CHUNK_SIZE
from .reads import BlockReads, BlockSource


@dataclass(frozen=True)
class _Served:
    """One open answered in a socket thread, for the loop to count."""

    path: str
    block_id: str
    mount_id: int
    medium: str
    length: int
    served_path: str
    client: str
    as_file: bool


class KeptOpens:
    """Opens answered from kept statuses and blocks in the socket threads (thread-safe)."""

    def __init__(self, reads: BlockReads, loop: asyncio.AbstractEventLoop) -> None:
        self._reads = reads
        self._loop = loop
        self._lock = threading.Lock()
        self._served: list[_Served] = []
        self._statuses = 0  # opens answered with a status alone since the last fold
        self._fold_due = False  # a fold is scheduled on the loop

    def open(self, path: str, read_type: int, whole_below: int, *, as_file: bool, served_path: str,
             client: str) -> tuple[pb.FileInfo, BlockSource | None] | None:
        """The status of `path` and its only block's open file when both can be had here
        (see the module docstring); the status alone for a file whose block the open does
        not ask for (a stat, or a file of `whole_below` bytes or more); None: the loop
        answers the open."""
        if read_type:
            return None
        opened = self._reads.kept.opened(path)
        if opened is None:
            return None
        info, block = opened
        if not 0 < info.length <= min(whole_below, info.block_size):
            self._note(None)
            return info, None
        if block is None:
            return None
        if not as_file and block.chunk_size != CHUNK_SIZE:  # the data port sends whole chunks' checksums
            return None
        try:
            fd = os.open(block.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._reads.kept.lost_block(path)
            return None
        try:
            size = os.fstat(fd).st_size
        except OSError:
            size = -1
        if size != block.length:  # not the block's file any more (a file being replaced)
            os.close(fd)
            self._reads.kept.lost_block(path)
            return None
        self._note(_Served(path, block.key.block_id, info.mount_id, block.medium, block.length, served_path,
                           client, as_file))
        return info, BlockSource(hit=True, length=block.length, fd=fd, checksums=block.checksums,
                                 chunk_size=block.chunk_size, block_length=block.length)

    def _note(self, served: _Served | None) -> None:
        """Count an open answered here (None: its status alone) on the loop."""
        with self._lock:
            if served is None:
                self._statuses += 1
            else:
                self._served.append(served)
            if self._fold_due:
                return
            self._fold_due = True
        self._loop.call_soon_threadsafe(self._fold)

    def _fold(self) -> None:
        """Count the opens answered since the last fold (on the loop, as every counter is)."""
        with self._lock:
            served, self._served = self._served, []
            statuses, self._statuses = self._statuses, 0
            self._fold_due = False
        counters = self._reads.counters
        counters.kept_opens += statuses
        for one in served:
            self._reads.store.touch(one.block_id)
            counters.kept_opens += 1
            counters.hit(one.mount_id, one.medium, one.length)
            counters.bytes_served += one.length
            if one.as_file:
                counters.short_circuit_reads += 1
            else:
                counters.data_port_reads += 1
            counters.served_bytes[one.served_path, one.client] += one.length
            self._reads.ahead.opened(one.path, one.length, cold=False)  # the file is one block
