"""The node's data table: the small files' bytes a worker publishes and what a reader of a
mapping gets, including from a table whose bytes are damaged or cut short (never a wrong byte)."""

from __future__ import annotations

import mmap
import os
import random
import time

import pytest
from sealing import assert_no_reader_can_write

from strata.contract.proto import strata_pb2 as pb
from strata.cacheserver.client.nodetable import NodeTable
from strata.cacheserver.common import datatable
from strata.cacheserver.common.checksums import compute_checksums
from strata.cacheserver.common.statustable import TableError, TableView
from strata.cacheserver.worker.kept import KeptStatuses
from strata.cacheserver.worker.published import PublishedStatuses
from strata.cacheserver.worker.settings import DataTableSettings, StatusTableSettings

CHUNK = 4096  # small chunks: a file of several


def status(i: int, length: int, *, valid_for_ms: int = 60_000, version: str = "v1") -> pb.FileInfo:
    return pb.FileInfo(path=f"/ds/train/s-{i}.bin", name=f"s-{i}.bin", length=length, version=version, mount_id=3,
                       read_only=True, persisted=True, valid_for_ms=valid_for_ms, block_size=1 << 20)


def published(data_bytes: int = 4 << 20) -> PublishedStatuses:
    return PublishedStatuses(StatusTableSettings(bytes=1 << 20), DataTableSettings(bytes=data_bytes))


def put(table: PublishedStatuses, info: pb.FileInfo, data: bytes, checksums: tuple[int, ...] | None = None) -> None:
    table.publish(info, time.monotonic() + 60)
    table.publish_file(info, lambda: data, checksums or compute_checksums(data, CHUNK), CHUNK)


def mapped(table: PublishedStatuses) -> NodeTable:
    fd, data_fd = table.descriptor(), table.files.descriptor()
    assert fd is not None and data_fd is not None
    try:
        return NodeTable(fd, data_fd)
    finally:
        os.close(fd)
        os.close(data_fd)


def test_a_reader_gets_the_bytes_of_the_version_a_status_names_only() -> None:
    table = published()
    data = os.urandom(10_000)
    info = status(1, len(data))
    put(table, info, data)
    reader = mapped(table)
    found = reader.status(info.path)
    assert found is not None and reader.file_bytes(found) == data
    for other in (status(1, len(data), version="v2"), status(1, len(data) - 1),
                  pb.FileInfo(path=info.path, length=len(data), version="v1", mount_id=4),
                  status(2, len(data))):
        assert reader.file_bytes(other) is None
    newer = os.urandom(10_000)
    put(table, status(1, len(newer), version="v2"), newer)  # a new version replaces it
    assert reader.file_bytes(status(1, len(newer), version="v2")) == newer
    assert reader.file_bytes(info) is None


def test_what_is_not_published() -> None:
    table = published(1 << 20)  # a file of more than 1/16 of it is not published
    kept = KeptStatuses(published=table)
    data = os.urandom(5000)
    writable = status(1, len(data), valid_for_ms=0)  # a writable mount's file: close-to-open
    put(table, writable, data)
    large = os.urandom((1 << 20) // 16 + 1)
    put(table, status(2, len(large)), large)
    bad = status(3, len(data))
    put(table, bad, data, checksums=tuple(c ^ 1 for c in compute_checksums(data, CHUNK)))  # fails its check
    read_again = status(4, len(data))
    put(table, read_again, data)
    reader = mapped(table)
    assert [reader.file_bytes(i) for i in (writable, status(2, len(large)), bad)] == [None] * 3
    assert reader.file_bytes(read_again) == data
    calls: list[int] = []
    table.publish_file(read_again, lambda: calls.append(1) or data, compute_checksums(data, CHUNK), CHUNK)
    assert not calls, "published already: the block is not read again"
    kept.put(read_again, time.monotonic())
    kept.forget(read_again.path)  # the store holds another version: its bytes go too
    assert reader.file_bytes(read_again) is None


def test_a_full_table_is_retired_and_memory_stays_bounded() -> None:
    size = 1 << 20
    table = published(size)
    reader = mapped(table)
    files = {i: os.urandom(30_000) for i in range(100)}  # ~3 MiB into a 1 MiB table
    for i, data in files.items():
        put(table, status(i, len(data)), data)
    assert reader.retired and table.files.generation >= 3
    fd = table.files.descriptor()
    assert fd is not None
    assert os.fstat(fd).st_size == size  # one table of its size; the retired ones are unmapped
    os.close(fd)
    newer = mapped(table)
    assert not newer.retired
    assert newer.file_bytes(status(99, 30_000)) == files[99]


def test_a_damaged_table_gives_misses_never_a_wrong_byte() -> None:
    table = published(256 << 10)
    rng = random.Random(11)
    files = [(status(i, 2000 + 997 * i), rng.randbytes(2000 + 997 * i)) for i in range(12)]
    for info, data in files:
        put(table, info, data)
    fd = table.files.descriptor()
    assert fd is not None
    size = os.fstat(fd).st_size
    pristine = os.pread(fd, size, 0)
    os.close(fd)
    used = len(pristine.rstrip(b"\0"))  # flips in what was written
    hits = 0
    for trial in range(400):
        damaged = bytearray(pristine)
        for _ in range(1 + trial % 3):
            damaged[rng.randrange(used)] ^= 1 << rng.randrange(8)
        copy = mmap.mmap(-1, size)
        copy[:] = bytes(damaged)
        try:
            view = TableView(copy, datatable.MAGIC)
        except TableError:
            continue  # a damaged header: no table at all
        for info, data in files:
            got = datatable.file_bytes(view, info.path, info.mount_id, info.version, info.length)
            assert got is None or got == data
            hits += got is not None
    assert hits  # most damage leaves most files readable
    for cut in (1, 100, size // 3, size - 8):
        short = mmap.mmap(-1, cut)
        short[:] = pristine[:cut]
        try:
            view = TableView(short, datatable.MAGIC)
        except TableError:
            continue
        for info, _ in files:
            assert datatable.file_bytes(view, info.path, info.mount_id, info.version, info.length) is None


def test_a_status_table_is_no_data_table() -> None:
    table = published()
    fd = table.descriptor()
    assert fd is not None
    try:
        with pytest.raises(TableError):
            TableView(mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ), datatable.MAGIC)
    finally:
        os.close(fd)


def test_no_reader_can_write_the_data_table() -> None:
    table = published()
    data = os.urandom(5000)
    put(table, status(1, len(data)), data)
    fd = table.files.descriptor()
    assert fd is not None
    try:
        assert_no_reader_can_write(fd)
    finally:
        os.close(fd)
    assert mapped(table).file_bytes(status(1, len(data))) == data
