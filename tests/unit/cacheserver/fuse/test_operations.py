"""Pieces of the FUSE callbacks that need no kernel: metadata timeouts, error numbers, and
what an open tells the kernel about its page cache (against a real master in this process
and a file:// mount). The callbacks themselves run against real mounts in
tests/integration/test_fuse.py."""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from threadmaster import MASTER_TOKEN, threaded_master

from strata.cacheserver.client.fs import StrataFileSystem
from strata.cacheserver.fuse.attrcache import (MAX_ATTR_TIMEOUT, MAX_READ_ONLY_ATTR_TIMEOUT, attr_timeout_for, inode_of,
                                               inodes_in)
from strata.cacheserver.fuse.errnos import errno_of
from strata.cacheserver.fuse.interface import FileInfo
from strata.cacheserver.fuse.operations import StrataOperations
from strata.cacheserver.fuse.settings import DEFAULT_ATTR_TIMEOUT, FuseSettings
from strata.contract import errors
from strata.contract.proto import strata_pb2 as pb


def mount(path: str, interval: float) -> pb.MountInfo:
    return pb.MountInfo(path=path, options=pb.MountOptions(metadata_sync_interval=interval))


MOUNTS = [mount("/datasets/a", 30), mount("/datasets/b", 0), mount("/logs", -1), mount("/fast", 5)]


@pytest.mark.parametrize(("root", "expected"), [
    ("/datasets/a", 30),            # inside one mount: its interval
    ("/datasets/a/train", 30),
    ("/datasets", 0),               # shows two mounts: the stricter one wins
    ("/logs", MAX_ATTR_TIMEOUT),    # never synced: still capped
    ("/", 0),
    ("/fast", 5),
    ("/elsewhere", DEFAULT_ATTR_TIMEOUT),
])
def test_metadata_timeout_follows_the_mounts_sync_intervals(root: str, expected: float) -> None:
    assert attr_timeout_for(MOUNTS, root) == expected


def test_a_listings_inode_numbers_are_those_of_its_paths() -> None:
    """Numbered a folder at a time (readdir) or a path at a time (lookup): the same numbers."""
    names = ["a", "b.bin", "é", "x" * 200]
    assert inodes_in("/", names) == [inode_of(f"/{n}") for n in names]
    assert inodes_in("/data/set", names) == [inode_of(f"/data/set/{n}") for n in names]
    assert len(set(inodes_in("/data/set", names))) == len(names) and min(inodes_in("/", names)) > 1


def test_long_intervals_are_capped() -> None:
    assert attr_timeout_for([mount("/x", 3600)], "/x") == MAX_ATTR_TIMEOUT


def test_read_only_mounts_are_reused_for_their_interval_up_to_an_hour() -> None:
    """No Strata client changes a read-only mount: only the master's sync sees a change."""
    def read_only(path: str, interval: float) -> pb.MountInfo:
        return pb.MountInfo(path=path, options=pb.MountOptions(metadata_sync_interval=interval, read_only=True))

    assert attr_timeout_for([read_only("/x", 300)], "/x") == 300
    assert attr_timeout_for([read_only("/x", -1)], "/x") == MAX_READ_ONLY_ATTR_TIMEOUT
    assert attr_timeout_for([read_only("/x", 86400)], "/x") == MAX_READ_ONLY_ATTR_TIMEOUT
    assert attr_timeout_for([read_only("/x/a", 300), mount("/x/b", 300)], "/x") == MAX_ATTR_TIMEOUT


@pytest.mark.parametrize(("error", "code"), [
    (errors.NotFound("x"), errno.ENOENT),
    (errors.AlreadyExists("x"), errno.EEXIST),
    (errors.PermissionDenied("x"), errno.EACCES),
    (errors.Unauthenticated("x"), errno.EACCES),
    (errors.InvalidArgument("x"), errno.EINVAL),
    (errors.ResourceExhausted("x"), errno.ENOSPC),
    (errors.Unavailable("x"), errno.EIO),
    (errors.DataLoss("x"), errno.EIO),
    (errors.StrataError("x"), errno.EIO),
])
def test_client_errors_become_errno(error: errors.StrataError, code: int) -> None:
    assert errno_of(error) == code


# -- the page cache across opens --------------------------------------------------------------


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[tuple[StrataFileSystem, Path]]:
    """A file system on a real master whose mount /m is a folder here, its metadata looked
    up in the folder on every access."""
    store = tmp_path / "store"
    store.mkdir()
    with threaded_master(tmp_path) as (handle, _):
        fs = StrataFileSystem(master=f"127.0.0.1:{handle.port}", token=MASTER_TOKEN, skip_instance_cache=True)
        fs.client.mount("/m", f"file://{store}", pb.MountOptions(metadata_sync_interval=0))
        try:
            yield fs, store
        finally:
            fs.client.close()


