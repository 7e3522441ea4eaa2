"""What the namespace says a file is, for the blocks a worker fetches from the store.

A reader names the block it wants (file version, block size, file length, index). A cache
hit may be served under that name: bytes only ever enter the cache under their true name.
A miss fetches bytes from the store and keeps them under that name, so the name must be
the namespace's: the worker asks the master for the file's current status and refuses a
request whose version or geometry differs (the file changed, or the request is forged)
instead of caching the store's bytes under a name they do not belong to.

While the master does not answer, a status it gave recently still serves; for a file the
worker never asked about, the store itself may vouch: an object the store holds now at the
named version and length, cut at the cluster's block size, is exactly the file the master
would describe (a store file's version is the store's own). Bytes fetched then are the
store's bytes of that version, so the name they are kept under is true either way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from cachetools import TTLCache

from strata.contract.errors import FailedPrecondition, NotFound, StrataError, Unavailable
from strata.contract.proto import strata_pb2 as pb

# How long a file's status is reused for further misses of its blocks (seconds). Short: a
# file replaced through another worker is seen within this long; a sequential reader's
# misses and readahead of one file share one master call per interval.
STATUS_TTL = 1.0
# While the master cannot be reached, a status it gave at most this long ago (seconds) still
# serves: readers of files they opened go on (their blocks were in the store when the master
# last said so), and a worker that never saw a file's status refuses its blocks.
STATUS_KEPT_IN_OUTAGE = 300.0
# How long a miss waits for the master's answer (seconds) before it goes on with an older
# status or the store's word: a stopped master must not hold every miss for the whole call
# deadline.
STATUS_PATIENCE = 2.0
# Statuses kept at most (the least recently used go first): a worker reading 10,000 files
# at once is far past what its cache holds in flight, and the entries stay small.
STATUSES_KEPT = 10_000


def mismatch(ref: pb.BlockRef, info: pb.FileInfo) -> str | None:
    """How the block a reader names differs from the file the namespace holds, or None."""
    if info.is_dir:
        return f"{info.path} is a directory"
    wanted = (ref.mount_id, ref.version, ref.block_size, ref.file_length)
    actual = (info.mount_id, info.version, info.block_size, info.length)
    if wanted == actual:
        return None
    return (f"the request names mount {ref.mount_id}, version {ref.version!r}, block size "
            f"{ref.block_size}, length {ref.file_length}; the namespace has mount {info.mount_id}, "
            f"version {info.version!r}, block size {info.block_size}, length {info.length}")


class FileStatuses:
    """The master's status of files, reused for STATUS_TTL seconds; concurrent requests for
    one path share one call."""

    def __init__(self, get_status: Callable[[str], Awaitable[pb.FileInfo]], *,
                 store_status: Callable[[pb.BlockRef], Awaitable[pb.FileInfo | None]] | None = None,
                 ttl: float = STATUS_TTL, kept_in_outage: float = STATUS_KEPT_IN_OUTAGE,
                 patience: float = STATUS_PATIENCE, clock: Callable[[], float] = time.monotonic,
                 on_answer: Callable[[pb.FileInfo, float], None] | None = None,
                 kept: Callable[[str], pb.FileInfo | None] | None = None) -> None:
        """`on_answer(status, asked)`: told each answer of the master and when it was asked;
        `kept(path)`: a status the master gave that it would still give (worker/kept.py),
        used before asking it."""
        self._get_status = get_status
        self._on_answer = on_answer
        self._kept = kept
        self._store_status = store_status
        self._ttl = ttl
        self._kept_in_outage = kept_in_outage
        self._patience = patience
        self._clock = clock
        # path -> (time.monotonic() of the question, the master's answer); an answer is of
        # no use once older than both the TTL and the outage allowance.
        self._known: TTLCache[str, tuple[float, pb.FileInfo]] = TTLCache(
            maxsize=STATUSES_KEPT, ttl=max(ttl, kept_in_outage), timer=clock)
        # Set while the master keeps a call past the patience, cleared by its next answer
        # (a status or an error of its own):
        # further misses then go on without waiting the patience out again.
        self._silent = False
        self._flights: dict[str, tuple[float, asyncio.Task[pb.FileInfo]]] = {}

    async def _status(self, ref: pb.BlockRef, *, fresh: bool) -> pb.FileInfo:
        path = ref.path
        known = self._known.get(path)
        if known is not None and not fresh and self._clock() - known[0] <= self._ttl:
            return known[1]
        if not fresh and self._kept is not None and (kept := self._kept(path)) is not None:
            return kept
        if path not in self._flights:
            task = asyncio.ensure_future(self._ask(path))
            self._flights[path] = (self._clock(), task)
            task.add_done_callback(lambda _: self._flights.pop(path, None))
        started, flight = self._flights[path]
        try:
            # The call goes on (shielded) and refreshes the status when it answers.
            wait = 0.0 if self._silent else max(0.0, started + self._patience - self._clock())
            return await asyncio.wait_for(asyncio.shield(flight), timeout=wait)
        except (TimeoutError, Unavailable) as exc:
            self._silent = self._silent or isinstance(exc, TimeoutError)
            return await self._stand_in(ref, known, fresh, flight)

    async def _stand_in(self, ref: pb.BlockRef, known: tuple[float, pb.FileInfo] | None, fresh: bool,
                        flight: asyncio.Task[pb.FileInfo]) -> pb.FileInfo:
        """What serves while the master does not answer: a status it gave recently, or the
        store's word for exactly the file `ref` names; else the master's answer or error."""
        held = known[1] if known is not None and self._clock() - known[0] <= self._kept_in_outage else None
        if held is None or fresh:  # fresh: the held status did not fit the request
            vouched = await self._vouched_by_store(ref)
            if vouched is not None:
                return vouched
        if held is not None:
            return held
        return await asyncio.shield(flight)

    async def _vouched_by_store(self, ref: pb.BlockRef) -> pb.FileInfo | None:
        """The store's own status of the file, when it is exactly the file `ref` names."""
        if self._store_status is None:
            return None
        try:
            info = await self._store_status(ref)
        except StrataError:  # the store is away too (or the mount unknown): wait for the master
            return None
        return info if info is not None and mismatch(ref, info) is None else None

    async def _ask(self, path: str) -> pb.FileInfo:
        asked = self._clock()
        try:
            info = await self._get_status(path)
        except Unavailable:
            raise
        except StrataError:
            self._silent = False  # it answered (the file is gone, ...): it is there
            raise
        self._silent = False
        self._known[path] = (asked, info)
        if self._on_answer is not None:
            self._on_answer(info, asked)
        return info

    def forget(self, path: str) -> None:
        """Ask the master again on the next check of `path`."""
        self._known.pop(path, None)

    async def check(self, ref: pb.BlockRef) -> pb.FileInfo:
        """The file's status when the block `ref` names is a block of the file as the
        namespace holds it now; FailedPrecondition (the reader should open the file again)
        or NotFound otherwise."""
        try:
            info = await self._status(ref, fresh=False)
            if mismatch(ref, info) is not None:
                info = await self._status(ref, fresh=True)  # maybe we knew an old one
        except NotFound as exc:
            raise NotFound(f"block {ref.index} of {ref.path}: the file is gone ({exc}); "
                           "it cannot be fetched") from exc
        problem = mismatch(ref, info)
        if problem is not None:
            raise FailedPrecondition(
                f"block {ref.index} of {ref.path} cannot be fetched: {problem}. The file changed "
                "since it was opened: open it again"
            )
        return info
