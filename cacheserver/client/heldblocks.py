"""Block files of the worker on this host, kept open by a process between its opens of a file.

A reader on a worker's host holds each block it reads by asking the worker for the block's
file over the short-circuit socket: one round trip a block, every time the file is opened.
Processes open the same files again and again: pyarrow opens a Parquet file for its footer and
again to scan it, a job reads its dataset in rounds, a loader opens a shard once per batch. Each
of those opens would ask for files the worker has just handed over, and when the machine is
busy the worker's answer waits for a core: a warm Parquet scan through short-circuit spent a
tenth of its time waiting for holds. The client keeps the files it was handed (up to
`held_blocks` of them, each for `held_blocks_for` seconds) and gives them out again.

What is given out again is as sound as a new hold:
- a block is named by its file's version, so a file changed in the store is new blocks;
- every range read from a kept file is checked chunk by chunk, as any short-circuit read
  (`LocalBlock`), and a block whose check failed is never given out again;
- a kept file is the worker's copy only while the worker keeps it: the worker unlinks a block
  file when it evicts the block, moves it to another tier or drops a damaged copy, so a file
  found unlinked is let go and the block held anew.

A kept file whose block the worker let go of still holds the block's memory (a file's pages
stay while a descriptor is open), so kept files are bounded: in number, and in time by a
thread that looks at them every CHECK_EVERY seconds, letting go of those unlinked or older
than `held_blocks_for`. The worker also hears of every block in use at least that often, so
its eviction sees them used.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from strata.contract.proto import strata_pb2 as pb
from .transfer import LocalBlock

# Seconds between two looks at the kept files (for those the worker unlinked, or too old).
CHECK_EVERY = 1.0

_Key = tuple[int, str, str, int, int, int, int]


def _key(ref: pb.BlockRef, read_type: int) -> _Key:
    return (ref.mount_id, ref.path, ref.version, ref.index, ref.block_size, ref.file_length, read_type)


class HeldBlocks:
    """The block files last held, by block, at most `limit` of them for `keep_for` seconds
    each (`limit` 0: none kept)."""

    def __init__(self, limit: int, keep_for: float) -> None:
        self._limit = limit if keep_for > 0 else 0
        self._keep_for = keep_for
        self._lock = threading.Lock()
        self._blocks: OrderedDict[_Key, tuple[float, LocalBlock]] = OrderedDict()  # oldest first
        self._checker: threading.Thread | None = None  # the thread looking at them
        self._closed = threading.Event()

    def __len__(self) -> int:
        return len(self._blocks)

    def get(self, ref: pb.BlockRef, read_type: int) -> LocalBlock | None:
        """The block's file held before, if it is still the worker's sound copy."""
        if not self._limit:
            return None
        key = _key(ref, read_type)
        with self._lock:
            entry = self._blocks.get(key)
        if entry is None:
            return None
        held_at, block = entry
        if time.monotonic() - held_at < self._keep_for and block.sound():
            return block
        self._drop(key, block)
        return None

    def put(self, ref: pb.BlockRef, read_type: int, block: LocalBlock) -> None:
        """Keep a block file just held (the oldest kept goes past the limit)."""
        if not self._limit or self._closed.is_set():
            return
        key = _key(ref, read_type)
        with self._lock:
            self._blocks[key] = (time.monotonic(), block)
            self._blocks.move_to_end(key)
            while len(self._blocks) > self._limit:
                self._blocks.popitem(last=False)
            # (a forked child has the parent's kept files, and its thread as one not alive)
            if self._checker is None or not self._checker.is_alive():
                self._checker = threading.Thread(target=self._check, name="strata-held-blocks", daemon=True)
                self._checker.start()

    def clear(self) -> None:
        """Let go of every kept file, and stop looking at them."""
        self._closed.set()
        with self._lock:
            self._blocks.clear()

    def _drop(self, key: _Key, block: LocalBlock) -> None:
        with self._lock:
            entry = self._blocks.get(key)
            if entry is not None and entry[1] is block:
                del self._blocks[key]

    def _check(self) -> None:
        """Every CHECK_EVERY seconds, let go of the kept files that are too old or that the
        worker no longer keeps; end when none is left."""
        while not self._closed.wait(CHECK_EVERY):
            now = time.monotonic()
            with self._lock:
                entries = list(self._blocks.items())
            for key, (held_at, block) in entries:
                if now - held_at >= self._keep_for or not block.sound():
                    self._drop(key, block)
            with self._lock:
                if not self._blocks:
                    self._checker = None
                    return