def rewrite(path: Path, data: bytes) -> None:
    """A new version of the file (its size and mtime are its version on file://)."""
    path.write_bytes(data)
    later = time.time_ns() + 1_000_000_000
    os.utime(path, ns=(later, later))


def opened(ops: StrataOperations) -> tuple[int, tuple[int, int]]:
    """Open /f for reading: its handle and what the kernel is told (keep_cache, direct_io)."""
    fi = FileInfo(flags=os.O_RDONLY)
    assert ops.open("/f", fi) == 0
    return fi.fh, (fi.keep_cache, fi.direct_io)


def test_an_open_keeps_the_page_cache_only_while_no_other_version_is_open(
        mounted: tuple[StrataFileSystem, Path], tmp_path: Path) -> None:
    fs, store = mounted
    rewrite(store / "f", b"one")
    ops = StrataOperations(fs, FuseSettings(root="/m", attr_timeout=0, handles_dir=tmp_path / "handles"))

    def release(fh: int) -> None:
        assert ops.release("/f", FileInfo(fh=fh)) == 0

    a, told = opened(ops)
    assert told == (0, 0)  # first open: nothing of it in the kernel to keep
    b, told = opened(ops)
    assert told == (1, 0)  # the same version again: its pages are kept
    rewrite(store / "f", b"two!")
    c, told = opened(ops)
    assert told == (0, 1)  # handles of the old version are open: around the page cache
    release(a)
    d, told = opened(ops)
    assert told == (0, 1)  # one of them still is
    release(b)
    e, told = opened(ops)
    assert told == (0, 0)  # none now: the page cache, which may hold old pages, starts cold
    f, told = opened(ops)
    assert told == (1, 0)
    for fh in (c, d, e, f):
        release(fh)
    rewrite(store / "f", b"three")
    g, told = opened(ops)
    assert told == (0, 0)  # changed with nothing open: cold
    h, told = opened(ops)
    assert told == (1, 0)
    release(h)

    # A successor takes the mount over: it opens the handle left open again, at its version.
    successor = StrataOperations(fs, FuseSettings(root="/m", attr_timeout=0, handles_dir=tmp_path / "handles"))
    assert successor.adopt() == 1
    rewrite(store / "f", b"four!!")
    i, told = opened(successor)
    assert told == (0, 1)  # the adopted handle is of another version
    successor.release("/f", FileInfo(fh=g))
    j, told = opened(successor)
    assert told == (0, 0)
    for fh in (i, j):
        successor.release("/f", FileInfo(fh=fh))


def test_a_handle_goes_on_as_a_new_version_only_where_the_page_cache_cannot_mix_them(
        mounted: tuple[StrataFileSystem, Path], tmp_path: Path) -> None:
    """What the FUSE server answers a read handle whose first read was refused because its
    version changed in the store (client.fs.StrataFile.may_reopen): yes only for a handle
    that reads directly, or that dropped the kernel's pages at its open and is the only one
    of the file since, with the length the kernel has."""
    fs, store = mounted
    rewrite(store / "f", b"one")
    ops = StrataOperations(fs, FuseSettings(root="/m", attr_timeout=0, handles_dir=tmp_path / "handles"))

    def may_switch(fh: int, new: pb.FileInfo) -> bool:
        file = ops._handles[fh]._file  # type: ignore[union-attr]
        allowed = bool(file.may_reopen(file.file_info, new))
        if allowed:
            file.file_info = new  # as the file does when told yes
        return allowed

    def release(fh: int) -> None:
        assert ops.release("/f", FileInfo(fh=fh)) == 0

    a, told = opened(ops)
    assert told == (0, 0)
    old = fs.client.stat("/m/f")
    same_length = pb.FileInfo(path="/m/f", version="v-same-length", length=old.length)
    longer = pb.FileInfo(path="/m/f", version="v-longer", length=old.length + 1)
    assert not may_switch(a, longer)  # the kernel would cut its reads at the old length
    b, told = opened(ops)
    assert told == (1, 0)
    assert not may_switch(b, same_length)  # kept the pages of the old version
    assert not may_switch(a, same_length)  # another handle opened since
    release(b)
    assert not may_switch(a, same_length)  # ... and released: it may have filled pages
    release(a)
    rewrite(store / "f", b"two")  # same length, another version
    c, told = opened(ops)
    assert told == (0, 0)
    assert may_switch(c, same_length)
    rewrite(store / "f", b"three")
    d, told = opened(ops)
    assert told == (0, 1)  # c counts as "v-same-length" now: d reads around the page cache
    assert may_switch(d, longer)  # direct reads: no page of either version
    e, told = opened(ops)
    assert told == (0, 1)
    for fh in (c, d, e):
        release(fh)
    f, told = opened(ops)
    assert told == (0, 0)  # nothing open: the index is back to empty
    release(f)


