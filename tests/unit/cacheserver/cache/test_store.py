"""Contract tests of BlockStore, run for every eviction policy (and, where a single tier
suffices, every medium), with real files in /dev/shm and on disk."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tinydisk import tiny_disk

from strata.cacheserver.cache import (
    BlockCorrupt,
    BlockStore,
    TierConfig,
    default_mem_dir,
)
from strata.cacheserver.cache import BlockMetadata
from strata.cacheserver.cache import placement as placement_module
from strata.cacheserver.cache import store as store_module
from strata.cacheserver.common.checksums import CHUNK_SIZE, compute_checksums
from strata.cacheserver.common.keys import BlockKey
from strata.contract.constants import DEFAULT_BLOCK_SIZE
from strata.contract.errors import (
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)

U = 1024  # a small block, so quotas can be counted in blocks


# Block size of the keys: only an identifier here; blocks up to this size fit.
KEY_BLOCK_SIZE = 1 << 30


def key(index: int, path: str = "/data/file", version: str = "v1", *, length: int = U) -> BlockKey:
    return BlockKey(1, path, version, index, KEY_BLOCK_SIZE, length)


def payload(nbytes: int, seed: int = 0) -> bytes:
    """Deterministic bytes that differ between seeds."""
    pattern = bytes((seed * 31 + i * 7) % 251 for i in range(4096))
    return (pattern * (nbytes // len(pattern) + 1))[:nbytes]


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the loop (and threads) run until `condition()` holds; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.001)


def media_of(store: BlockStore) -> dict[int, str]:
    """block index -> medium, for the blocks of key()."""
    return {b.key.index: b.medium for b in store.blocks()}


def check_invariants(store: BlockStore, dirs: Any, recorder: Any) -> None:
    """What must hold between operations: each tier under its quota, accounting equal to
    the bytes on disk, files on disk equal to the blocks known, reports equal to both."""
    blocks = store.blocks()
    for usage in store.stats():
        assert usage.used <= usage.capacity, usage
        on_disk = dirs.files(usage.medium)
        assert usage.used == sum(p.stat().st_size for p in on_disk), usage
        assert {p.name for p in on_disk} == {
            b.path.name for b in blocks if b.medium == usage.medium
        }, usage.medium
        assert usage.blocks == len(on_disk)
        assert not dirs.files(usage.medium, ".tmp")
    reported: set[BlockKey] = set()
    for added, removed in recorder.calls:
        assert not {b.key for b in added} & set(removed)
        reported.update(b.key for b in added)
        reported.difference_update(removed)
    assert reported == {b.key for b in blocks}


class Fetcher:
    """A fetch callable that counts calls and can be held until released."""

    def __init__(self, data: bytes | Exception, *, held: bool = True) -> None:
        self.data = data
        self.calls = 0
        self.release = asyncio.Event()
        if not held:
            self.release.set()

    async def __call__(self) -> bytes:
        self.calls += 1
        await self.release.wait()
        if isinstance(self.data, Exception):
            raise self.data
        return self.data


# -- one tier of every medium -----------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 3 * CHUNK_SIZE + 17, DEFAULT_BLOCK_SIZE])
async def test_round_trip(make_store: Any, medium: str, size: int, dirs: Any, recorder: Any) -> None:
    store = await make_store((medium, 64 << 20))
    data = os.urandom(size)
    k = key(0, length=size)
    block = await store.put(k, data)
    assert (block.key, block.length, block.medium, block.pinned) == (k, size, medium, False)
    assert block.path.parent == dirs(medium) and block.path.stat().st_size == size
    assert len(block.checksums) == -(-size // CHUNK_SIZE)
    assert await store.read(k, 0, size) == data
    for offset, length in [(size // 3, size // 2), (max(size - 5, 0), 100), (size, 10)]:
        assert await store.read(k, offset, length) == data[offset : offset + length]
    assert store.lookup(k) == block and store.blocks() == [block]
    assert [(u.medium, u.used, u.blocks) for u in store.stats()] == [(medium, size, 1)]
    fd, same = store.open_fd(k)
    try:
        assert same == block and os.pread(fd, size + 1, 0) == data
    finally:
        os.close(fd)
    assert recorder.added == [k] and recorder.removed == []
    with pytest.raises(InvalidArgument, match=f"offset {size + 1} is past its end"):
        await store.read(k, size + 1, 1)


async def test_single_flight(make_store: Any, medium: str) -> None:
    store = await make_store((medium, 1 << 20))
    fetch = Fetcher(payload(3 * U))
    calls = [asyncio.create_task(store.get_or_fetch(key(0, length=3 * U), fetch)) for _ in range(10)]
    await wait_until(lambda: fetch.calls == 1)
    fetch.release.set()
    results = await asyncio.gather(*calls)
    assert fetch.calls == 1
    assert {hit for _, hit in results} == {False}
    assert {block for block, _ in results} == {store.lookup(key(0, length=3 * U))}
    assert await store.read(key(0, length=3 * U), 0, 3 * U) == payload(3 * U)
    block, hit = await store.get_or_fetch(key(0, length=3 * U), fetch)
    assert hit and fetch.calls == 1 and block.length == 3 * U


@pytest.mark.parametrize(
    "result, error, message",
    [
        (Unavailable("store unreachable"), Unavailable, "store unreachable"),
        (payload(U - 1), DataLoss, f"returned {U - 1} bytes, expected {U}"),
    ],
)
async def test_failed_fetch_reaches_every_waiter_and_caches_nothing(
    make_store: Any, medium: str, dirs: Any, recorder: Any, result: bytes | Exception, error: type,
    message: str,
) -> None:
    store = await make_store((medium, 1 << 20))
    fetch = Fetcher(result)
    calls = [asyncio.create_task(store.get_or_fetch(key(0), fetch)) for _ in range(10)]
    await wait_until(lambda: fetch.calls == 1)
    fetch.release.set()
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(o, error) and message in str(o) for o in outcomes), outcomes
    assert fetch.calls == 1 and store.lookup(key(0)) is None and store.blocks() == []
    assert store.stats()[0].used == 0 and recorder.calls == [] and os.listdir(dirs(medium)) == []
    # The next reader tries again.
    fetch.data = payload(U)
    block, hit = await store.get_or_fetch(key(0), fetch)
    assert not hit and fetch.calls == 2 and block.length == U


async def test_a_cancelled_reader_does_not_cancel_the_fetch_of_others(make_store: Any) -> None:
    store = await make_store(("MEM", 1 << 20))
    fetch = Fetcher(payload(U))
    first = asyncio.create_task(store.get_or_fetch(key(0), fetch))
    second = asyncio.create_task(store.get_or_fetch(key(0), fetch))
    await wait_until(lambda: fetch.calls == 1)
    first.cancel()
    fetch.release.set()
    block, hit = await second
    assert first.cancelled() and not hit and block.length == U and fetch.calls == 1


async def store_read(store: BlockStore, k: BlockKey, offset: int, length: int) -> bytes:
    return await store.read(k, offset, length)


async def read_checked(store: BlockStore, k: BlockKey, offset: int, length: int) -> bytes:
    """What a sender of the block file (the data port's sendfile) sends after open_checked."""
    fd, _ = await store.open_checked(k, offset, length)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


@pytest.mark.parametrize("reader", ["read", "open_checked"])
async def test_a_flipped_byte_is_caught_by_the_read_that_touches_it(
    make_store: Any, medium: str, recorder: Any, reader: str
) -> None:
    read = store_read if reader == "read" else read_checked
    store = await make_store((medium, 16 << 20))
    data = os.urandom(3 * CHUNK_SIZE)
    k = key(0, length=len(data))
    block = await store.put(k, data)
    with open(block.path, "r+b") as f:
        f.seek(2 * CHUNK_SIZE + 100)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    # Only the touched chunks are verified: the first two are intact.
    assert await read(store, k, 10, 2 * CHUNK_SIZE - 10) == data[10 : 2 * CHUNK_SIZE]
    with pytest.raises(BlockCorrupt, match=re.escape(f"block {k} on {medium}: chunk 2 failed its CRC-32C check")):
        await read(store, k, CHUNK_SIZE, CHUNK_SIZE + 200)
    assert isinstance(BlockCorrupt("x"), DataLoss)
    assert store.lookup(k) is None and not block.path.exists()
    assert recorder.removed == [k] and store.stats()[0].used == 0
    with pytest.raises(NotFound, match="not cached on this worker"):
        await store.read(k, 0, 1)


@pytest.mark.parametrize("detector", ["lookup", "read", "open_fd", "get_or_fetch"])
async def test_a_deleted_block_file_is_detected(
    make_store: Any, medium: str, recorder: Any, detector: str
) -> None:
    store = await make_store((medium, 1 << 20))
    block = await store.put(key(0), payload(U))
    block.path.unlink()
    if detector == "lookup":
        assert store.lookup(key(0)) is None
    elif detector == "read":
        with pytest.raises(BlockCorrupt, match="cannot read"):
            await store.read(key(0), 0, U)
    elif detector == "open_fd":
        with pytest.raises(NotFound, match="not cached"):
            store.open_fd(key(0))
    else:
        fetch = Fetcher(payload(U), held=False)
        again, hit = await store.get_or_fetch(key(0), fetch)
        assert not hit and fetch.calls == 1 and again.path.exists()
        assert recorder.removed == [key(0)] and recorder.added == [key(0), key(0)]
        return
    assert recorder.removed == [key(0)] and store.blocks() == [] and store.stats()[0].used == 0


async def test_restart_keeps_intact_blocks(make_store: Any, medium: str, dirs: Any) -> None:
    first = await make_store((medium, 1 << 20))
    data = {i: payload(U + i, seed=i) for i in range(4)}
    for i, d in data.items():
        await first.put(key(i, length=U + i), d, pin=(i == 1))
    await first.close()
    corrupt = dirs(medium) / f"{key(2, length=U + 2).block_id}.blk"
    raw = bytearray(corrupt.read_bytes())
    raw[5] ^= 0xFF
    corrupt.write_bytes(bytes(raw))
    (dirs(medium) / f".{key(0, length=U).block_id}.blk.deadbeef.tmp").write_bytes(b"partial write")

    second = await make_store((medium, 1 << 20))
    found = {b.key.index: b for b in second.blocks()}
    assert sorted(found) == [0, 1, 2, 3] and found[1].pinned and not found[0].pinned
    assert second.stats()[0].used == sum(len(d) for d in data.values())
    assert await second.read(key(0, length=U), 0, U) == data[0]
    with pytest.raises(BlockCorrupt):  # sizes match at restart; the checksum catches it
        await second.read(key(2, length=U + 2), 0, 10)
    fd, block = second.open_fd(key(3, length=U + 3))  # the first open after a restart verifies it all
    os.close(fd)
    assert block.checksums == found[3].checksums
    assert not dirs.files(medium, ".tmp")


async def test_open_fd_verifies_a_block_found_at_restart(make_store: Any, dirs: Any) -> None:
    first = await make_store(("SSD", 1 << 20))
    block = await first.put(key(0), payload(U))
    await first.close()
    raw = bytearray(block.path.read_bytes())
    raw[-1] ^= 0x10
    block.path.write_bytes(bytes(raw))
    second = await make_store(("SSD", 1 << 20))
    with pytest.raises(BlockCorrupt, match="chunk 0 failed its CRC-32C check"):
        second.open_fd(key(0))
    assert second.blocks() == [] and not block.path.exists()


async def test_put_again_refreshes_or_replaces(make_store: Any, recorder: Any) -> None:
    store = await make_store(("MEM", 1 << 20))
    first = await store.put(key(0), payload(U, seed=1))
    assert await store.put(key(0), payload(U, seed=1)) == first
    assert (await store.put(key(0), payload(U, seed=1), pin=True)).pinned
    replaced = await store.put(key(0), payload(U, seed=2))
    assert replaced.checksums != first.checksums and await store.read(key(0), 0, U) == payload(U, seed=2)
    assert store.stats()[0].used == U and len(store.blocks()) == 1
    # Dropped and cached again in one call: reported once, as added.
    assert recorder.calls[-1] == ([replaced], [])


async def test_free_pin_and_remove(make_store: Any, recorder: Any) -> None:
    store = await make_store(("SSD", 1 << 20))
    for i in range(3):
        await store.put(key(i, path="/a"), payload(U))
        await store.put(key(i, path="/b", length=2 * U), payload(2 * U))
    assert store.set_pinned(lambda k: k.path == "/a", True) == 3
    assert store.set_pinned(lambda k: k.path == "/a", True) == 3
    assert {b.key.path for b in store.blocks() if b.pinned} == {"/a"}
    assert store.stats()[0].pinned == 3 * U
    recorder.clear()
    assert store.free(lambda k: k.path == "/a") == 3 * U  # pinned blocks are freed too
    assert sorted(recorder.removed, key=lambda k: k.index) == [key(i, path="/a") for i in range(3)]
    assert len(recorder.calls) == 1  # one report for the whole free
    assert store.remove(key(0, path="/b", length=2 * U)) and not store.remove(key(0, path="/b", length=2 * U))
    assert store.set_pinned(lambda k: True, False) == 2
    assert store.stats()[0].used == 4 * U and store.stats()[0].pinned == 0


async def test_ttl_frees_blocks_unused_since_the_cutoff(make_store: Any) -> None:
    now = [1000.0]
    store = await make_store(("HDD", 1 << 20), clock=lambda: now[0])
    await store.put(key(0), payload(U))
    await store.put(key(1), payload(U), pin=True)
    await store.put(key(2, path="/other"), payload(U))
    now[0] = 2000.0
    await store.put(key(3), payload(U))
    now[0] = 2500.0
    await store.read(key(0), 0, 1)  # read recently: kept
    freed = store.free_unused_since(1500.0, lambda k: k.path == "/data/file")
    assert freed == U and sorted(media_of(store)) == [0, 2, 3]


async def test_last_access_survives_a_restart(make_store: Any) -> None:
    now = [1000.0]
    store = await make_store(("SSD", 1 << 20), clock=lambda: now[0])
    await store.put(key(0), payload(U))
    await store.put(key(1), payload(U))
    now[0] = 1030.0
    await store.read(key(1), 0, 1)  # too soon to rewrite the sidecar: close() does
    await store.close()
    again = await make_store(("SSD", 1 << 20), clock=lambda: now[0])
    assert again.free_unused_since(1020.0, lambda k: True) == U
    assert sorted(media_of(again)) == [1]


# -- several tiers ----------------------------------------------------------------------------


async def test_watermarks(make_store: Any, recorder: Any) -> None:
    store = await make_store(("SSD", 10 * U))  # high 9.5 blocks, low 8
    for i in range(9):
        await store.put(key(i), payload(U))
    assert store.stats()[0].blocks == 9 and recorder.removed == []
    await store.put(key(9), payload(U))  # would pass 9.5: evict down to 8 with it
    assert sorted(media_of(store)) == [2, 3, 4, 5, 6, 7, 8, 9]
    assert recorder.removed == [key(0), key(1)]


async def test_demotion_mem_to_ssd_then_drop(make_store: Any, recorder: Any, dirs: Any) -> None:
    store = await make_store(("MEM", 4 * U), ("SSD", 4 * U), high_watermark=1.0, low_watermark=0.5)
    for i in range(1, 5):
        await store.put(key(i), payload(U, seed=i))
    assert media_of(store) == dict.fromkeys(range(1, 5), "MEM")
    await store.put(key(5), payload(U, seed=5))  # MEM full: 1-3 go down to SSD
    assert media_of(store) == {1: "SSD", 2: "SSD", 3: "SSD", 4: "MEM", 5: "MEM"}
    assert recorder.removed == []  # a demotion is neither an addition nor a removal
    for i in (6, 7, 8):
        await store.put(key(i), payload(U, seed=i))
    # 4-6 left MEM; SSD made room for them by dropping 1-3 from the cache.
    assert media_of(store) == {4: "SSD", 5: "SSD", 6: "SSD", 7: "MEM", 8: "MEM"}
    assert recorder.removed == [key(1), key(2), key(3)]
    for i in (4, 8):
        assert await store.read(key(i), 0, U) == payload(U, seed=i)
        block = store.lookup(key(i))
        assert block is not None and block.path.parent == dirs(block.medium)
    check_invariants(store, dirs, recorder)


async def test_memory_blocks_go_to_a_disk_tier_before_exit_and_are_found_again(
        make_store: Any, dirs: Any, recorder: Any) -> None:
    """A MEM tier is lost with the process (or the pod): before the worker exits its blocks
    move to a disk tier, the most recently read first, as far as the disk takes them below
    its low watermark, and the next run finds them there."""
    tiers = (("MEM", 4 * U), ("SSD", 8 * U))
    store = await make_store(*tiers, high_watermark=1.0, low_watermark=0.5)
    for i in range(4):
        await store.put(key(i), payload(U, seed=i))
    store.set_pinned(lambda k: k.index == 3, True)
    assert await store.keep_memory(time.monotonic() + 30) == 3
    assert media_of(store) == {0: "SSD", 1: "SSD", 2: "SSD", 3: "MEM"}  # pinned stays
    check_invariants(store, dirs, recorder)
    await store.close()
    again = await make_store(*tiers)
    assert {i for i, medium in media_of(again).items() if medium == "SSD"} == {0, 1, 2}
    assert await again.read(key(1), 0, U) == payload(U, seed=1)


async def test_only_the_hottest_memory_blocks_take_the_disk_before_exit(make_store: Any) -> None:
    store = await make_store(("MEM", 4 * U), ("SSD", 2 * U), high_watermark=1.0, low_watermark=0.5)
    for i in range(3):
        await store.put(key(i), payload(U, seed=i))
    for i in (2, 0, 1):  # read order: 1 is the hottest
        await asyncio.sleep(0.01)
        await store.read(key(i), 0, 1)
    assert await store.keep_memory(time.monotonic() - 1) == 0  # no time left: nothing moves
    assert await store.keep_memory(time.monotonic() + 30) == 1  # the disk's room below its low watermark
    assert media_of(store) == {0: "MEM", 1: "SSD", 2: "MEM"}


async def test_demotion_skips_a_tier_that_cannot_take_the_block(make_store: Any, recorder: Any) -> None:
    store = await make_store(("MEM", 2 * U), ("SSD", 2 * U), ("HDD", 8 * U),
                             high_watermark=1.0, low_watermark=0.5)
    for i in range(3):
        await store.put(key(i), payload(U))
    assert media_of(store) == {0: "SSD", 1: "SSD", 2: "MEM"}
    assert store.set_pinned(lambda k: k.index < 2, True) == 2
    await store.put(key(3), payload(U))
    await store.put(key(4), payload(U))  # MEM's victims pass the pinned SSD by
    assert media_of(store) == {0: "SSD", 1: "SSD", 2: "HDD", 3: "HDD", 4: "MEM"}
    assert recorder.removed == []


async def test_pinned_blocks_are_never_evicted(make_store: Any, dirs: Any, recorder: Any) -> None:
    store = await make_store(("MEM", 4 * U), ("SSD", 4 * U))
    await store.put(key(0), payload(U), pin=True)
    await store.put(key(1), payload(U), pin=True)
    for i in range(2, 30):
        await store.put(key(i), payload(U))
        assert media_of(store)[0] == media_of(store)[1] == "MEM"
        check_invariants(store, dirs, recorder)


async def test_resource_exhausted_when_everything_is_pinned(make_store: Any) -> None:
    store = await make_store(("MEM", 4 * U), ("SSD", 2 * U))
    for i in range(6):
        await store.put(key(i), payload(U), pin=True)
    with pytest.raises(ResourceExhausted) as caught:
        await store.put(key(6), payload(U))
    message = str(caught.value)
    assert "no cache tier can take block" in message
    assert "MEM quota 4KiB, used 4KiB, pinned 4KiB; SSD quota 2KiB, used 2KiB, pinned 2KiB" in message
    assert "Unpin or free" in message
    with pytest.raises(ResourceExhausted, match=r"\(5KiB\): MEM quota 4KiB"):
        await store.get_or_fetch(key(7, length=5 * U), Fetcher(payload(5 * U), held=False))
    store.set_pinned(lambda k: k.index == 0, False)
    await store.put(key(6), payload(U))
    assert key(0) not in {b.key for b in store.blocks()}


async def test_a_block_too_big_for_the_fast_tier_goes_to_a_slower_one(make_store: Any) -> None:
    store = await make_store(("MEM", 2 * U), ("SSD", 8 * U))
    assert (await store.put(key(0, length=3 * U), payload(3 * U))).medium == "SSD"
    await store.put(key(1, length=2 * U), payload(2 * U), pin=True)
    assert (await store.put(key(2), payload(U))).medium == "SSD"  # MEM is all pinned


async def test_promote_moves_a_hit_to_the_fastest_tier(make_store: Any, dirs: Any, recorder: Any) -> None:
    store = await make_store(("MEM", 2 * U), ("SSD", 4 * U), ("HDD", 8 * U),
                             high_watermark=1.0, low_watermark=0.5)
    for i in range(6):
        await store.put(key(i), payload(U, seed=i))
    slow = min(media_of(store))  # the oldest block, now below MEM
    assert media_of(store)[slow] != "MEM"
    fetch = Fetcher(payload(U, seed=slow))
    block, hit = await store.get_or_fetch(key(slow), fetch, promote=True)
    assert hit and fetch.calls == 0 and block.medium == "MEM" and media_of(store)[slow] == "MEM"
    assert await store.read(key(slow), 0, U) == payload(U, seed=slow)
    assert recorder.removed == []
    check_invariants(store, dirs, recorder)


def record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> set[tuple[int, int]]:
    """The files (device, inode) os.fsync is called on from now (it is still called). A
    power cut cannot be made in a unit test: what is on the disk when a put returns is what
    it fsynced (a file before its rename into place: the inode stays)."""
    synced: set[tuple[int, int]] = set()
    real = os.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        synced.add((st.st_dev, st.st_ino))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def inodes(*paths: Path) -> set[tuple[int, int]]:
    return {(st.st_dev, st.st_ino) for st in map(os.stat, paths)}


@pytest.mark.parametrize("disk", ["SSD", "HDD"])
async def test_a_written_blocks_only_copy_is_on_the_disk_when_put_returns(
        make_store: Any, dirs: Any, monkeypatch: pytest.MonkeyPatch, disk: str) -> None:
    # MUST_CACHE and ASYNC_THROUGH blocks (a written version, pinned) are the only copy of
    # their file: a power cut after the writer was answered must not take them. Cached
    # copies of store data are written without fsync (the store has them).
    synced = record_fsyncs(monkeypatch)
    store = await make_store(("MEM", 4 * U), (disk, 64 * U))
    await store.put(key(0, "/a", length=2 * U), payload(2 * U), pin=True)  # store data, pinned by a user: MEM
    await store.put(key(1), payload(U))
    await store.put(key(2, version="w-1", length=3 * U), payload(3 * U), pin=True)
    assert media_of(store) == {0: "MEM", 1: "MEM", 2: disk}
    written = store.lookup(key(2, version="w-1", length=3 * U))
    assert written is not None
    assert synced == inodes(written.path, written.path.with_suffix(".meta"), dirs(disk))
    # It stays on the disk: a read that promotes leaves it there, with room in MEM.
    store.free(lambda k: k.path == "/a")
    synced.clear()
    block, hit = await store.get_or_fetch(written.key, Fetcher(b""), promote=True)
    assert hit and block.medium == disk and synced == set()
    block, hit = await store.get_or_fetch(key(1), Fetcher(b""), promote=True)
    assert hit and block.medium == "MEM"


@pytest.mark.parametrize("disk", ["SSD", "HDD"])
async def test_a_written_blocks_only_copy_goes_to_a_disk_tier_never_to_memory(make_store: Any, disk: str) -> None:
    # A MEM tier's folder is emptied by a restart of the machine or of a Kubernetes pod (an
    # emptyDir in memory): the only copy of an acknowledged MUST_CACHE or ASYNC_THROUGH
    # block goes to a disk tier, even when MEM has room, and never falls back to MEM.
    store = await make_store(("MEM", 64 * U), (disk, 3 * U))
    must = await store.put(key(0, version="w-1"), payload(U), pin=True)
    cached_copy = await store.put(key(1, version="w-1"), payload(U))  # not pinned: not its only copy
    pinned_store_data = await store.put(key(2), payload(U), pin=True)
    assert (must.medium, cached_copy.medium, pinned_store_data.medium) == (disk, "MEM", "MEM")
    await store.put(key(3, version="w-2", length=2 * U), payload(2 * U), pin=True)
    with pytest.raises(ResourceExhausted, match=f"goes to a disk tier only\\): {disk} quota"):
        await store.put(key(4, version="w-3"), payload(U), pin=True)
    assert media_of(store) == {0: disk, 1: "MEM", 2: "MEM", 3: disk}


async def test_with_memory_alone_a_written_block_stays_in_memory(make_store: Any) -> None:
    store = await make_store(("MEM", 4 * U))
    assert (await store.put(key(0, version="w-1"), payload(U), pin=True)).medium == "MEM"


@pytest.mark.parametrize("eviction, evicted", [("LRU", "a"), ("LRFU", "c")])
async def test_lru_and_lrfu_evict_different_blocks(make_store: Any, eviction: str, evicted: str) -> None:
    store = await make_store(("SSD", 4 * U), high_watermark=0.9, low_watermark=0.75)
    names = {"a": key(0), "b": key(1), "c": key(2)}
    await store.put(names["a"], payload(U))
    await store.put(names["b"], payload(U))
    for _ in range(5):
        await store.read(names["a"], 0, 1)
    await store.put(names["c"], payload(U))
    await store.read(names["b"], 0, 1)
    await store.put(key(3), payload(U))  # 4 blocks > 3.6: evict one, down to 3
    left = {b.key for b in store.blocks()}
    assert left == {*names.values(), key(3)} - {names[evicted]}


async def test_each_tier_stays_under_its_quota_under_load(make_store: Any, dirs: Any, recorder: Any) -> None:
    store = await make_store(("MEM", 6 * U), ("SSD", 9 * U), ("HDD", 12 * U))
    rng = random.Random(7)
    for step in range(150):
        index = rng.randrange(40)
        k = key(index, length=(index % 3 + 1) * U)
        action = rng.random()
        if action < 0.6:
            try:
                await store.put(k, payload(k.length, seed=k.index), pin=rng.random() < 0.05)
            except ResourceExhausted:
                pass
        elif action < 0.8:
            block = store.lookup(k)
            if block is not None:
                assert await store.read(k, 0, block.length) == payload(block.length, seed=k.index)
        elif action < 0.9:
            store.set_pinned(lambda x, k=k: x == k, False)
        else:
            store.remove(k)
        check_invariants(store, dirs, recorder)


async def test_concurrent_puts_keep_the_accounting_exact(make_store: Any, dirs: Any, recorder: Any) -> None:
    store = await make_store(("MEM", 8 * U), ("SSD", 8 * U))
    await asyncio.gather(*(store.put(key(i), payload(U, seed=i)) for i in range(40)))
    check_invariants(store, dirs, recorder)
    assert len(store.blocks()) <= 16
    for block in store.blocks():
        assert await store.read(block.key, 0, U) == payload(U, seed=block.key.index)


@pytest.mark.parametrize("copied", [False, True], ids=["before-copy", "after-copy"])
async def test_a_block_removed_while_it_is_demoted_leaves_nothing_behind(
    make_store: Any, dirs: Any, recorder: Any, monkeypatch: pytest.MonkeyPatch, copied: bool
) -> None:
    store = await make_store(("MEM", 2 * U), ("SSD", 4 * U), high_watermark=1.0, low_watermark=0.5)
    await store.put(key(0), payload(U))
    await store.put(key(1), payload(U))
    started, proceed = threading.Event(), threading.Event()
    copy = placement_module.copy_block

    def slow_copy(*args: Any) -> None:
        if copied:
            copy(*args)
        started.set()
        assert proceed.wait(5)
        if not copied:
            copy(*args)

    monkeypatch.setattr(placement_module, "copy_block", slow_copy)
    put = asyncio.create_task(store.put(key(2), payload(U)))  # demotes key(0)
    await wait_until(started.is_set)
    assert await store.read(key(0), 0, U) == payload(U)  # readable while it moves
    assert store.remove(key(0))
    proceed.set()
    await put
    assert media_of(store) == {1: "SSD", 2: "MEM"}
    check_invariants(store, dirs, recorder)


# -- configuration and life cycle -------------------------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        ({"eviction": "MRU"}, "unknown eviction policy 'MRU'; use one of LRFU, LRU"),
        ({"low_watermark": 0.95}, "low_watermark (0.95) must be >= 0 and below high_watermark (0.95)"),
        ({"high_watermark": 0.5, "low_watermark": 0.6}, "must be >= 0 and below high_watermark (0.5)"),
        ({"high_watermark": 1.5}, "high_watermark must be in (0, 1], got 1.5"),
    ],
)
def test_bad_store_options(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        BlockStore([TierConfig("SSD", U, (tmp_path,))], **options)


def test_bad_tier_lists(tmp_path: Path) -> None:
    ssd, hdd = TierConfig("SSD", U, (tmp_path / "s",)), TierConfig("HDD", U, (tmp_path / "h",))
    with pytest.raises(InvalidArgument, match="at least one cache tier"):
        BlockStore([])
    with pytest.raises(InvalidArgument, match=re.escape("fastest first (MEM, SSD, HDD); got ['HDD', 'SSD']")):
        BlockStore([hdd, ssd])
    with pytest.raises(InvalidArgument, match="at most one tier per medium"):
        BlockStore([ssd, ssd])
    with pytest.raises(InvalidArgument, match="is used by tiers SSD and HDD"):
        BlockStore([ssd, TierConfig("HDD", U, (tmp_path / "s",))])


async def test_use_before_open_and_after_close(tmp_path: Path) -> None:
    store = BlockStore([TierConfig("SSD", U, (tmp_path,))])
    with pytest.raises(FailedPrecondition, match="not open yet: await store.open"):
        store.lookup(key(0))
    async with store:
        await store.put(key(0, length=1), b"x")
        with pytest.raises(FailedPrecondition, match="open\\(\\) called twice"):
            await store.open()
    with pytest.raises(FailedPrecondition, match="block store is closed"):
        await store.put(key(1, length=1), b"y")


async def test_default_mem_dir_is_private_and_removed_at_close() -> None:
    path = default_mem_dir()
    assert not path.exists()
    try:
        async with BlockStore([TierConfig("MEM", 1 << 20)]) as store:
            block = await store.put(key(0, length=3), b"abc")
            assert block.path.parent == path and block.path.read_bytes() == b"abc"
        assert not path.exists()
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_a_default_mem_dir_holding_a_written_blocks_only_copy_is_left_at_close() -> None:
    path = default_mem_dir()
    written = BlockKey(1, "/w", "w-1", 0, KEY_BLOCK_SIZE, 3)
    try:
        async with BlockStore([TierConfig("MEM", 1 << 20)]) as store:
            await store.put(written, b"abc", pin=True)
        assert (path / f"{written.block_id}.blk").read_bytes() == b"abc"
        async with BlockStore([TierConfig("MEM", 1 << 20, (path,))]) as again:  # found by whoever names it
            assert [b.key for b in again.blocks()] == [written]
        async with BlockStore([TierConfig("MEM", 1 << 20)]) as store:
            store.free(lambda k: True)  # the file is in the store, or removed: nothing left to keep
        assert not path.exists()
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_a_read_racing_a_demotion_reads_the_new_copy(
    make_store: Any, dirs: Any, recorder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await make_store(("MEM", 2 * U), ("SSD", 4 * U), high_watermark=1.0, low_watermark=0.5)
    await store.put(key(0), payload(U, seed=3))
    await store.put(key(1), payload(U))
    waiting, proceed = threading.Event(), threading.Event()
    read_chunks = store_module.read_chunks
    paths: list[Path] = []

    def late_read(path: Path, *args: Any) -> Any:
        paths.append(path)
        if len(paths) == 1:  # the first attempt opens the file only after it has moved
            waiting.set()
            assert proceed.wait(5)
        return read_chunks(path, *args)

    monkeypatch.setattr(store_module, "read_chunks", late_read)
    read = asyncio.create_task(store.read(key(0), 0, U))
    await wait_until(waiting.is_set)
    await store.put(key(2), payload(U))  # moves key(0) and key(1) down to SSD
    assert media_of(store)[0] == "SSD"
    proceed.set()
    assert await read == payload(U, seed=3)
    assert [p.parent for p in paths] == [dirs("MEM"), dirs("SSD")]
    assert recorder.removed == []
    check_invariants(store, dirs, recorder)


async def test_blocks_of_another_geometry_are_other_blocks(make_store: Any, recorder: Any) -> None:
    store = await make_store(("MEM", 1 << 20))
    await store.put(key(0), payload(U))
    with pytest.raises(InvalidArgument, match="got 2048 bytes, its key says 1024"):
        await store.put(key(0), payload(2 * U))
    fetch = Fetcher(payload(2 * U, seed=5), held=False)
    block, hit = await store.get_or_fetch(key(0, length=2 * U), fetch)
    assert not hit and fetch.calls == 1 and block.length == 2 * U
    assert await store.read(key(0), 0, 4 * U) == payload(U)
    assert await store.read(key(0, length=2 * U), 0, 4 * U) == payload(2 * U, seed=5)
    assert store.stats()[0].used == 3 * U
    with pytest.raises(DataLoss, match="the store returned 1024 bytes, expected 3072"):
        await store.get_or_fetch(key(0, length=3 * U), Fetcher(payload(U), held=False))


async def test_open_drops_blocks_cut_with_another_block_size_but_keeps_pinned_ones(
    make_store: Any, dirs: Any
) -> None:
    first = await make_store(("SSD", 1 << 20), block_size=4 * U)
    cut4 = [BlockKey(1, "/f", "v", i, 4 * U, 4 * U) for i in range(2)]
    written4 = BlockKey(1, "/w", "w-1", 0, 4 * U, U)  # only copy of a write: pinned
    cut2 = BlockKey(1, "/f", "v", 0, 2 * U, 2 * U)
    for k in [*cut4, cut2]:
        await first.put(k, payload(k.length, seed=k.index))
    await first.put(written4, payload(U), pin=True)
    await first.close()
    second = await make_store(("SSD", 1 << 20), block_size=2 * U)
    assert {b.key for b in second.blocks()} == {cut2, written4}
    assert second.stats()[0].used == 3 * U
    assert {p.name for p in dirs.files("SSD")} == {f"{cut2.block_id}.blk", f"{written4.block_id}.blk"}
    with pytest.raises(InvalidArgument, match="block_size must be an integer > 0, got 0"):
        BlockStore([TierConfig("SSD", U, (dirs("SSD"),))], block_size=0)


def modes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mode & 0o777 for p in [directory, *directory.iterdir()]}


async def test_block_files_and_folders_are_the_owner_s_only(
    make_store: Any, dirs: Any, recorder: Any
) -> None:
    # A MEM folder left world-readable by an older release is tightened, and nothing the
    # store creates (blocks, sidecars, copies made by moves) is readable by other users.
    dirs("MEM").mkdir(mode=0o755)
    os.chmod(dirs("MEM"), 0o755)
    store = await make_store(("MEM", 2 * U), ("SSD", 8 * U), ("HDD", 8 * U))
    for i in range(4):  # MEM takes two: the rest push blocks down to SSD (a copy across file systems)
        await store.put(key(i), payload(U, seed=i), pin=(i == 3))
    store.set_pinned(lambda k: True, False)  # rewrites sidecars
    assert {b.medium for b in store.blocks()} >= {"MEM", "SSD"}
    for medium in ("MEM", "SSD", "HDD"):
        found = modes(dirs(medium))
        assert found.pop(dirs(medium).name) == 0o700, medium
        assert set(found.values()) <= {0o600}, (medium, found)
    assert len(modes(dirs("MEM"))) >= 3 and len(modes(dirs("SSD"))) >= 3  # the folder, a block, its sidecar
    check_invariants(store, dirs, recorder)


async def test_a_tier_on_a_disk_smaller_than_its_quota_evicts_before_the_disk_is_full(
    eviction: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A 1 GiB quota on a 64 MiB disk: the tier holds what the disk can (minus a little),
    # evicts to make room, never fails a put for a full disk and reports its real capacity.
    block = 4 << 20
    with tiny_disk("64m") as disk:
        async with BlockStore([TierConfig("SSD", 1 << 30, (disk / "ssd",))], eviction=eviction) as store:
            usage = store.stats()[0]
            assert usage.quota == 1 << 30 and 60 << 20 <= usage.capacity <= 64 << 20
            assert "less than the tier's quota of 1GiB" in caplog.text
            for i in range(40):  # 160 MiB through a 64 MiB disk
                k = BlockKey(1, "/big", "v", i, block, block)
                await store.put(k, payload(block, seed=i))
                assert await store.read(k, 0, block) == payload(block, seed=i)
                usage = store.stats()[0]
                assert usage.used <= usage.capacity <= 64 << 20
            assert 8 <= usage.blocks <= 16
            # Something else fills the disk: the next put finds it full, evicts, and succeeds.
            filler = disk / "other-program.bin"
            with open(filler, "wb") as f:
                with contextlib.suppress(OSError):
                    for _ in range(64):
                        f.write(b"\0" * (1 << 20))
            k = BlockKey(1, "/big", "v", 99, block, block)
            await store.put(k, payload(block, seed=99))
            assert await store.read(k, 0, block) == payload(block, seed=99)
            usage = store.stats()[0]
            assert usage.used <= usage.capacity <= (64 << 20) - filler.stat().st_size


async def test_a_block_checksummed_in_other_chunks_stays_valid(make_store: Any, dirs: Any) -> None:
    # Sidecars record their chunk size: blocks cached before CHUNK_SIZE changed still verify.
    first = await make_store(("SSD", 8 << 20))
    data = payload(3 << 20)
    k = key(0, length=len(data))
    await first.put(k, data)
    await first.close()
    old = BlockMetadata(k, len(data), "SSD", compute_checksums(data, 1 << 20), 1.0, 1.0, chunk_size=1 << 20)
    old.write(dirs("SSD") / f"{k.block_id}.meta")
    second = await make_store(("SSD", 8 << 20))
    fd, block = second.open_fd(k)
    os.close(fd)
    assert (block.chunk_size, len(block.checksums)) == (1 << 20, 3)
    assert await second.read(k, 5, 100) == data[5:105]
