"""A read-only `strata fuse` mount lets the kernel open files and answer reads of what it holds
without asking the FUSE process, within the Strata mount's metadata sync interval: what
training loaders, which open many small files in every epoch, rely on."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from strata.cacheserver.fuse import mountkeeper
from strata.cacheserver.fuse.nodes import NodeTable

from .conftest import BLOCK_SIZE, wait_until
from .test_cluster import payload
from .test_fuse import FuseProcess, fuse_skip_reason, mount_fuse  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(240),
              pytest.mark.skipif(fuse_skip_reason() is not None, reason=str(fuse_skip_reason()))]

# Opens, reads and closes each file given, printing their sha256 as JSON. (Unbuffered: a
# buffered open asks whether the file is a terminal, an ioctl the kernel passes on to FUSE.)
READER = """
import hashlib, json, sys
print(json.dumps({p: hashlib.sha256(open(p, "rb", buffering=0).readall()).hexdigest() for p in sys.argv[1:]}))
"""


def sha256s(paths: list[Path], timeout: float) -> dict[str, str]:
    """Each file's sha256, read by a new process (as each epoch's loaders are)."""
    done = subprocess.run([sys.executable, "-c", READER, *map(str, paths)], capture_output=True, text=True,
                          timeout=timeout, check=True)
    result: dict[str, str] = json.loads(done.stdout)
    return result


@contextlib.contextmanager
def stopped(fuse: FuseProcess, waited: str) -> Iterator[None]:
    """The FUSE process stopped (SIGSTOP) meanwhile: a request that reaches it is not answered,
    and a reader that times out waiting for one fails the test with `waited`."""
    os.kill(fuse.process.pid, signal.SIGSTOP)
    try:
        yield
    except subprocess.TimeoutExpired:
        pytest.fail(waited)
    finally:
        os.kill(fuse.process.pid, signal.SIGCONT)


def rss(pid: int) -> int:
    """Resident bytes of process `pid`."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def test_warm_files_of_a_read_only_mount_are_opened_and_read_without_the_fuse_process(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    cluster = start_cluster(workers=1)
    files = {f"train/{i:03d}.jpg": payload(100_000 + i) for i in range(40)}
    for key, data in files.items():
        cluster.s3.put_object(bucket, key, data)
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=300)
    fuse = mount_fuse(cluster, "--read-only", "--root", "/ds")
    paths = [fuse.path / key for key in files]
    want = {str(fuse.path / key): hashlib.sha256(data).hexdigest() for key, data in files.items()}
    assert sha256s(paths, 60) == want  # epoch 1: the kernel caches the files
    # Epoch 2, new processes: the kernel opens, reads and closes each file itself. (A
    # stopped FUSE process would hold an open it is asked for until the timeout.)
    with stopped(fuse, "opening a file the kernel holds waited for the FUSE process"):
        assert sha256s(paths, 20) == want
    assert sha256s(paths, 60) == want


def test_a_change_in_the_store_is_read_whole_after_the_metadata_interval_of_a_read_only_mount(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    """The kernel holds the file's pages across opens for the interval; then the next read
    gets the new bytes (of the same length: only the version tells them apart), never a mix."""
    cluster = start_cluster(workers=1)
    old, new = payload(300_000), payload(300_000, seed=1)
    cluster.s3.put_object(bucket, "f.bin", old)
    interval = 3.0
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=interval)
    path = mount_fuse(cluster, "--read-only", "--root", "/ds").path / "f.bin"
    assert path.read_bytes() == old
    assert path.read_bytes() == old
    cluster.s3.put_object(bucket, "f.bin", new)
    changed = time.monotonic()
    seen: list[bytes] = []

    def read_new() -> bool:
        seen.append(path.read_bytes())
        assert seen[-1] in (old, new), "a read mixed the two versions"
        return seen[-1] == new

    # The master syncs within the interval, the FUSE process and the kernel reuse what they
    # were told for as long again each.
    wait_until(read_new, 4 * interval + 10, "a read to get the new bytes", interval=0.2)
    assert time.monotonic() - changed < 4 * interval + 10
    assert path.read_bytes() == new


