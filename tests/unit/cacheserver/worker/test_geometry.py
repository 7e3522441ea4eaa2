"""The worker's check that a block it is asked to fetch is a block of the file as the
namespace holds it now. The master is a plain async function here (a unit test of the rule;
tests/integration/test_integrity.py runs it against a real master)."""

from __future__ import annotations

import asyncio

import pytest

from strata.cacheserver.worker.geometry import FileStatuses, mismatch
from strata.contract.errors import FailedPrecondition, NotFound, Unavailable
from strata.contract.proto import strata_pb2 as pb

MiB = 1 << 20


def info(version: str = "v1", block_size: int = 4 * MiB, length: int = 10 * MiB) -> pb.FileInfo:
    return pb.FileInfo(path="/d/f", mount_id=3, version=version, block_size=block_size, length=length,
                       persisted=True)


def ref(version: str = "v1", block_size: int = 4 * MiB, length: int = 10 * MiB, index: int = 2) -> pb.BlockRef:
    return pb.BlockRef(mount_id=3, path="/d/f", version=version, index=index, block_size=block_size,
                       file_length=length, in_store=True)


class Master:
    """Answers GetStatus with the file it holds now; counts the calls."""

    def __init__(self, file: pb.FileInfo | None) -> None:
        self.file = file
        self.calls = 0
        self.down = False

    async def __call__(self, path: str) -> pb.FileInfo:
        self.calls += 1
        await asyncio.sleep(0)
        if self.down:
            raise Unavailable("master unreachable")
        if self.file is None:
            raise NotFound(f"{path} does not exist")
        return self.file


@pytest.mark.parametrize("forged", [ref(block_size=2 * MiB), ref(version="v0"), ref(length=8 * MiB),
                                    pb.BlockRef(mount_id=4, path="/d/f", version="v1", index=2,
                                                block_size=4 * MiB, file_length=10 * MiB)])
async def test_a_block_of_another_geometry_or_version_is_refused(forged: pb.BlockRef) -> None:
    statuses = FileStatuses(Master(info()))
    with pytest.raises(FailedPrecondition, match="The file changed since it was opened: open it again"):
        await statuses.check(forged)
    assert mismatch(forged, info()) is not None


async def test_statuses_are_reused_briefly_and_asked_again_before_a_refusal() -> None:
    now = [0.0]
    master = Master(info())
    statuses = FileStatuses(master, ttl=1.0, clock=lambda: now[0])
    await asyncio.gather(*(statuses.check(ref(index=i)) for i in range(3)))
    assert master.calls == 1  # one call for concurrent checks of one file
    await statuses.check(ref())
    assert master.calls == 1
    now[0] = 2.0
    await statuses.check(ref())
    assert master.calls == 2
    # The file was replaced through another worker: the known status is old, the new one fits.
    master.file = info(version="v2")
    assert (await statuses.check(ref(version="v2"))).version == "v2"
    assert master.calls == 3
    with pytest.raises(FailedPrecondition, match="version 'v1'.*version 'v2'"):
        await statuses.check(ref(version="v1"))


async def test_a_file_that_is_gone_is_not_found() -> None:
    statuses = FileStatuses(Master(None))
    with pytest.raises(NotFound, match="block 2 of /d/f: the file is gone"):
        await statuses.check(ref())


async def test_while_the_master_is_unreachable_a_recent_status_serves() -> None:
    now = [0.0]
    master = Master(info())
    statuses = FileStatuses(master, ttl=1.0, kept_in_outage=60.0, clock=lambda: now[0])
    await statuses.check(ref())
    master.down = True
    now[0] = 30.0
    assert (await statuses.check(ref())).version == "v1"
    with pytest.raises(FailedPrecondition, match="open it again"):
        await statuses.check(ref(version="v2"))
    now[0] = 90.0
    with pytest.raises(Unavailable, match="master unreachable"):
        await statuses.check(ref())
    with pytest.raises(Unavailable):  # a file never seen, and no store to vouch: nothing to go on
        await statuses.check(pb.BlockRef(mount_id=3, path="/d/other", version="v1", index=0,
                                         block_size=4 * MiB, file_length=MiB, in_store=True))


async def test_a_stopped_master_holds_a_miss_only_for_the_patience_when_a_status_is_at_hand() -> None:
    answered = asyncio.Event()
    calls = 0

    async def get_status(path: str) -> pb.FileInfo:
        nonlocal calls
        calls += 1
        if calls > 1:  # the master stops answering (a SIGSTOPped process): no error, no answer
            await answered.wait()
        return info()

    statuses = FileStatuses(get_status, ttl=0.0, kept_in_outage=60.0, patience=0.05)
    await statuses.check(ref())
    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(3):  # the first waits out the patience, the others share the slow call
        assert (await statuses.check(ref())).version == "v1"
    assert loop.time() - started < 1.0
    assert calls == 2
    answered.set()


class Store:
    """What the store alone says of /d/f; counts the calls."""

    def __init__(self, file: pb.FileInfo | None) -> None:
        self.file = file
        self.calls = 0

    async def __call__(self, block: pb.BlockRef) -> pb.FileInfo | None:
        self.calls += 1
        if self.file is None:
            raise Unavailable("store unreachable")
        return self.file


async def test_while_the_master_is_away_the_store_vouches_only_for_the_exact_file() -> None:
    master = Master(info())
    master.down = True
    store = Store(info())
    statuses = FileStatuses(master, store_status=store)
    # Never seen, master away: the store holds exactly the named file.
    assert (await statuses.check(ref())).version == "v1"
    # A forged or outdated name is refused: the store holds another version or length.
    for other in (ref(version="v0"), ref(length=8 * MiB), ref(block_size=2 * MiB)):
        with pytest.raises(Unavailable):
            await statuses.check(other)
    # A held status that no longer fits is not the last word while the store knows better.
    master.down = False
    await statuses.check(ref())
    master.down = True
    master.file = store.file = info(version="v2")
    assert (await statuses.check(ref(version="v2"))).version == "v2"
    # Store away too: the held status decides, and for a file never seen the master's error.
    store.file = None
    with pytest.raises(FailedPrecondition, match="open it again"):
        await statuses.check(ref(version="v3"))
    with pytest.raises(Unavailable, match="master unreachable"):
        await statuses.check(pb.BlockRef(mount_id=3, path="/d/g", version="v1", index=0,
                                         block_size=4 * MiB, file_length=MiB, in_store=True))


async def test_a_stopped_master_holds_a_never_seen_file_only_for_the_patience() -> None:
    answered = asyncio.Event()

    async def get_status(path: str) -> pb.FileInfo:
        await answered.wait()  # a SIGSTOPped master: no error, no answer
        return info()

    store = Store(info())
    statuses = FileStatuses(get_status, store_status=store, patience=0.05)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for index in range(3):
        assert (await statuses.check(ref(index=index))).version == "v1"
    assert loop.time() - started < 1.0
    assert store.calls == 3
    answered.set()
