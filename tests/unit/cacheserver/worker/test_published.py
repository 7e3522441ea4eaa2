"""The node's status table: what the worker publishes and what a reader of a mapping finds,
including in a table whose bytes are damaged or cut short (never a wrong status)."""

from __future__ import annotations

import mmap
import os
import random
import time

import pytest

from strata.contract.proto import strata_pb2 as pb
from strata.cacheserver.client.nodetable import NodeTable
from strata.cacheserver.common.statustable import MIN_TABLE_BYTES, TableError, TableView
from strata.cacheserver.worker.kept import KeptStatuses
from strata.cacheserver.worker.published import PublishedStatuses
from strata.cacheserver.worker.settings import StatusTableSettings


def status(i: int, *, valid_for_ms: int = 60_000, version: str = "v1") -> pb.FileInfo:
    return pb.FileInfo(path=f"/ds/train/{i // 10}/s-{i}.bin", name=f"s-{i}.bin", length=1000 + i, version=version,
                       mount_id=3, read_only=True, persisted=True, valid_for_ms=valid_for_ms)


def mapped(published: PublishedStatuses) -> NodeTable:
    fd = published.descriptor()
    assert fd is not None
    try:
        return NodeTable(fd)
    finally:
        os.close(fd)


def published(size: int = 1 << 20) -> PublishedStatuses:
    return PublishedStatuses(StatusTableSettings(bytes=size))


def test_a_reader_finds_what_the_worker_published_until_its_validity_ends() -> None:
    table = published()
    now = time.monotonic()
    table.publish(status(1), now + 60)
    table.publish(status(2), now + 0.05)
    reader = mapped(table)
    got = reader.status(status(1).path)
    assert got is not None and got.length == 1001 and 59_000 < got.valid_for_ms <= 60_000
    assert reader.status("/ds/train/0/s-3.bin") is None  # never published
    time.sleep(0.06)
    assert reader.status(status(2).path) is None  # past its validity
    table.publish(status(1, version="v2"), now + 60)  # a newer answer replaces it
    assert reader.status(status(1).path).version == "v2"  # type: ignore[union-attr]
    table.drop(status(1).path)
    assert reader.status(status(1).path) is None


def test_statuses_not_reusable_are_never_published() -> None:
    table = published()
    kept = KeptStatuses(published=table)
    kept.put(status(1, valid_for_ms=0), time.monotonic())  # a writable mount's: close-to-open
    kept.put(status(2), time.monotonic(), publish=False)  # an entry of a listing
    kept.put(status(3), time.monotonic())
    reader = mapped(table)
    assert reader.status(status(1).path) is None and reader.status(status(2).path) is None
    assert reader.status(status(3).path) is not None
    kept.put(status(3, valid_for_ms=0), time.monotonic())  # the master's answer stopped being reusable
    assert reader.status(status(3).path) is None
    kept.put(status(4), time.monotonic())
    kept.forget(status(4).path)  # the store holds another version
    assert reader.status(status(4).path) is None


def test_a_full_table_is_retired_and_readers_move_to_a_new_one() -> None:
    table = published(MIN_TABLE_BYTES * 4)
    reader = mapped(table)
    until = time.monotonic() + 60
    for i in range(2000):
        table.publish(status(i), until)
    assert reader.retired and table.generation > 1
    newer = mapped(table)
    assert not newer.retired and newer.generation == table.generation
    assert newer.status(status(1999).path) is not None  # the newest went into the new table


def test_a_damaged_table_gives_misses_never_a_wrong_status() -> None:
    table = published(64 << 10)
    until = time.monotonic() + 60
    infos = [status(i) for i in range(150)]
    for info in infos:
        table.publish(info, until)
    fd = table.descriptor()
    assert fd is not None
    size = os.fstat(fd).st_size
    pristine = os.pread(fd, size, 0)
    os.close(fd)
    rng = random.Random(7)
    for trial in range(300):
        damaged = bytearray(pristine)
        for _ in range(1 + trial % 4):
            at = rng.randrange(size)
            damaged[at] ^= 1 << rng.randrange(8)
        copy = mmap.mmap(-1, size)
        copy[:] = bytes(damaged)
        try:
            view = TableView(copy)
        except TableError:
            continue  # a damaged header: no table at all
        for info in infos:
            found = view.find(info.path.encode())
            if found is not None:
                assert found[0] == until and pb.FileInfo.FromString(found[2]) == info
    for cut in (0, 100, MIN_TABLE_BYTES - 1, size // 2):
        short = mmap.mmap(-1, max(cut, 1))
        short[:] = pristine[:max(cut, 1)]
        with pytest.raises(TableError):
            TableView(short)


def test_garbage_is_no_table() -> None:
    garbage = mmap.mmap(-1, MIN_TABLE_BYTES * 2)
    garbage[:] = os.urandom(MIN_TABLE_BYTES * 2)
    with pytest.raises(TableError):
        TableView(garbage)
