"""The master's answers a worker keeps for the readers of its node, within their validity.

The master marks a file's status reusable for a while (FileInfo.valid_for_ms: files of
read-only mounts, for what is left of their mount's freshness interval; 0 elsewhere). A
worker that asked keeps the answer until the time it sent the question plus that long, and
answers the processes of its node with it (the short-circuit socket's and the data port's
opens, see `blockwire`), with what is left of the validity: a new loader process then opens a
file with one round trip to its node's worker instead of one to the master and one for the
block, and goes on opening while the master is away, for as long as the answers it would
have given stand. Nothing is kept past its validity; an answer found out of date early (the
store holds another version) is dropped (`forget`), and so is one whose mount is no longer
in the worker's mount table (a master that lost its journal mounts the source again under a
new id: an answer naming the old one would keep reads on blocks of a forgotten mount).

With a kept status of a one-block file goes, once the worker served that block, where the
block lies in its store (`held_file`): the socket threads answer the next opens of the file
from the two alone, without waiting on the worker's event loop (see worker/transfer.py). The
block's place is only a hint: a block evicted, moved to another tier or dropped is no longer
at it (the socket thread then finds no file of the block's length there and asks the loop),
and the reader checks every byte it reads against the block's checksums, as on any path.

Each status kept from a question about its file, and each answered from what is kept, is
also published to the node's processes in shared memory (worker/published.py), so a new
process answers its stats without asking; one dropped here is dropped there too. Statuses
of folder listings are not published (a listing of thousands answers one stat).

Read from the socket threads and written from the event loop: a lock guards the table.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from strata.contract.proto import strata_pb2 as pb
from ..cache.index import CachedBlock
from .published import PublishedStatuses

# Statuses kept at most (the least recently used go first): a file's entry takes about
# 0.5 KiB, so a dataset of 200,000 files read by the node's loaders costs ~100 MiB at most.
KEPT_STATUSES = 200_000


class KeptStatuses:
    """Reusable statuses by path, each until its validity ends."""

    def __init__(self, limit: int = KEPT_STATUSES, clock: Callable[[], float] = time.monotonic,
                 current: Callable[[int], bool] = lambda mount_id: True,
                 published: PublishedStatuses | None = None) -> None:
        self.limit = limit
        self.published = published or PublishedStatuses()
        self._clock = clock
        self._current = current  # whether a mount id is in the worker's mount table
        self._lock = threading.Lock()
        self._answers: OrderedDict[str, tuple[float, pb.FileInfo]] = OrderedDict()  # path -> (until, status)
        self._blocks: dict[str, CachedBlock] = {}  # path -> where its only block lay when last served

    def __len__(self) -> int:
        return len(self._answers)

    def put(self, info: pb.FileInfo, sent: float, *, publish: bool = True) -> None:
        """Keep the master's answer to a question sent at `sent` (the clock's time), and
        publish it to the node's processes (unless not `publish`: an entry of a listing); an
        answer not marked reusable replaces (drops) what was kept of its path."""
        with self._lock:
            if not info.valid_for_ms or info.is_dir:
                if self._answers.pop(info.path, None) is not None:
                    self.published.drop(info.path)
                self._blocks.pop(info.path, None)
                return
            kept = self._answers.get(info.path)
            if kept is not None and kept[1].version != info.version:
                self._blocks.pop(info.path, None)
                if not publish:
                    self.published.drop(info.path)
            self._answers[info.path] = (sent + info.valid_for_ms / 1000, info)
            self._answers.move_to_end(info.path)
            if publish:
                self.published.publish(info, sent + info.valid_for_ms / 1000)
            while len(self._answers) > self.limit:
                self._blocks.pop(self._answers.popitem(last=False)[0], None)

    def hold_block(self, info: pb.FileInfo, block: CachedBlock) -> None:
        """`block`, the only block of the file `info` describes, was served from this
        worker's store: the next open of the file while its status is kept may be answered
        with it (see the module docstring)."""
        with self._lock:
            kept = self._answers.get(info.path)
            if kept is not None and kept[1].version == info.version and block.length == info.length:
                self._blocks[info.path] = block

    def opened(self, path: str) -> tuple[pb.FileInfo, CachedBlock | None] | None:
        """As `get`, with where the file's only block lay when it was last served (None if
        it was not, or not since its status was kept)."""
        info = self.get(path)
        if info is None:
            return None
        with self._lock:
            block = self._blocks.get(path)
        same = block is not None and (block.key.mount_id, block.key.version) == (info.mount_id, info.version)
        return info, block if same else None

    def lost_block(self, path: str) -> None:
        """The block of `path` is no longer where it was kept: the next open asks the store."""
        with self._lock:
            self._blocks.pop(path, None)

    def get(self, path: str) -> pb.FileInfo | None:
        """The status kept of `path` while it is valid, its valid_for_ms cut to what is left
        of its validity now; None if none is."""
        now = self._clock()
        with self._lock:
            kept = self._answers.get(path)
            if kept is None:
                return None
            until, info = kept
            if now >= until or not self._current(info.mount_id):
                del self._answers[path]
                self._blocks.pop(path, None)
                self.published.drop(path)
                return None
            self._answers.move_to_end(path)
            self.published.publish(info, until)  # again, if a new table lacks it
        left = pb.FileInfo()
        left.CopyFrom(info)
        left.valid_for_ms = int((until - now) * 1000)
        return left if left.valid_for_ms else None

    def forget(self, path: str) -> None:
        """The status of `path` is out of date (the store holds another version): the next
        question goes to the master."""
        with self._lock:
            self._answers.pop(path, None)
            self._blocks.pop(path, None)
            self.published.drop(path)