def test_the_kernel_is_told_the_size_of_the_version_read_through_the_page_cache(
        mounted: tuple[StrataFileSystem, Path], tmp_path: Path) -> None:
    """The kernel holds one size of a file and cuts reads through its page cache there: while
    a handle reads a file so, every answer about the file gives that version's size (a handle
    of the new version reads directly, and is not cut); once it is closed, the newest."""
    fs, store = mounted
    old, new = b"the old version", b"new"
    rewrite(store / "f", old)
    ops = StrataOperations(fs, FuseSettings(root="/m", attr_timeout=0, handles_dir=tmp_path / "handles"))
    a, told = opened(ops)
    assert told == (0, 0)
    rewrite(store / "f", new)
    b, told = opened(ops)
    assert told == (0, 1)
    for fi in (None, FileInfo(fh=a), FileInfo(fh=b)):
        assert ops.getattr("/f", fi)["st_size"] == len(old)
    assert ops.release("/f", FileInfo(fh=a)) == 0
    for fi in (None, FileInfo(fh=b)):
        assert ops.getattr("/f", fi)["st_size"] == len(new)
    assert ops.release("/f", FileInfo(fh=b)) == 0


# -- listings ---------------------------------------------------------------------------------


@pytest.fixture
def dataset(tmp_path: Path) -> Iterator[tuple[StrataFileSystem, Path, Any]]:
    """A file system on a real master with a read-only mount /m of a folder here (synced
    hourly, as datasets are) and a writable one /w; and the master's parts."""
    for name in ("m", "w"):
        (tmp_path / name / "sub").mkdir(parents=True)
        for i in range(3):
            (tmp_path / name / f"f{i}").write_bytes(b"x" * i)
    with threaded_master(tmp_path) as (handle, _):
        fs = StrataFileSystem(master=f"127.0.0.1:{handle.port}", token=MASTER_TOKEN, skip_instance_cache=True)
        fs.client.mount("/m", f"file://{tmp_path / 'm'}", pb.MountOptions(read_only=True, metadata_sync_interval=3600))
        fs.client.mount("/w", f"file://{tmp_path / 'w'}", pb.MountOptions(metadata_sync_interval=0))
        try:
            yield fs, tmp_path, handle.parts
        finally:
            fs.client.close()


def test_a_listing_is_kept_once_and_answers_the_stats_that_follow(
        dataset: tuple[StrataFileSystem, Path, Any], tmp_path: Path) -> None:
    """`ls -l`: the entries of a folder listed through a read-only FUSE mount answer the stats
    of its files from the mount's attribute cache alone (the client keeps no second copy of
    each: the kernel opens the files without asking)."""
    fs, _, master = dataset
    ops = StrataOperations(fs, FuseSettings(root="/m", read_only=True, attr_timeout=3600,
                                            handles_dir=tmp_path / "handles"))
    listed = ops.readdir("/", None)
    assert [name for name, _, _ in listed] == [".", "..", "f0", "f1", "f2", "sub"]
    assert [mode for name, _, mode in listed if name.startswith("f")] == [stat.S_IFREG] * 3
    assert dict((name, ino) for name, ino, _ in listed)["f1"] == ops.getattr("/f1")["st_ino"]
    assert len(fs.client._held) == 0
    asked = master.files.metadata_requests["GetStatus"]
    assert [ops.getattr(f"/f{i}")["st_size"] for i in range(3)] == [0, 1, 2]
    assert ops.getattr("/sub")["st_mode"] & stat.S_IFDIR
    assert master.files.metadata_requests["GetStatus"] == asked
    # A mount point that writes opens files itself: through the client's held answers.
    writable = StrataOperations(fs, FuseSettings(root="/m", attr_timeout=3600, handles_dir=tmp_path / "handles"))
    writable.readdir("/", None)
    assert fs.client._held.get("/m/f1") is not None


def test_the_kernel_may_answer_from_a_listing_only_while_the_master_would_give_it(
        dataset: tuple[StrataFileSystem, Path, Any], tmp_path: Path) -> None:
    fs, store, _ = dataset
    settings = FuseSettings(root="/", read_only=True, attr_timeout=1, handles_dir=tmp_path / "handles")
    ops = StrataOperations(fs, settings)
    assert not ops.listing_unchanged("/m")  # not listed yet
    ops.readdir("/m", None)
    assert ops.listing_unchanged("/m")  # a read-only mount synced hourly
    ops.readdir("/w", None)
    assert not ops.listing_unchanged("/w")  # writable: every listing asks again
    fs.client.mount("/s", f"file://{store / 'm'}", pb.MountOptions(read_only=True, metadata_sync_interval=1))
    ops.readdir("/s", None)
    assert ops.listing_unchanged("/s")
    time.sleep(1.1)
    assert not ops.listing_unchanged("/s")  # synced since: the kernel reads it anew
    writable = StrataOperations(fs, FuseSettings(root="/", attr_timeout=1, handles_dir=tmp_path / "handles"))
    writable.readdir("/m", None)
    assert not writable.listing_unchanged("/m")  # a mount point that writes: none is kept