def test_many_files_held_open_on_a_read_only_mount_take_no_memory_of_the_fuse_process_each(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    """A loader may hold thousands of files open; the FUSE process keeps at most `--readers`
    files ready to read, not one object per open file."""
    cluster = start_cluster(workers=1)
    count = 1500
    for i in range(count):
        cluster.s3.put_object(bucket, f"many/{i:04d}", payload(1000 + i))
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=300)
    fuse = mount_fuse(cluster, "--read-only", "--root", "/ds", "--readers", "16")
    paths = [fuse.path / "many" / f"{i:04d}" for i in range(count)]
    fds = [os.open(paths[0], os.O_RDONLY)]
    os.read(fds[0], 10)
    before = rss(fuse.process.pid)
    try:
        for i, p in enumerate(paths[1:], start=1):
            fds.append(os.open(p, os.O_RDONLY))
            assert len(os.read(fds[-1], 5000)) == 1000 + i
        grown = rss(fuse.process.pid) - before
    finally:
        for fd in fds:
            os.close(fd)
    # What stays per file is the kernel's node of it and its status (~2.3 KiB measured); a
    # client file object per open file (the code before the kernel opened files) added
    # ~5.7 KiB each, 8.4 MiB here (and a record of it on disk).
    assert grown < 4 * 2**20, f"the FUSE process grew {grown / 2**20:.1f} MiB for {count} open files"
    assert not list(fuse.path.parent.glob("state/*/handles/*")), "a record per open file"



def kernel_nodes(fuse: FuseProcess, copy: Path) -> int:
    """The nodes the FUSE process holds, by its journal (what a successor would replay)."""
    [journal] = fuse.path.parent.glob(f"state/*/{mountkeeper.JOURNAL}")
    shutil.copyfile(journal, copy)
    table = NodeTable("/", copy)
    table.close()
    return len(table)


@pytest.mark.timeout(600)
def test_a_mount_holds_at_most_max_nodes_however_many_files_are_looked_up(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess], tmp_path: Path) -> None:
    """The kernel keeps an entry and its node for every file looked up until memory pressure
    ends it; past `--max-nodes` the FUSE process has the kernel drop the least recent ones,
    and its memory stays flat however many files are seen. A dropped file is looked up anew."""
    cluster = start_cluster(workers=1)
    count, bound = 12_000, 2_000
    files = {f"many/{i:05d}": payload(1024) for i in range(count)}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda item: cluster.s3.put_object(bucket, *item), files.items()))
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=300)
    fuse = mount_fuse(cluster, "--read-only", "--root", "/ds", "--max-nodes", str(bound))
    keys = list(files)
    settled = count // 3
    for key in keys[:settled]:
        assert os.stat(fuse.path / key).st_size == 1024
    before = rss(fuse.process.pid)
    for key in keys[settled:]:
        assert os.stat(fuse.path / key).st_size == 1024
    grown = rss(fuse.process.pid) - before
    held = wait_until(lambda: (n := kernel_nodes(fuse, tmp_path / "journal")) <= bound and n, 60,
                      f"the FUSE process to hold at most {bound} nodes")
    # Measured: the 8,000 files after the first 4,000 grew the process by 15 MiB with no bound
    # (a node, a pin and a held status each); with it, by nothing (-1.9 MiB).
    assert grown < 3 * 2**20, f"the FUSE process grew {grown / 2**20:.1f} MiB for {count - settled} more files"
    assert held > bound // 2  # the bound, not an emptied table
    for key in keys[::60]:  # dropped long ago, most of them: looked up again, and read right
        assert (fuse.path / key).read_bytes() == files[key], key


# Reads a file front to back in 1 MiB reads, then at offsets spread over it as a Parquet reader
# does (footer, then column chunks), printing the sha256 of what the front-to-back read gave.
LARGE_READER = """
import hashlib, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
digest = hashlib.sha256()
while chunk := os.read(fd, 1 << 20):
    digest.update(chunk)
size = os.fstat(fd).st_size
for offset in (size - 8, 0, size // 3, size // 2 + 12345, size - (5 << 20)):
    assert len(os.pread(fd, 1 << 20, offset)) == min(1 << 20, size - offset)
print(digest.hexdigest())
"""


def large_read(path: Path, timeout: float) -> str:
    done = subprocess.run([sys.executable, "-c", LARGE_READER, str(path)], capture_output=True, text=True,
                          timeout=timeout, check=True)
    return done.stdout.strip()


def test_a_large_file_is_read_warm_by_a_new_process_from_the_page_cache(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    """A large file of several blocks read warm by a new process, front to back and at spread
    offsets: every read is answered from the kernel's page cache, none by the FUSE process.
    (The mount's metadata stands meanwhile: with a short interval the kernel's LOOKUP or GETATTR
    once the file's attributes lapse would reach the stopped process, and that is no read.)"""
    cluster = start_cluster(workers=1)
    data = payload(7 * BLOCK_SIZE + 4321)
    cluster.s3.put_object(bucket, "big.bin", data)
    cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=300)
    fuse = mount_fuse(cluster, "--read-only", "--root", "/ds")
    path = fuse.path / "big.bin"
    want = hashlib.sha256(data).hexdigest()
    assert large_read(path, 120) == want  # the kernel caches the file's pages
    with stopped(fuse, "a warm read of a large file waited for the FUSE process"):
        assert large_read(path, 20) == want
