"""The bounds of a folder's read-ahead: its trigger, its requests in flight, its lead over the
readers, its stop when the readers stop or the tiers fill (worker/folderahead.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

from strata.cacheserver.worker.folderahead import FolderReadahead
from strata.cacheserver.worker.settings import FolderReadaheadSettings
from strata.contract.proto import strata_pb2 as pb

SIZE = 1000
BLOCK = 1 << 20


def entry(i: int, **fields: object) -> pb.FileInfo:
    return pb.FileInfo(**{"path": f"/m/ds/f{i:04d}", "length": SIZE, "block_size": BLOCK,  # type: ignore[arg-type]
                          "persisted": True, "version": f"v{i}", **fields})


class Folder:
    """A folder's listing, the fetches made of it and how many ran at once."""

    def __init__(self, count: int, *, page: int = 7, extra: Sequence[pb.FileInfo] = ()) -> None:
        self.entries = [*extra, *(entry(i) for i in range(count))]
        self.page = page
        self.fetched: list[str] = []
        self.running = 0
        self.most = 0
        self.full = False
        self.gate = asyncio.Event()
        self.gate.set()
        self.listed: list[str] = []

    async def pages(self, path: str) -> AsyncGenerator[Sequence[pb.FileInfo], None]:
        self.listed.append(path)
        for start in range(0, len(self.entries), self.page):
            yield self.entries[start:start + self.page]

    async def fetch(self, info: pb.FileInfo) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.gate.wait()
            await asyncio.sleep(0.001)
            self.fetched.append(info.path)
        finally:
            self.running -= 1

    def readahead(self, **settings: object) -> FolderReadahead:
        return FolderReadahead(FolderReadaheadSettings(**settings),  # type: ignore[arg-type]
                               pages=self.pages, fetch=self.fetch, held=lambda info: info.path in self.fetched,
                               full=lambda share: self.full)


async def settle(seconds: float = 0.1) -> None:
    await asyncio.sleep(seconds)


async def test_cold_opens_below_the_trigger_or_spread_past_the_window_start_nothing() -> None:
    folder = Folder(50)
    ahead = folder.readahead(trigger=4, window=0.2)
    for i in range(3):
        ahead.opened(f"/m/ds/x{i}", SIZE, cold=True)
    await settle()
    assert folder.listed == []
    await asyncio.sleep(0.25)  # the first three are past the window now
    ahead.opened("/m/ds/x3", SIZE, cold=True)
    await settle()
    assert folder.listed == []
    for i in range(4, 7):  # four within the window: the folder is read ahead
        ahead.opened(f"/m/ds/x{i}", SIZE, cold=True)
    await settle()
    assert folder.listed == ["/m/ds"]
    await ahead.close()


async def test_warm_opens_large_files_and_one_file_again_do_not_count_towards_the_trigger() -> None:
    folder = Folder(50)
    ahead = folder.readahead(trigger=2, file_bytes=SIZE)
    for i in range(5):
        ahead.opened(f"/m/ds/w{i}", SIZE, cold=False)
        ahead.opened(f"/m/ds/big{i}", SIZE + 1, cold=True)
        ahead.opened("/m/ds/same", SIZE, cold=True)  # readers waiting for one fetch
    await settle()
    assert folder.listed == []
    await ahead.close()


async def test_requests_in_flight_stay_within_the_setting_and_each_file_is_fetched_once() -> None:
    folder = Folder(40, extra=[pb.FileInfo(path="/m/ds/sub", is_dir=True),
                               entry(999, length=BLOCK + 1), entry(998, persisted=False)])
    folder.gate.clear()
    ahead = folder.readahead(files=3, trigger=1, window=30)
    ahead.opened("/m/ds/f0000", SIZE, cold=True)
    await settle()
    assert folder.running == 3  # the rest wait for one of these to end
    folder.gate.set()
    for _ in range(100):
        ahead.opened("/m/ds/elsewhere", SIZE, cold=False)  # the readers go on
        await asyncio.sleep(0.01)
        if len(folder.fetched) == 40:
            break
    assert folder.most == 3
    assert sorted(folder.fetched) == [f"/m/ds/f{i:04d}" for i in range(40)]  # no dir, large or unpersisted file
    await ahead.close()


async def test_the_read_ahead_leads_its_readers_by_at_most_its_bytes() -> None:
    folder = Folder(100)
    ahead = folder.readahead(trigger=1, ahead_bytes=5 * SIZE, window=30)
    ahead.opened("/m/ds/f0050", SIZE, cold=True)
    await settle()
    assert len(folder.fetched) == 5
    for i in range(3):  # the readers open three more files: three more are fetched
        ahead.opened(f"/m/ds/f{i:04d}", SIZE, cold=False)
    await settle()
    assert len(folder.fetched) == 8
    await ahead.close()


async def test_the_read_ahead_stops_when_its_readers_stop_or_the_tiers_fill() -> None:
    folder = Folder(100)
    ahead = folder.readahead(trigger=1, ahead_bytes=5 * SIZE, window=0.2)
    ahead.opened("/m/ds/f0050", SIZE, cold=True)
    await asyncio.sleep(0.5)  # nothing opened for the window: it ended
    assert len(folder.fetched) == 5
    full = Folder(100)
    full.full = True
    stopped = full.readahead(trigger=1)
    stopped.opened("/m/ds/f0050", SIZE, cold=True)
    await settle()
    assert full.fetched == [] and full.listed == ["/m/ds"]
    await ahead.close()
    await stopped.close()


async def test_zero_files_turns_the_read_ahead_off() -> None:
    folder = Folder(10)
    ahead = folder.readahead(files=0, trigger=1)
    ahead.opened("/m/ds/f0001", SIZE, cold=True)
    await settle()
    assert folder.listed == [] and folder.fetched == []
    await ahead.close()


async def test_a_folder_that_may_not_be_listed_is_not_read_ahead() -> None:
    folder = Folder(10)
    ahead = FolderReadahead(FolderReadaheadSettings(trigger=1), pages=folder.pages, fetch=folder.fetch,
                            held=lambda info: False, full=lambda share: False, listable=lambda path: False)
    ahead.opened("/m/ds/f0001", SIZE, cold=True)
    await settle()
    assert folder.listed == [] and folder.fetched == []
    await ahead.close()
