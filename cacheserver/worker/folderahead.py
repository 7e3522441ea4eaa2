"""The read-ahead of a folder's small files: when the readers of a worker open several small
files of one folder cold (each fetched from the store while its reader waits), as a training
epoch does reading a folder in a shuffled order, the worker fetches the folder's other small
files ahead, from the master's listing of it, a few at a time, so the opens that follow find
their file cached.

Only folders of read-only mounts are read ahead (as only theirs are listed for readers,
worker/folders.py: a listing refreshes the master's view of a folder, which on a writable
mount only its readers' own listings should do).

Bounded on every side (`FolderReadaheadSettings`):
- the trigger: `trigger` cold opens of a folder's small files within `window` seconds; a job
  that reads one file of a large folder, or a few slowly, starts nothing;
- the store requests in flight over every folder (`files`), each one whole small file, and the
  folders read ahead at once (`folders`);
- the lead: a folder's read-ahead fetches at most `ahead_bytes` more than its readers opened
  since it began, and waits (up to `window`) for the readers to catch up; a folder whose
  readers opened nothing for `window` seconds is left, so what a stopped job wastes is at most
  `ahead_bytes` a folder;
- the tiers: past `room` of their capacity in use the read-ahead stops, rather than evict what
  readers fetched to make room for what they may never read.

Readers come first: a read-ahead fetch takes no more than its own store connection, and a
file a reader opens while the read-ahead fetches it is fetched once (the block store's fetch
in flight is shared), as is one the read-ahead reaches after a reader fetched it (it is held:
skipped). A file is fetched as the listing's version of it, on the condition that the store
still holds that version (the store's read insists on it): an object changed since the
listing is refused, never cached under the old name.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from strata.contract.errors import StrataError
from strata.contract.proto import strata_pb2 as pb
from ..background import BackgroundTasks
from .settings import FolderReadaheadSettings

log = logging.getLogger(__name__)

# Folders whose recent opens are remembered (the least recently opened go first).
FOLDERS_KEPT = 1024
# Seconds a folder's listing may take to be read through, page by page, as its read-ahead goes.
LISTING_DEADLINE = 900.0

# The entries of a folder's listing, a page at a time (`MasterLink.folder_pages`).
FolderPages = Callable[[str], AsyncGenerator[Sequence[pb.FileInfo], None]]


def folder_of(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


@dataclass
class _Folder:
    """What the worker saw of one folder's opens, and its read-ahead's progress."""

    cold: OrderedDict[str, float] = field(default_factory=OrderedDict)  # its last `trigger` cold files: when
    last_open: float = 0.0
    running: bool = False
    opened_bytes: int = 0  # bytes of the files its readers opened since its read-ahead began
    fetched_bytes: int = 0  # bytes its read-ahead fetched (or is fetching)
    opened: asyncio.Event = field(default_factory=asyncio.Event)


class FolderReadahead:
    """Read-ahead of the small files of the folders readers open cold (on the worker's loop)."""

    def __init__(self, settings: FolderReadaheadSettings, *, pages: FolderPages,
                 fetch: Callable[[pb.FileInfo], Awaitable[None]], held: Callable[[pb.FileInfo], bool],
                 full: Callable[[float], bool], listable: Callable[[str], bool] = lambda path: True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._pages = pages
        self._fetch = fetch  # fetches a file's only block into the cache as the listing's version
        self._held = held  # whether a file's only block is cached here
        self._full = full  # whether the tiers hold more than this share of their capacity
        self._listable = listable  # whether a folder may be listed for its readers (a read-only mount's)
        self._runs = 0  # folders read ahead now
        self._clock = clock
        self._folders: OrderedDict[str, _Folder] = OrderedDict()
        self._in_flight = asyncio.Semaphore(max(settings.files, 1))
        self._tasks = BackgroundTasks()

    def small(self, length: int, block_size: int) -> bool:
        """Whether a file of `length` bytes is one the read-ahead fetches (and counts opens of)."""
        return 0 < length <= min(block_size, self.settings.file_bytes)

    def opened(self, path: str, length: int, *, cold: bool) -> None:
        """A reader opened the small file at `path` (`length` bytes): fetched from the store
        for it (`cold`), or found cached. Starts the folder's read-ahead on its trigger. The file
        is one block (the caller knows); one larger than `file_bytes` is not counted."""
        if not self.settings.files or not 0 < length <= self.settings.file_bytes:
            return
        now = self._clock()
        name = folder_of(path)
        folder = self._folders.get(name)
        if folder is None:
            folder = self._folders[name] = _Folder()
            self._forget_old()
        self._folders.move_to_end(name)
        folder.last_open = now
        folder.opened_bytes += length
        folder.opened.set()
        if not cold or folder.running:
            return
        folder.cold[path] = now  # distinct files: readers that wait for one fetch count once
        folder.cold.move_to_end(path)
        while len(folder.cold) > self.settings.trigger:
            folder.cold.popitem(last=False)
        first = next(iter(folder.cold.values()))
        if len(folder.cold) < self.settings.trigger or now - first > self.settings.window:
            return
        if self._runs >= self.settings.folders or not self._listable(name):
            return  # the next cold open looks again
        folder.cold.clear()
        folder.running = True
        self._runs += 1
        folder.opened_bytes = folder.fetched_bytes = 0
        self._tasks.spawn(self._run(name, folder), f"folder-readahead-{name[-40:]}")

    def _forget_old(self) -> None:
        while len(self._folders) > FOLDERS_KEPT:
            name = next((n for n, f in self._folders.items() if not f.running), None)
            if name is None:
                return
            del self._folders[name]

    async def _run(self, name: str, folder: _Folder) -> None:
        """Fetch the folder's small files not held here, in its listing's order, within the
        bounds (module docstring); ends at the folder's end, its readers' stop, a full tier or
        the first failure (a reader's next cold opens start it again)."""
        pages = self._pages(name)
        try:
            async for page in pages:
                for info in page:
                    if info.is_dir or not info.persisted or not self.small(info.length, info.block_size):
                        continue
                    if self._held(info):
                        continue
                    if not await self._may_fetch(folder, info.length):
                        return
                    await self._in_flight.acquire()
                    if folder.running is False:  # a fetch failed meanwhile
                        self._in_flight.release()
                        return
                    folder.fetched_bytes += info.length
                    self._tasks.spawn(self._one(folder, info), "folder-readahead-file")
        except StrataError as exc:
            log.info("read-ahead of %s stopped: %s", name, exc)
        finally:
            await pages.aclose()
            folder.running = False
            self._runs -= 1

    async def _may_fetch(self, folder: _Folder, length: int) -> bool:
        """Wait until the folder's lead over its readers leaves room for `length` bytes more;
        False when its readers stopped (nothing opened for `window`) or the tiers are full."""
        while True:
            idle = self._clock() - folder.last_open
            if idle > self.settings.window or self._full(self.settings.room) or not folder.running:
                return False
            if folder.fetched_bytes - folder.opened_bytes + length <= self.settings.ahead_bytes:
                return True
            folder.opened.clear()
            try:
                await asyncio.wait_for(folder.opened.wait(), timeout=self.settings.window - idle)
            except TimeoutError:
                pass

    async def _one(self, folder: _Folder, info: pb.FileInfo) -> None:
        try:
            if not self._held(info):  # a reader may have fetched it while this one waited
                await self._fetch(info)
        except StrataError as exc:
            log.info("read-ahead of %s failed, the folder's read-ahead stops: %s", info.path, exc)
            folder.running = False
        finally:
            self._in_flight.release()

    async def close(self) -> None:
        """Stop every read-ahead under way."""
        await self._tasks.close()
