"""Folders' statuses a worker keeps for the readers of its node, within their validity.

A new process that stats the files of a dataset (a loader checking sizes, a `find` that
stats what it found) and has no mapping of the node's status table (worker/published.py: a
process on a host without a worker, reading from the cluster's only worker) would ask the
worker once per file. It asks once per folder instead: the worker lists the folder at the master (page by page, at most
FOLDER_ENTRIES_MAX entries) and keeps the listing while every entry of it is reusable
(FileInfo.valid_for_ms, counted from when the worker asked), so the node's processes get it
with one request each and the master answers it once a validity. Only folders of read-only
mounts are listed; a folder whose answers the master does not mark reusable, or of a writable
mount (close-to-open), is not: the reader then asks for each file, as before. Each file of a listing is kept as its status
too (worker/kept.py), so the opens that follow need no question to the master either.

Listings are kept by the entries they hold (KEPT_FOLDER_ENTRIES in all, the least recently
used go first); the node's processes asking for one folder at once share one question.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable

from strata.contract.errors import Unavailable
from strata.contract.proto import strata_pb2 as pb
from .kept import KeptStatuses
from .masterlink import MasterLink

# A folder of more entries is not listed for the readers of the node (they ask for each
# file's status): a listing's reply carries ~150 bytes an entry.
FOLDER_ENTRIES_MAX = 5_000
# Entries of kept listings at most, in all (~0.3 KiB each with their serialized form).
KEPT_FOLDER_ENTRIES = 200_000
# Seconds a reader's question waits for the master's listing (then the reader asks for the
# file's status itself).
LISTING_PATIENCE = 5.0


class FolderListings:
    """Kept listings by folder path, each until its first entry's validity ends."""

    def __init__(self, link: MasterLink, kept: KeptStatuses, *, limit: int = KEPT_FOLDER_ENTRIES,
                 clock: Callable[[], float] = time.monotonic,
                 current: Callable[[int], bool] = lambda mount_id: True,
                 read_only: Callable[[str], bool] = lambda path: True) -> None:
        self._link = link
        self._kept = kept
        self._current = current  # whether a mount id is in the worker's mount table
        self._read_only = read_only  # whether a path lies in a read-only mount the worker knows
        self._limit = limit
        self._clock = clock
        # path -> (asked at, valid until, serialized ListStatusResponse, entries, their mounts)
        self._listings: OrderedDict[str, tuple[float, float, bytes, int, frozenset[int]]] = OrderedDict()
        self._entries = 0
        self._asking: dict[str, asyncio.Future[tuple[float, bytes | None, bool]]] = {}

    async def listing(self, path: str) -> tuple[bytes | None, float, bool]:
        """The folder's serialized ListStatusResponse and how long ago it was asked for;
        None with `too_large` True for a folder of more than FOLDER_ENTRIES_MAX entries,
        None alone for one whose answers are not reusable (one not in a read-only mount is
        never listed: a listing refreshes the master's view of the folder, which on a
        writable mount only its readers' own listings should do). Unavailable if the master
        does not answer within LISTING_PATIENCE."""
        if not self._read_only(path):
            return None, 0.0, False
        now = self._clock()
        kept = self._listings.get(path)
        if kept is not None:
            asked, until, data, _, mounts = kept
            if now < until and all(self._current(m) for m in mounts):
                self._listings.move_to_end(path)
                return data, now - asked, False
            self._forget(path)
        flight = self._asking.get(path)
        if flight is None:
            flight = self._asking[path] = asyncio.ensure_future(self._ask(path))
            flight.add_done_callback(lambda _: self._asking.pop(path, None))
        try:
            answer = await asyncio.wait_for(asyncio.shield(flight), timeout=LISTING_PATIENCE)
        except TimeoutError:
            raise Unavailable(f"the master did not list {path} within {LISTING_PATIENCE:g}s") from None
        return answer[1], self._clock() - answer[0], answer[2]

    async def _ask(self, path: str) -> tuple[float, bytes | None, bool]:
        asked = self._clock()
        files = await self._link.folder_statuses(path, FOLDER_ENTRIES_MAX, timeout=LISTING_PATIENCE * 6)
        if files is None:
            return asked, None, True
        if not files or any(not f.valid_for_ms for f in files):
            return asked, None, False
        for info in files:
            self._kept.put(info, asked, publish=False)
        data = pb.ListStatusResponse(files=files).SerializeToString()
        self._forget(path)
        self._listings[path] = (asked, asked + min(f.valid_for_ms for f in files) / 1000, data, len(files),
                                frozenset(f.mount_id for f in files))
        self._entries += len(files)
        while self._entries > self._limit and self._listings:
            self._forget(next(iter(self._listings)))
        return asked, data, False

    def _forget(self, path: str) -> None:
        kept = self._listings.pop(path, None)
        if kept is not None:
            self._entries -= kept[3]

    def forget_file(self, path: str) -> None:
        """The file at `path` changed in the store: its folder's listing is not answered again."""
        self._forget(path.rsplit("/", 1)[0] or "/")
