from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import random
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import flaky
from tinydisk import tiny_disk
import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from s3fs import S3FileSystem

from strata.cacheserver.master.messages import mount_to_proto
from strata.cacheserver.namespace.mounts import MountTable
from strata.cacheserver.namespace.permissions import check_writable
from strata.cacheserver.namespace.tree import Namespace
from strata.cacheserver.settings import RetrySettings, StoreTimeouts
from strata.contract.constants import UPLOAD_DIR
from strata.cacheserver.ufs import Store, VersionChanged, check_source_allowed, storage_options
from strata.cacheserver.ufs.generic import FsspecStore
from strata.cacheserver.ufs.local import LocalStore
from strata.cacheserver.ufs import s3 as s3_module
from strata.cacheserver.ufs.s3 import S3Store
from strata.contract.errors import (
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    StrataError,
    Unavailable,
)

FAST_RETRY = RetrySettings(attempts=5, base_delay=0.001, max_delay=0.01)

# -- every kind of store honours the same contract --------------------------------------------
# Each backend passes these: the generic fsspec one (over memory://), file:// and S3.

BACKENDS = {"memory": FsspecStore, "file": LocalStore, "s3": S3Store}


class Backend:
    """A store under test and a way to change its files behind the Store's back."""

    def __init__(self, store: Store, put_outside: Callable[[str, bytes], None]) -> None:
        self.store = store
        self.put_outside = put_outside


@pytest.fixture(params=["memory", "file", "s3"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "memory":
        root = f"/t-{uuid.uuid4().hex}"
        fs = fsspec.filesystem("memory")
        fs.makedirs(root, exist_ok=True)
        result = Backend(Store(f"memory://{root}"), lambda rel, data: fs.pipe_file(f"{root}/{rel}", data))
    elif request.param == "file":
        root_dir = tmp_path / "store"
        root_dir.mkdir()

        def put_file(rel: str, data: bytes) -> None:
            (root_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (root_dir / rel).write_bytes(data)

        result = Backend(Store(f"file://{root_dir}"), put_file)
    else:
        server = request.getfixturevalue("s3_server")
        bucket = request.getfixturevalue("bucket")
        result = Backend(
            Store(f"s3://{bucket}/prefix", server.storage_options()),
            lambda rel, data: server.put_object(bucket, f"prefix/{rel}", data),
        )
    assert type(result.store._backend) is BACKENDS[request.param]
    yield result
    await result.store.close()


async def test_write_then_info_describes_the_file(backend: Backend) -> None:
    before = time.time()
    written = await backend.store.write("dir/a.bin", b"0123456789")
    status = await backend.store.info("dir/a.bin")
    assert status == written
    assert (status.path, status.name, status.is_dir, status.length) == ("dir/a.bin", "a.bin", False, 10)
    assert status.version
    # Second-granular stores (S3) round the time down.
    assert before - 2 <= status.mtime_unix_ms / 1000 <= time.time() + 2


async def test_version_changes_when_the_content_changes(backend: Backend) -> None:
    first = await backend.store.write("f", b"one")
    backend.put_outside("f", b"second version")
    second = await backend.store.info("f")
    assert second.length == len(b"second version")
    assert second.version != first.version


async def test_ls_lists_direct_children_sorted(backend: Backend) -> None:
    backend.put_outside("b.txt", b"b")
    backend.put_outside("a/deep/x.txt", b"x")
    backend.put_outside("a/y.txt", b"yy")
    top = await backend.store.ls("")
    assert [(s.path, s.is_dir) for s in top] == [("a", True), ("b.txt", False)]
    inner = await backend.store.ls("a")
    assert [(s.path, s.name, s.is_dir, s.length) for s in inner] == [
        ("a/deep", "deep", True, 0),
        ("a/y.txt", "y.txt", False, 2),
    ]
    assert [s.path for s in await backend.store.ls("a/y.txt")] == ["a/y.txt"]


async def test_walk_finds_every_file_below(backend: Backend) -> None:
    for rel in ("a/1", "a/b/2", "a/b/c/3", "z"):
        backend.put_outside(rel, rel.encode())
    assert [s.path for s in await backend.store.walk("a")] == ["a/1", "a/b/2", "a/b/c/3"]
    assert [s.path for s in await backend.store.walk("")] == ["a/1", "a/b/2", "a/b/c/3", "z"]
    with_dirs = await backend.store.walk("", with_dirs=True)
    assert [(s.path, s.is_dir) for s in with_dirs] == [
        ("a", True), ("a/1", False), ("a/b", True), ("a/b/2", False), ("a/b/c", True),
        ("a/b/c/3", False), ("z", False),
    ]
    assert [s.path for s in await backend.store.walk("z")] == ["z"]


async def test_a_walk_comes_in_pages_of_the_size_asked_in_path_order(backend: Backend) -> None:
    # "-" and "." sort before "/": "a-b/y" and "a.txt" come before "a/b/z", and after the folder "a".
    for rel in ("a.txt", "a/x", "a-b/y", "a/b/z", "a0", "b"):
        backend.put_outside(rel, rel.encode())
    pages = [page async for page in backend.store.walk_pages("", with_dirs=True, page=2)]
    assert all(0 < len(page) <= 2 for page in pages), [len(page) for page in pages]
    walked = [(s.path, s.is_dir) for page in pages for s in page]
    in_order = [("a", True), ("a-b", True), ("a-b/y", False), ("a.txt", False), ("a/b", True), ("a/b/z", False),
                ("a/x", False), ("a0", False), ("b", False)]
    assert walked == in_order  # on S3 too, where a folder is known only with the first key below it
    assert [s.path async for page in backend.store.walk_pages("a", page=1) for s in page] == ["a/b/z", "a/x"]
    assert [s.path async for page in backend.store.walk_pages("a.txt") for s in page] == ["a.txt"]
    with pytest.raises(InvalidArgument, match="at least one status, got 0"):
        [page async for page in backend.store.walk_pages("", page=0)]


async def test_a_walk_of_names_that_sort_around_the_slash_comes_in_path_order(backend: Backend,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Names with characters before and after "/" ("a-b", "a.c", "a0") beside folders of the
    same stem, at several depths: every store gives exactly path order (a listing streams the
    walk as it comes, so a late folder would be a wrong listing)."""
    rng = random.Random(27)
    stems = ["a", "a-b", "a.c", "a0", "b", "b b"]
    rels = {"/".join(rng.choice(stems) for _ in range(rng.randint(1, 3))) + rng.choice(["", ".x", "-y"])
            for _ in range(40)}
    rels = {rel for rel in rels if not any(other.startswith(rel + "/") for other in rels)}  # a file is no folder
    for rel in sorted(rels):
        backend.put_outside(rel, b"x")
    folders = {rel.rsplit("/", i)[0] for rel in rels for i in range(1, rel.count("/") + 1)}
    walked = [(s.path, s.is_dir) async for page in backend.store.walk_pages("", with_dirs=True, page=3) for s in page]
    assert walked == sorted([(rel, False) for rel in rels] + [(folder, True) for folder in folders])
    if type(backend.store._backend) is S3Store:  # past the most it holds back: everything still, once
        monkeypatch.setattr(s3_module, "_S3_WALK_HELD", 2)
        held_less = [(s.path, s.is_dir) async for page in backend.store.walk_pages("", with_dirs=True) for s in page]
        assert held_less != walked and sorted(held_less) == walked


async def test_a_file_walk_holds_a_folder_and_a_page_not_the_tree(tmp_path: Path) -> None:
    """A walk of millions of files is taken page by page: the store holds the folder it is
    in and the page being made, never the tree's statuses."""
    for folder in range(10):  # as statuses ~3 MiB, with the infos a store answers them from ~9
        (tmp_path / f"d{folder}").mkdir()
        for i in range(1000):
            os.close(os.open(tmp_path / f"d{folder}" / f"f{i:03d}.bin", os.O_CREAT | os.O_WRONLY, 0o644))
    async with Store(f"file://{tmp_path}") as store:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            walked = 0
            async for page in store.walk_pages("", page=1000):
                walked += len(page)
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
    assert walked == 10_000
    assert peak < 1.5 * 2**20, f"{peak / 2**20:.2f} MiB at the walk's peak"


async def test_a_file_walk_left_after_its_first_page_keeps_no_folder_open(tmp_path: Path) -> None:
    for folder in ("a", "a/b", "a/b/c"):
        (tmp_path / folder).mkdir()
        for i in range(3):
            (tmp_path / folder / f"f{i}").touch()
    async with Store(f"file://{tmp_path}") as store:
        before = len(os.listdir("/proc/self/fd"))
        pages = store.walk_pages("", page=2)
        assert [s.path for s in await anext(pages)] == ["a/b/c/f0", "a/b/c/f1"]  # three folders open down there
        await pages.aclose()
        assert len(os.listdir("/proc/self/fd")) == before
        assert [s.path async for page in store.walk_pages("a/b", page=2) for s in page] == [
            "a/b/c/f0", "a/b/c/f1", "a/b/c/f2", "a/b/f0", "a/b/f1", "a/b/f2"]


async def test_totals_count_the_files_and_bytes_below_a_folder_without_uploads(backend: Backend) -> None:
    for rel, size in (("a/1", 1), ("a/b/2", 20), ("a/b/c/3", 300), ("z", 4000),
                      (f"{UPLOAD_DIR}/pending", 50000), ("a/.strata-upload-1.tmp", 7)):
        backend.put_outside(rel, b"x" * size)
    totals = await backend.store.totals()
    assert (totals.files, totals.total_bytes) == (4, 4321)
    below = await backend.store.totals("a/b")
    assert (below.files, below.total_bytes) == (2, 320)


async def test_read_range_returns_exactly_the_bytes_asked_for(backend: Backend) -> None:
    backend.put_outside("data", bytes(range(100)))
    store = backend.store
    assert await store.read_range("data", 10, 20) == bytes(range(10, 20))
    assert await store.read_range("data", 0, 1) == b"\x00"
    assert await store.read_range("data", 95, 200) == bytes(range(95, 100))
    assert await store.read_range("data", 40, 40) == b""
    assert await store.read_range("data", 100, 150) == b""
    assert await store.read_range("data", 150, 160) == b""
    with pytest.raises(InvalidArgument, match=r"bad range \[20, 10\)"):
        await store.read_range("data", 20, 10)


async def test_a_read_of_a_version_gets_its_bytes_or_fails_if_the_file_changed(backend: Backend) -> None:
    old = bytes(range(100))
    backend.put_outside("data", old)
    store = backend.store
    version = (await store.info("data")).version
    assert await store.read_range("data", 10, 20, version=version) == old[10:20]
    assert await store.read_range("data", 100, 150, version=version) == b""
    time.sleep(0.01)  # a later mtime on file systems with coarse clocks
    new = bytes(reversed(old))  # same length: only the version tells them apart
    backend.put_outside("data", new)
    with pytest.raises(FailedPrecondition, match=r"data changed in the store.*open it again") as raised:
        await store.read_range("data", 10, 20, version=version)
    assert version in str(raised.value)
    current = (await store.info("data")).version
    assert current != version
    assert await store.read_range("data", 10, 20, version=current) == new[10:20]


async def test_a_read_of_a_version_of_a_missing_file_is_not_found(backend: Backend) -> None:
    with pytest.raises(NotFound):
        await backend.store.read_range("gone", 0, 10, version="1-2")


async def test_a_local_file_rewritten_in_place_during_a_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is rewritten (same length, same inode) between the first look at its version
    and the read: os.pread is wrapped to do that, the file system is real."""
    target = tmp_path / "f"
    target.write_bytes(b"a" * 100)
    store = Store(f"file://{tmp_path}")
    version = (await store.info("f")).version
    real_pread = os.pread

    def pread_then_rewrite(fd: int, length: int, offset: int) -> bytes:
        data = real_pread(fd, length, offset)
        with open(target, "r+b") as out:
            out.write(b"b" * 100)
        os.utime(target, ns=(time.time_ns(), time.time_ns() + 1_000_000))
        return data

    monkeypatch.setattr(os, "pread", pread_then_rewrite)
    with pytest.raises(VersionChanged, match="changed in the store"):
        await store.read_range("f", 0, 50, version=version)


async def test_an_exact_read_of_a_local_file_cut_during_the_read_is_read_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer truncates the file and writes it back with its old length and mtime (an
    in-place rewrite that keeps the times, as `rsync --inplace -t` does) while it is read: the
    read saw the file cut, and both looks at its version agree. os.pread is wrapped to make
    the rewrite happen at that moment; the file system is real."""
    target = tmp_path / "f"
    content = bytes(range(100))
    target.write_bytes(content)
    store = Store(f"file://{tmp_path}", retry=FAST_RETRY)
    version = (await store.info("f")).version
    stat = target.stat()
    real_pread = os.pread
    reads: list[int] = []

    def pread_while_rewritten(fd: int, length: int, offset: int) -> bytes:
        reads.append(offset)
        if len(reads) == 1:
            os.truncate(target, 30)
        data = real_pread(fd, length, offset)
        if len(reads) == 2:  # the read found the (cut) file's end
            with open(target, "r+b") as out:
                out.seek(30)
                out.write(content[30:])
            os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        return data

    monkeypatch.setattr(os, "pread", pread_while_rewritten)
    assert await store.read_range("f", 10, 90, version=version, exact=True) == content[10:90]
    assert reads == [10, 30, 10]  # to the cut file's end, then all of it again


async def test_a_local_file_read_in_pieces_is_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read of a file may return fewer bytes than asked before its end: network and FUSE
    file systems may, and Linux returns at most 2 GiB - 4 KiB per call (a block that size
    or larger). os.pread is wrapped to answer 16 bytes a call; the file system is real."""
    content = bytes(range(100))
    (tmp_path / "f").write_bytes(content)
    store = Store(f"file://{tmp_path}", retry=FAST_RETRY)
    version = (await store.info("f")).version
    real_pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, length, offset: real_pread(fd, min(length, 16), offset))
    assert await store.read_range("f", 10, 90, version=version, exact=True) == content[10:90]
    assert await store.read_range("f", 90, 200, version=version) == content[90:]


async def test_an_exact_read_past_the_end_of_a_file_is_data_loss(backend: Backend) -> None:
    backend.put_outside("data", bytes(range(100)))
    store = backend.store
    version = (await store.info("data")).version
    assert await store.read_range("data", 90, 100, version=version, exact=True) == bytes(range(90, 100))
    with pytest.raises(DataLoss, match=r"bytes 90-109 of .*data .*with 10 bytes, not 20"):
        await store.read_range("data", 90, 110, version=version, exact=True)
    assert await store.read_range("data", 90, 110) == bytes(range(90, 100))  # not exact: what there is


async def test_a_store_without_conditional_reads_checks_the_version_after_the_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """memory:// has no conditional read: the object is replaced while it is read (its
    cat_file is wrapped to do that), and the status after the read gives it away."""
    root = f"/t-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"{root}/f", b"a" * 100)
    store = Store(f"memory://{root}")
    version = (await store.info("f")).version
    real_cat = MemoryFileSystem.cat_file

    def cat_then_replace(self: MemoryFileSystem, path: str, start: int | None = None, end: int | None = None,
                         **kwargs: Any) -> bytes:
        data: bytes = real_cat(self, path, start=start, end=end, **kwargs)
        time.sleep(0.01)
        fs.pipe_file(f"{root}/f", b"b" * 100)
        return data

    monkeypatch.setattr(MemoryFileSystem, "cat_file", cat_then_replace)
    with pytest.raises(VersionChanged, match="changed in the store"):
        await store.read_range("f", 0, 50, version=version)


async def test_missing_paths_raise_not_found_with_the_url(backend: Backend) -> None:
    url = backend.store.url("no/such/file")
    for call in (
        backend.store.info("no/such/file"),
        backend.store.read_range("no/such/file", 0, 10),
        backend.store.ls("no/such/file"),
        backend.store.walk("no/such/file"),
    ):
        with pytest.raises(NotFound, match=f"{url} does not exist"):
            await call


async def test_rm_mv_mkdir_and_upload(backend: Backend, tmp_path: Path) -> None:
    store = backend.store
    await store.write("a/1", b"1")
    await store.write("a/sub/2", b"22")
    await store.mv("a/1", "moved/1")
    assert await store.read_range("moved/1", 0, 10) == b"1"
    with pytest.raises(NotFound):
        await store.info("a/1")
    await store.mv("a", "b")
    assert [s.path for s in await store.walk("b")] == ["b/sub/2"]
    await store.rm("moved/1")
    with pytest.raises(NotFound):
        await store.info("moved/1")
    await store.rm("b", recursive=True)
    assert await store.walk("") == []

    staged = tmp_path / "staged"
    staged.write_bytes(b"staged bytes")
    uploaded = await store.write_file("up/file", staged)
    assert uploaded.length == 12
    assert await store.read_range("up/file", 0, 100) == b"staged bytes"

    await store.mkdir("newdir/inner")  # object stores have no directories: no error, no effect
    if store.protocol != "s3":
        assert (await store.info("newdir/inner")).is_dir


async def test_copy_makes_a_second_file_in_the_store(backend: Backend) -> None:
    store = backend.store
    await store.write("src/a", b"bytes to copy")
    copied = await store.copy("src/a", "dst/a")
    assert copied.path == "dst/a" and copied.length == len(b"bytes to copy")
    assert await store.read_range("dst/a", 0, 100) == b"bytes to copy"
    assert await store.read_range("src/a", 0, 100) == b"bytes to copy"
    with pytest.raises(NotFound):
        await store.copy("src/missing", "dst/b")


async def test_a_file_put_into_the_store_comes_back_with_the_version_of_what_was_put(
        backend: Backend, tmp_path: Path) -> None:
    # The version a write commits must name its own bytes: taken from the store's answer to
    # the upload, copy or move, it stays ours when another writer replaces the file next.
    store = backend.store
    staged = tmp_path / "staged"
    staged.write_bytes(b"ours")
    uploaded = await store.write_file("up/file", staged)
    found = await store.info("up/file")
    assert (uploaded.path, uploaded.version, uploaded.length) == ("up/file", found.version, 4)
    copied = await store.copy("up/file", "copy/file")
    assert copied.version == (await store.info("copy/file")).version and copied.length == 4
    moved = await store.move_file("copy/file", "moved/file")
    assert moved.version == (await store.info("moved/file")).version and moved.length == 4
    with pytest.raises(NotFound):
        await store.info("copy/file")
    with pytest.raises(NotFound):
        await store.move_file("copy/file", "moved/again")

    backend.put_outside("up/file", b"theirs, written right after")
    assert (await store.info("up/file")).version != uploaded.version
    if store.protocol != "memory":  # a store whose answers carry no version is looked at after
        staged.write_bytes(b"ours again")
        again = await store.write_file("up/file", staged)
        backend.put_outside("up/file", b"theirs again")
        assert again.version != (await store.info("up/file")).version
    assert [s.path for s in await store.walk("")] == ["moved/file", "up/file"]


async def test_a_large_upload_to_s3_is_multipart_and_answers_with_its_etag(
        s3_server: Any, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("strata.cacheserver.ufs.s3.calculate_chunksize", lambda size: 5 * 2**20)  # S3's least
    data = os.urandom(12 * 2**20)
    staged = tmp_path / "large"
    staged.write_bytes(data)
    store = Store(f"s3://{bucket}", s3_server.storage_options())
    try:
        uploaded = await store.write_file("large", staged)
        assert uploaded.version.endswith("-3")  # three parts
        assert uploaded.version == (await store.info("large")).version and uploaded.length == len(data)
        assert s3_server.get_object(bucket, "large") == data
    finally:
        await store.close()


async def test_a_file_store_that_fills_up_keeps_the_file_it_had(tmp_path: Path) -> None:
    # A file:// upload is written aside and renamed into place: a full disk (or a killed
    # worker) never leaves a cut file where the old one was.
    with tiny_disk("1m") as root:
        store = Store(f"file://{root}", retry=FAST_RETRY)
        old = await store.write("f.bin", b"the old bytes")
        staged = tmp_path / "staged"
        staged.write_bytes(os.urandom(2 * 2**20))
        with pytest.raises(OSError) as failed:
            await store.write_file("f.bin", staged)
        assert failed.value.errno == errno.ENOSPC
        assert await store.info("f.bin") == old
        assert await store.read_range("f.bin", 0, 100, version=old.version) == b"the old bytes"
        assert [s.path for s in await store.walk("")] == ["f.bin"]
        assert os.listdir(root / ".strata-uploads") == []


async def test_only_uploads_whose_process_ended_are_cleaned_from_a_file_stores_upload_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker killed while it wrote an upload left its temporary file there for ever. Those
    # no process holds, unchanged for the age given, go; an upload under way (however old
    # its file looks) and anything else in the folder stay.
    store = Store(f"file://{tmp_path}", retry=FAST_RETRY)
    uploads = tmp_path / ".strata-uploads"
    uploads.mkdir()
    hour_ago = time.time() - 3600
    dead, fresh = uploads / ".0123abcd.tmp", uploads / ".4567ef01.tmp"
    for path in (dead, fresh, uploads / "w-0123"):
        path.write_bytes(b"part of an upload")
    os.utime(dead, (hour_ago, hour_ago))
    os.utime(uploads / "w-0123", (hour_ago, hour_ago))

    # An upload under way: its writer holds its file (made to look an hour old).
    started, finish = threading.Event(), threading.Event()

    def slow_fill(out: Any) -> None:
        out.write(b"the first bytes")
        out.flush()
        started.set()
        assert finish.wait(10)
        out.write(b", the rest")

    monkeypatch.setattr("strata.cacheserver.ufs.local._copy_into", lambda out, source, progress: slow_fill(out))
    staged = tmp_path / "staged"
    staged.write_bytes(b"")
    writing = asyncio.ensure_future(store.write_file("f.bin", staged))
    assert await asyncio.to_thread(started.wait, 10)
    [under_way] = set(uploads.glob(".*.tmp")) - {dead, fresh}
    os.utime(under_way, (hour_ago, hour_ago))

    assert await store.remove_dead_uploads(older_than=1800) == 1
    assert sorted(p.name for p in uploads.iterdir()) == sorted([fresh.name, under_way.name, "w-0123"])
    finish.set()
    await writing
    assert (tmp_path / "f.bin").read_bytes() == b"the first bytes, the rest"
    assert await Store("memory://x").remove_dead_uploads(older_than=0) == 0


HANGING_UPLOAD = """
import asyncio, sys, time
from pathlib import Path
from strata.cacheserver import ufs
from strata.cacheserver.ufs import local

def hang(out, source, progress):
    out.write(b"the first bytes")
    out.flush()
    print("writing", flush=True)
    time.sleep(600)

local._copy_into = hang
asyncio.run(ufs.Store("file://" + sys.argv[1]).write_file(sys.argv[2], Path(sys.argv[3])))
"""


async def test_an_upload_into_another_file_system_than_the_upload_folder_is_hidden_and_cleaned(
        tmp_path: Path) -> None:
    # The destination's folder is on another file system than the store's upload folder: the
    # upload's temporary file is written there (a rename cannot cross file systems). A
    # worker killed meanwhile left it there for ever, a file of the store to its listings.
    root = tmp_path / "root"
    root.mkdir()
    staged = tmp_path / "staged"
    staged.write_bytes(b"")
    with tiny_disk("4m", within=root) as disk:
        folder = disk.name
        store = Store(f"file://{root}", retry=FAST_RETRY)
        table = MountTable(None)
        table.add("/m", f"file://{root}")
        namespace = Namespace(table, None, block_size=4096)
        writer = subprocess.Popen([sys.executable, "-P", "-c", HANGING_UPLOAD, str(root), f"{folder}/f.bin", str(staged)],
                                  stdout=subprocess.PIPE, start_new_session=True)
        try:
            assert writer.stdout is not None and writer.stdout.readline() == b"writing\n"
            [temp] = [p for p in disk.iterdir()]
            # While it is written, no listing or status shows it, and no client may write it.
            assert [e.path for e in await namespace.list_status("/m", recursive=True)] == [f"/m/{folder}"]
            assert await namespace.list_status(f"/m/{folder}") == []
            with pytest.raises(NotFound):
                await namespace.get_status(f"/m/{folder}/{temp.name}")
            with pytest.raises(PermissionDenied, match="temporary files"):
                check_writable(f"/m/{folder}/{temp.name}", f"{folder}/{temp.name}", mount_path="/m", read_only=False,
                               action="write")
            assert await store.remove_dead_uploads(older_than=0) == 0  # under way: its writer holds it
        finally:
            os.killpg(writer.pid, signal.SIGKILL)
            writer.wait()
        assert temp.exists()
        assert await store.remove_dead_uploads(older_than=1800) == 0  # not old enough yet
        hour_ago = time.time() - 3601
        os.utime(temp, (hour_ago, hour_ago))
        assert await store.remove_dead_uploads(older_than=1800) == 1
        assert list(disk.iterdir()) == [] and list((root / ".strata-uploads").iterdir()) == []
        # A finished upload leaves nothing behind either.
        assert (await store.write(f"{folder}/g.bin", b"g bytes")).length == 7
        assert [p.name for p in disk.iterdir()] == ["g.bin"] and list((root / ".strata-uploads").iterdir()) == []
        await store.close()


async def test_a_source_urls_user_info_shows_in_no_message(tmp_path: Path) -> None:
    # A source may carry `user:password@` (HTTP, FTP, SFTP stores): no error, listing or log
    # line names it. Nothing listens on port 9 of this host: the store cannot be reached.
    source = "http://alice:pa55word-in-url@127.0.0.1:9/data"
    store = Store(source, retry=FAST_RETRY)
    assert "pa55word" not in repr(store) and "pa55word" not in store.url("x")
    with pytest.raises(StrataError) as failed:
        await store.info("x")
    assert "pa55word" not in str(failed.value) and "alice" not in str(failed.value), failed.value
    assert "http://***@127.0.0.1:9/data" in str(failed.value)
    await store.close()
    table = MountTable(None)
    table.add("/h", source)
    with pytest.raises(StrataError) as again:
        table.add("/h", source)
    assert "pa55word" not in str(again.value) and "http://***@127.0.0.1:9/data" in str(again.value)
    [mount] = table.list()
    assert mount_to_proto(mount, with_credentials=False, pinned=[]).source == "http://***@127.0.0.1:9/data"
    assert mount_to_proto(mount, with_credentials=True, pinned=[]).source == source  # workers reach the store
    with pytest.raises(StrataError) as refused:
        check_source_allowed("file://bob:s3cret@/data", ["/nowhere"])
    assert "s3cret" not in str(refused.value)


async def test_paths_cannot_climb_out_of_the_root(backend: Backend) -> None:
    with pytest.raises(InvalidArgument, match="'..'"):
        await backend.store.info("a/../../etc/passwd")


async def test_check_accepts_a_listable_root(backend: Backend) -> None:
    await backend.store.check()


# -- sources and options ---------------------------------------------------------------------------


def test_unknown_scheme_names_it_and_lists_supported_ones() -> None:
    with pytest.raises(InvalidArgument) as raised:
        Store("nosuchfs://bucket/x")
    message = str(raised.value)
    assert "unknown store scheme 'nosuchfs'" in message
    for known in ("s3", "file", "memory"):
        assert f" {known}," in message or message.endswith(f" {known}")


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("/data/x", "has no scheme"),
        ("bucket/x", "has no scheme"),
        ("simplecache::s3://bucket/x", "chains filesystems"),
        ("strata:///datasets/a", "cannot be mounted into Strata"),
        ("file://relative/dir", "needs an absolute path"),
    ],
)
def test_bad_sources_are_refused(source: str, expected: str) -> None:
    with pytest.raises(InvalidArgument, match=expected):
        Store(source)


def test_string_options_become_the_types_the_backend_needs() -> None:
    options = storage_options(
        S3FileSystem,
        {"anon": "true", "use_ssl": "false", "region": "eu-west-1", "endpoint_url": "http://x:1", "max_concurrency": "4"},
    )
    assert options == {
        "anon": True,
        "use_ssl": False,
        "endpoint_url": "http://x:1",
        "max_concurrency": 4,
        "client_kwargs": {"region_name": "eu-west-1"},
    }


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"anon": "maybe"}, "store option anon: expected true or false, got 'maybe'"),
        ({"max_concurrency": "many"}, "store option max_concurrency: expected a number"),
        ({"bogus": "1"}, "store option 'bogus' is not an S3 option; use one of: region, "),
        ({"asynchronous": "false"}, "store option asynchronous is managed by Strata"),
    ],
)
def test_bad_options_are_refused(options: dict[str, str], expected: str) -> None:
    with pytest.raises(InvalidArgument, match=expected):
        Store("s3://bucket/x", options)


def test_credentials_never_show_in_repr() -> None:
    store = Store("s3://bucket/x", {"key": "AKIAVISIBLE", "secret": "very-secret-value"})
    assert "very-secret-value" not in repr(store) and "AKIAVISIBLE" not in repr(store)


# -- retries, through a wrapper store that fails on purpose -----------------------------------------


class FlakyMemoryFileSystem(MemoryFileSystem):
    """memory:// whose `info` fails with `error` for the next `failures` calls."""

    protocol = "flakymem"
    failures = 0
    error: Exception = ConnectionError("connection reset by peer")
    info_calls = 0

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return str(MemoryFileSystem._strip_protocol(path.removeprefix("flakymem://")))

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        type(self).info_calls += 1
        if type(self).failures > 0:
            type(self).failures -= 1
            raise type(self).error
        return dict(super().info(path, **kwargs))


@pytest.fixture
def flakymem() -> type[FlakyMemoryFileSystem]:
    fsspec.register_implementation("flakymem", FlakyMemoryFileSystem, clobber=True)
    FlakyMemoryFileSystem.info_calls = 0
    FlakyMemoryFileSystem.failures = 0
    return FlakyMemoryFileSystem


async def test_transient_errors_are_retried(flakymem: type[FlakyMemoryFileSystem]) -> None:
    fsspec.filesystem("memory").pipe_file("/flaky/f", b"abc")
    store = Store("flakymem:///flaky", retry=FAST_RETRY)
    flakymem.failures = 3
    assert (await store.info("f")).length == 3
    assert flakymem.info_calls == 4


async def test_a_store_that_stays_down_gives_unavailable(flakymem: type[FlakyMemoryFileSystem]) -> None:
    store = Store("flakymem:///flaky", retry=FAST_RETRY)
    flakymem.failures = 100
    with pytest.raises(Unavailable, match="could not be reached"):
        await store.info("f")
    assert flakymem.info_calls == 5


async def test_not_found_and_permission_errors_are_not_retried(flakymem: type[FlakyMemoryFileSystem]) -> None:
    store = Store("flakymem:///flaky", retry=FAST_RETRY)
    with pytest.raises(NotFound):
        await store.info("missing")
    assert flakymem.info_calls == 1
    flakymem.failures, flakymem.error = 100, PermissionError("no")
    with pytest.raises(PermissionDenied):
        await store.info("missing")
    assert flakymem.info_calls == 2


# -- S3 against a real (moto) server -------------------------------------------------------------------


async def test_read_range_on_s3_is_one_ranged_get(s3_server: Any, bucket: str) -> None:
    s3_server.put_object(bucket, "big/object", bytes(range(256)) * 4096)  # 1 MiB
    async with Store(f"s3://{bucket}/big", s3_server.storage_options()) as store:
        await store.check()  # the session is open before counting
        with s3_server.recording() as seen:
            data = await store.read_range("object", 1000, 1000 + 65536)
    assert data == (bytes(range(256)) * 4096)[1000:1000 + 65536]
    assert [(r.method, r.path, r.range) for r in seen.requests] == [
        ("GET", f"/{bucket}/big/object", "bytes=1000-66535")
    ]


async def test_a_read_of_a_version_on_s3_is_one_conditional_get(s3_server: Any, bucket: str) -> None:
    s3_server.put_object(bucket, "big/object", bytes(range(256)) * 4096)
    async with Store(f"s3://{bucket}/big", s3_server.storage_options()) as store:
        version = (await store.info("object")).version
        with s3_server.recording() as seen:
            data = await store.read_range("object", 1000, 2000, version=version)
        assert data == (bytes(range(256)) * 4096)[1000:2000]
        assert [(r.method, r.range) for r in seen.requests] == [("GET", "bytes=1000-1999")]
        s3_server.put_object(bucket, "big/object", bytes(range(255, -1, -1)) * 4096)
        with s3_server.recording() as seen, pytest.raises(FailedPrecondition, match="changed in the store"):
            await store.read_range("object", 1000, 2000, version=version)
        assert len(seen.requests) == 1  # the store refused it (412): not retried, no second look


async def test_s3_times_are_read_without_dateutil_and_a_changed_object_is_still_refused(
        s3_server: Any, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # dateutil's parser took a tenth of the worker's CPU of a small GET: S3's two forms of a
    # time (a GET's Last-Modified header, a listing's ISO dates) are read without it, to the
    # same values, and the conditional GET refuses a replaced object as before.
    import dateutil.parser
    from botocore.utils import parse_timestamp

    from strata.cacheserver.ufs.s3 import s3_timestamp

    for text in ("Sun, 06 Dec 2026 16:02:34 GMT", "Mon, 1 Jan 2024 00:00:09 GMT", "2026-12-06T16:02:34.000Z",
                 "2026-12-06T16:02:34.123456Z", "2026-12-06T16:02:34+02:00", "1700000000"):
        assert s3_timestamp(text) == parse_timestamp(text), text
    s3_server.put_object(bucket, "ds/a", b"first")
    created = s3_server.client("s3").head_object(Bucket=bucket, Key="ds/a")["LastModified"]

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("dateutil parsed a time of an S3 answer")

    monkeypatch.setattr(dateutil.parser, "parse", refused)
    monkeypatch.setattr(dateutil.parser.parser, "parse", refused)
    async with Store(f"s3://{bucket}", s3_server.storage_options()) as store:
        listed = (await store.listed_from("ds", 10)).statuses
        assert [(s.path, s.mtime_unix_ms) for s in listed] == [("ds/a", int(created.timestamp() * 1000))]
        assert (await store.info("ds/a")).mtime_unix_ms == int(created.timestamp() * 1000)
        assert await store.read_range("ds/a", 0, 5, version=listed[0].version, exact=True) == b"first"
        s3_server.put_object(bucket, "ds/a", b"other")
        with pytest.raises(FailedPrecondition, match="changed in the store"):
            await store.read_range("ds/a", 0, 5, version=listed[0].version, exact=True)


async def test_a_page_of_an_s3_folder_starts_at_the_file_asked_for(s3_server: Any, bucket: str) -> None:
    # f10 sorts between f1 and f2: a start "just below f2" must not take f1x keys along.
    for name in ("f0", "f1", "f10", "f2", "f3", "sub/x", "sub/y", "zz/", "../../elsewhere"):
        s3_server.put_object(bucket, f"data/ds/{name}" if not name.startswith("..") else "outside", b"x" * 7)
    async with Store(f"s3://{bucket}/data", s3_server.storage_options()) as store:
        with s3_server.recording() as seen:
            page = await store.listed_from("ds", 3, start="ds/f2")
        assert len(seen.requests) == 1 and seen.requests[0].method == "GET"
        assert [s.path for s in page.statuses] == ["ds/f2", "ds/f3", "ds/sub"] and not page.reaches_end
        f2 = page.statuses[0]
        assert (f2.is_dir, f2.length, f2.version) == (False, 7, (await store.info("ds/f2")).version)
        assert page.statuses[2].is_dir
        whole = await store.listed_from("ds", 1000)
        assert [s.path for s in whole.statuses] == ["ds/f0", "ds/f1", "ds/f10", "ds/f2", "ds/f3", "ds/sub", "ds/zz"]
        assert whole.reaches_end
        assert [s.path for s in whole.statuses] == [s.path for s in await store.ls("ds")]
        with pytest.raises(InvalidArgument, match="not in it"):
            await store.listed_from("ds", 10, start="other/f2")
        with pytest.raises(InvalidArgument, match="1 to 1000"):
            await store.listed_from("ds", 1001)


async def test_stores_that_list_folders_whole_have_no_pages() -> None:
    async with Store("memory://pages-test") as store:
        assert await store.listed_from("", 10) is None


async def test_missing_object_is_asked_for_once(s3_server: Any, bucket: str) -> None:
    async with Store(f"s3://{bucket}", s3_server.storage_options(), retry=FAST_RETRY) as store:
        await store.check()
        with s3_server.recording() as seen:
            with pytest.raises(NotFound, match=f"s3://{bucket}/nothing does not exist"):
                await store.read_range("nothing", 0, 10)
    assert len(seen.requests) == 1


async def test_missing_bucket_is_not_found_naming_the_bucket(s3_server: Any) -> None:
    async with Store("s3://no-such-bucket-here/data", s3_server.storage_options()) as store:
        with pytest.raises(NotFound, match=r"bucket 'no-such-bucket-here' does not exist \(s3://no-such-bucket-here/data\)"):
            await store.check()
        with pytest.raises(NotFound, match="bucket 'no-such-bucket-here' does not exist"):
            await store.ls("")


async def test_an_empty_prefix_of_an_existing_bucket_checks_fine(s3_server: Any, bucket: str) -> None:
    async with Store(f"s3://{bucket}/nothing/yet", s3_server.storage_options()) as store:
        await store.check()


async def test_bad_credentials_are_refused(s3_auth_server: Any) -> None:
    bucket = f"sec-{uuid.uuid4().hex[:10]}"
    s3_auth_server.create_bucket(bucket)
    s3_auth_server.put_object(bucket, "f", b"secret data")
    key, secret = s3_auth_server.create_user(f"reader-{uuid.uuid4().hex[:6]}")
    no_policy_key, no_policy_secret = s3_auth_server.create_user(f"nobody-{uuid.uuid4().hex[:6]}", allow_s3=False)

    async with Store(f"s3://{bucket}", s3_auth_server.storage_options(key=key, secret=secret)) as good:
        await good.check()
        assert await good.read_range("f", 0, 6) == b"secret"

    refused = {
        "unknown key": ("AKIANOSUCHKEY0000000", "whatever-secret-1"),
        "wrong secret": (key, "wrong-secret-value-2"),
        "no permission": (no_policy_key, no_policy_secret),
    }
    for case, (k, s) in refused.items():
        options = s3_auth_server.storage_options(key=k, secret=s)
        async with Store(f"s3://{bucket}", options, retry=FAST_RETRY) as store:
            for call in (store.check(), store.info("f"), store.read_range("f", 0, 1)):
                with pytest.raises(PermissionDenied) as raised:
                    await call
                message = str(raised.value)
                assert f"store s3://{bucket} refused the credentials" in message, case
                assert "check the Mount's credentials Secret" in message
                assert s not in message


async def test_unreachable_endpoint_is_unavailable_after_retries(s3_server: Any) -> None:
    upstream = s3_server.endpoint_url.split("//", 1)[1]
    proxy = flaky.FlakyProxy(upstream, failures=1000, reply=None)  # drops every connection
    try:
        options = {**s3_server.storage_options(), "endpoint_url": proxy.endpoint_url}
        async with Store("s3://any-bucket", options, retry=FAST_RETRY) as store:
            with pytest.raises(Unavailable, match=f"could not be reached at {proxy.endpoint_url}"):
                await store.check()
        # Five tries (the HTTP client itself may reconnect once per try).
        assert 5 <= proxy.failed <= 10
    finally:
        proxy.stop()


async def test_a_store_that_never_answers_is_given_up_on_at_its_deadline(s3_server: Any, bucket: str) -> None:
    from storeproxy import StoreProxy

    s3_server.put_object(bucket, "obj", b"payload")
    proxy = StoreProxy(target_port=int(s3_server.endpoint_url.rsplit(":", 1)[1]))
    timeouts = StoreTimeouts(connect_timeout=0.5, read_timeout=0.5, deadline=2.0)
    try:
        options = {**s3_server.storage_options(), "endpoint_url": proxy.endpoint_url}
        async with Store(f"s3://{bucket}", options, retry=FAST_RETRY, timeouts=timeouts) as store:
            assert await store.read_range("obj", 0, 3) == b"pay"
            with proxy.hanging():
                started = time.monotonic()
                with pytest.raises(DeadlineExceeded, match=rf"store s3://{bucket} did not answer read of s3://{bucket}/obj within 2s"):
                    await store.read_range("obj", 0, 3)
                assert time.monotonic() - started < 2.0 + 1.0
            assert await store.read_range("obj", 0, 3) == b"pay"  # it heals
        # An endpoint given among the credentials is not shown.
        plain = {k: v for k, v in options.items() if k != "endpoint_url"}
        credentials = {"endpoint_url": proxy.endpoint_url}
        async with Store(f"s3://{bucket}", plain, credentials=credentials, retry=FAST_RETRY, timeouts=timeouts) as store:
            with proxy.hanging(), pytest.raises(DeadlineExceeded, match="did not answer read") as raised:
                await store.read_range("obj", 0, 3)
            assert proxy.endpoint_url not in str(raised.value), raised.value
    finally:
        proxy.stop()


class SlowMemoryFileSystem(MemoryFileSystem):
    """memory:// whose writes and reads take 0.6 s (a store busy with big objects)."""

    protocol = "slowmem"

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return str(MemoryFileSystem._strip_protocol(path.removeprefix("slowmem://")))

    def pipe_file(self, path: str, value: bytes, *args: Any, **kwargs: Any) -> None:
        time.sleep(0.6)
        super().pipe_file(path, value, *args, **kwargs)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        time.sleep(0.6)
        return bytes(super().cat_file(path, start=start, end=end, **kwargs))


async def test_the_deadline_bounds_reads_not_writes() -> None:
    fsspec.register_implementation("slowmem", SlowMemoryFileSystem, clobber=True)
    store = Store(f"slowmem:///t-{uuid.uuid4().hex}", timeouts=StoreTimeouts(deadline=0.3))
    assert (await store.write("big", b"a big upload")).length == 12  # takes 0.6 s: not cut
    with pytest.raises(DeadlineExceeded, match=r"did not answer read of .*/big within 0\.3s"):
        await store.read_range("big", 0, 3)


async def test_throttling_is_retried_then_succeeds(s3_server: Any, bucket: str) -> None:
    s3_server.put_object(bucket, "obj", b"payload")
    upstream = s3_server.endpoint_url.split("//", 1)[1]
    proxy = flaky.FlakyProxy(upstream, failures=2)  # two 503 SlowDown answers first
    try:
        options = {**s3_server.storage_options(), "endpoint_url": proxy.endpoint_url}
        async with Store(f"s3://{bucket}", options, retry=FAST_RETRY) as store:
            assert await store.read_range("obj", 0, 3) == b"pay"
        assert proxy.failed == 2 and proxy.forwarded >= 1
    finally:
        proxy.stop()


async def test_throttling_that_never_ends_is_unavailable(s3_server: Any, bucket: str) -> None:
    upstream = s3_server.endpoint_url.split("//", 1)[1]
    proxy = flaky.FlakyProxy(upstream, failures=1000)
    try:
        options = {**s3_server.storage_options(), "endpoint_url": proxy.endpoint_url}
        async with Store(f"s3://{bucket}", options, retry=FAST_RETRY) as store:
            with pytest.raises(Unavailable, match="SlowDown"):
                await store.read_range("obj", 0, 3)
        assert proxy.failed == 5
    finally:
        proxy.stop()


async def test_two_stores_never_share_a_client(s3_server: Any, bucket: str) -> None:
    async with Store(f"s3://{bucket}", s3_server.storage_options()) as a, Store(
        f"s3://{bucket}", s3_server.storage_options()
    ) as b:
        assert a._backend._fs is not b._backend._fs


# -- file:// stores never leave their root -------------------------------------------------------


@pytest.fixture
def linked_root(tmp_path: Path) -> tuple[Path, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "ok.txt").write_bytes(b"inside")
    (root / "sub" / "deep.txt").write_bytes(b"deep")
    (outside / "secret.txt").write_bytes(b"secret")
    (root / "secret").symlink_to(outside / "secret.txt")
    (root / "outdir").symlink_to(outside, target_is_directory=True)
    (root / "alias").symlink_to(root / "sub", target_is_directory=True)  # stays inside
    (root / "sub" / "loop").symlink_to(root, target_is_directory=True)   # inside, a cycle
    return root, outside


async def test_links_out_of_a_file_root_are_refused_and_left_out_of_listings(linked_root: tuple[Path, Path]) -> None:
    root, outside = linked_root
    store = Store(f"file://{root}")
    for rel in ("secret", "outdir/secret.txt"):
        with pytest.raises(PermissionDenied, match=f"{rel} leads out of the mount's root"):
            await store.info(rel)
        with pytest.raises(PermissionDenied, match="leads out"):
            await store.read_range(rel, 0, 3)
    with pytest.raises(PermissionDenied, match="outdir/new.txt leads out"):
        await store.write("outdir/new.txt", b"x")
    with pytest.raises(PermissionDenied, match="outdir leads out"):
        await store.ls("outdir")
    assert not (outside / "new.txt").exists()
    assert [(s.path, s.is_dir) for s in await store.ls("")] == [("alias", True), ("ok.txt", False), ("sub", True)]
    # A linked folder inside the root lists as a folder; a loop is walked once round.
    assert [s.path for s in await store.walk("")] == ["alias/deep.txt", "ok.txt", "sub/deep.txt"]
    assert (await store.totals()).files == 3
    assert [(s.path, s.is_dir) for s in await store.ls("alias")] == [("alias/deep.txt", False), ("alias/loop", True)]
    assert await store.read_range("alias/deep.txt", 0, 4) == b"deep"


def _flip(link: Path, targets: tuple[str, str], stop: threading.Event) -> None:
    """Point `link` at each target in turn, each time at once (a new link renamed over it),
    until `stop`: what someone else who writes the folder can do."""
    spare = link.with_name(link.name + ".new")
    while not stop.is_set():
        for target in targets:
            spare.symlink_to(target, target_is_directory=True)
            os.replace(spare, link)


async def test_a_link_swapped_in_while_a_file_is_opened_leads_no_read_or_write_outside(tmp_path: Path) -> None:
    # A folder of the root is a link that someone else who writes the folder keeps turning
    # between a folder inside and one outside; each name is checked before it is opened, so
    # the swap has to come in between (it does, now and then, in a few thousand tries). A
    # decoy inside has the size and time of the secret outside, so a read of the decoy's
    # version does not tell them apart by version.
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "inside").mkdir(parents=True)
    outside.mkdir()
    secret, decoy = outside / "secret.txt", root / "inside" / "secret.txt"
    secret.write_bytes(b"host secret!")
    decoy.write_bytes(b"decoy bytes!")
    os.utime(decoy, ns=(secret.stat().st_atime_ns, secret.stat().st_mtime_ns))
    (root / "sub").symlink_to("inside", target_is_directory=True)
    store = Store(f"file://{root}", allowed_roots=[str(tmp_path)])
    version = (await store.info("sub/secret.txt")).version
    stop = threading.Event()
    flipper = threading.Thread(target=_flip, args=(root / "sub", ("inside", str(outside)), stop))
    flipper.start()
    served: list[bytes] = []
    written = 0
    try:
        for i in range(3000):
            with contextlib.suppress(PermissionDenied, NotFound):
                await store.write(f"sub/planted-{i}.txt", b"x")
                written += 1
            with contextlib.suppress(PermissionDenied, NotFound, VersionChanged):
                served.append(await store.read_range("sub/secret.txt", 0, 100, version=version))
    finally:
        stop.set()
        flipper.join()
    planted = sorted(p.name for p in outside.glob("planted-*"))
    assert not planted, f"{len(planted)} of {written} writes landed outside the root"
    assert b"host secret!" not in served, f"{served.count(b'host secret!')} reads returned a file outside the root"
    assert served and written, "no read or write went through: the test tried nothing"
    assert set(served) == {b"decoy bytes!"}


async def test_a_store_given_allowed_roots_checks_its_root_on_every_access(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    (allowed / "data").mkdir(parents=True)
    (allowed / "data" / "f.txt").write_bytes(b"f")
    store = Store(f"file://{allowed}/data", allowed_roots=[str(allowed)])
    assert [s.path for s in await store.ls("")] == ["f.txt"]
    # The folder becomes a link out of the allowed root (on this host): nothing is served.
    (allowed / "data").rename(tmp_path / "moved")
    (allowed / "data").symlink_to("/etc", target_is_directory=True)
    for call in (lambda: store.ls(""), lambda: store.info("passwd"), lambda: store.read_range("passwd", 0, 10)):
        with pytest.raises(PermissionDenied, match="not under a folder this cluster allows"):
            await call()


def test_file_sources_need_an_allowed_root(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    (allowed / "data").mkdir(parents=True)
    (allowed / "escape").symlink_to("/etc", target_is_directory=True)
    check_source_allowed(f"file://{allowed}/data", [str(allowed)])
    check_source_allowed("s3://bucket/x", [])  # not a host folder: nothing to allow
    with pytest.raises(PermissionDenied, match="allows no file:// sources"):
        check_source_allowed(f"file://{allowed}/data", [])
    for source in ("file:///etc", f"file://{allowed}/escape", f"file://{allowed}/../allowed2", "local:///etc"):
        with pytest.raises(PermissionDenied, match="not under a folder this cluster allows"):
            check_source_allowed(source, [str(allowed)])
    with pytest.raises(InvalidArgument, match="wraps another filesystem"):
        check_source_allowed("simplecache:///etc", [str(allowed)])


async def test_a_link_swapped_in_during_a_change_or_a_listing_leads_nothing_outside(tmp_path: Path) -> None:
    # As above, for every other file:// operation: deletes, moves, new folders, statuses,
    # listings and walks through a folder that someone else keeps turning into a link out
    # of the root. Nothing outside may be removed, moved, made or shown.
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "inside").mkdir(parents=True)
    outside.mkdir()
    for name in ("victim.txt", "moveme.txt"):
        (outside / name).write_bytes(b"host file")
    (outside / "only-outside.txt").write_bytes(b"a host file's name and size")
    (root / "sub").symlink_to("inside", target_is_directory=True)
    store = Store(f"file://{root}", allowed_roots=[str(tmp_path)])
    stop = threading.Event()
    flipper = threading.Thread(target=_flip, args=(root / "sub", ("inside", str(outside)), stop))
    flipper.start()
    shown: list[str] = []
    tried = 0
    refused = (PermissionDenied, NotFound, InvalidArgument)
    try:
        for i in range(1000):
            for name in ("victim.txt", "moveme.txt"):
                (root / "inside" / name).write_bytes(b"ours")
            (root / f"mine-{i}.txt").write_bytes(b"ours")
            calls = (
                lambda: store.rm("sub/victim.txt"),
                lambda: store.mv("sub/moveme.txt", f"moved-{i}.txt"),
                lambda: store.mv(f"mine-{i}.txt", f"sub/landed-{i}.txt"),
                lambda: store.mkdir(f"sub/made-{i}/deeper"),
                lambda: store.info("sub/only-outside.txt"),
                lambda: store.ls("sub"),
                lambda: store.walk("sub"),
            )
            for call in calls:
                with contextlib.suppress(*refused):
                    answer = await call()
                    tried += 1
                    for status in answer if isinstance(answer, list) else [answer] if answer else []:
                        shown.append(status.path)
    finally:
        stop.set()
        flipper.join()
    found = {
        "a delete removed a file outside the root": not (outside / "victim.txt").exists(),
        "a move took a file from outside the root": not (outside / "moveme.txt").exists(),
        "a move put a file outside the root": bool(list(outside.glob("landed-*"))),
        "a new folder was made outside the root": bool(list(outside.glob("made-*"))),
        "a status or listing showed a file outside the root": any("only-outside" in p for p in shown),
    }
    assert not [what for what, happened in found.items() if happened]
    assert tried, "no call went through: the test tried nothing"


async def test_a_move_onto_another_file_system_within_a_file_root_copies_the_tree(tmp_path: Path) -> None:
    with tiny_disk("4m") as disk:
        root = Path(os.path.commonpath([tmp_path, disk]))
        store = Store(f"file://{root}")
        tree = tmp_path / "tree"
        (tree / "y" / "empty").mkdir(parents=True)
        (tree / "x").write_bytes(b"x bytes")
        (tree / "y" / "z").write_bytes(b"z bytes")
        src, dst = str(tree.relative_to(root)), str((disk / "moved").relative_to(root))
        await store.mv(src, dst)
        assert not tree.exists()
        assert (disk / "moved" / "x").read_bytes() == b"x bytes"
        assert (disk / "moved" / "y" / "z").read_bytes() == b"z bytes"
        assert (disk / "moved" / "y" / "empty").is_dir()


async def test_a_file_upload_is_bounded_by_its_progress_not_its_size(tmp_path: Path) -> None:
    # What a file:// upload copies from here is a FIFO: fed a MiB at a time, the upload
    # takes longer than the stall timeout and goes through; never fed, it fails at the
    # stall timeout, naming the store, and leaves nothing in the store.
    root = tmp_path / "root"
    root.mkdir()
    store = Store(f"file://{root}", timeouts=StoreTimeouts(stall_timeout=2))
    source = tmp_path / "source"
    os.mkfifo(source)

    def feed(chunks: int) -> None:
        with open(source, "wb") as fifo:
            for _ in range(chunks):
                fifo.write(b"x" * 2**20)
                fifo.flush()
                time.sleep(0.15)

    feeder = threading.Thread(target=feed, args=(20,))
    feeder.start()
    try:
        written = await store.write_file("slow.bin", source)
    finally:
        feeder.join()
    assert written.length == 20 * 2**20 == (root / "slow.bin").stat().st_size

    with pytest.raises(DeadlineExceeded, match=r"did not answer upload of .*/hung\.bin: no progress for 2s"):
        await store.write_file("hung.bin", source)
    os.close(os.open(source, os.O_WRONLY | os.O_NONBLOCK))  # the given-up upload may end now
    for _ in range(100):
        if not list((root / ".strata-uploads").iterdir()):
            break
        time.sleep(0.05)
    assert sorted(p.name for p in root.iterdir()) == [".strata-uploads", "slow.bin"]
    assert list((root / ".strata-uploads").iterdir()) == []
    await store.close()
