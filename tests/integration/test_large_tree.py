"""A mount of a large tree (a file:// store of 200,000 files): the master stays alive while it
mounts, totals and lists it, and listings of any size arrive whole.

Real processes: a master and a worker started as users start them, heartbeating every 0.2 s
(dropped after 2 s without one). Meanwhile a thread asks the master's /healthz every 50 ms and
another reads a file of a second mount again and again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from strata.contract.errors import ResourceExhausted
from strata.contract.proto import strata_pb2 as pb

from .conftest import Cluster, allow, metric, wait_until
from .test_fuse import FuseProcess, mount_fuse  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(600)

FOLDERS = 200
FILES_PER_FOLDER = 1000


def make_tree(root: Path, folders: int, files: int) -> int:
    """`folders` folders of `files` empty files each under `root`; how many files."""
    for f in range(folders):
        folder = root / f"d{f:04d}"
        folder.mkdir(parents=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i in range(files):
                os.close(os.open(f"f{i:05d}.bin", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
        finally:
            os.close(fd)
    return folders * files


# Asks the master's /healthz every 50 ms in a process of its own (the benchmark's probe): in
# the test's process a find of 200,000 files holds the interpreter's lock, and the probe would
# time the test, not the master.
HEALTH_PROBE = Path(__file__).resolve().parents[2] / "bench" / "healthprobe.py"


class Watch:
    """Asks the master's /healthz every 50 ms (in a process of its own) and reads a small
    file again and again (in a thread): the slowest health answer, and what failed."""

    def __init__(self, cluster: Cluster, small: str, data: bytes) -> None:
        self.health_worst = 0.0
        self.reads = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._cluster = cluster
        self._small, self._data = small, data
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._stop_file = cluster.root / "probe.stop"
        self._probe: subprocess.Popen[str] | None = None

    def __enter__(self) -> Watch:
        url = f"http://127.0.0.1:{self._cluster.master.http_port}/healthz"
        self._probe = subprocess.Popen([sys.executable, "-P", str(HEALTH_PROBE), url, str(self._stop_file)],
                                       stdout=subprocess.PIPE, text=True)
        self._reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._stop_file.touch()
        self._reader.join(30)
        assert self._probe is not None
        out, _ = self._probe.communicate(timeout=30)
        lines = out.splitlines()
        self.failures += [f"/healthz {line}" for line in lines[:-1]]
        self.health_worst = float(lines[-1].split()[-1]) if lines else float("inf")

    def _read(self) -> None:
        fs = self._cluster.fs(host="reader")
        while not self._stop.wait(0.05):
            try:
                got = fs.cat_file(self._small)
            except Exception as exc:  # noqa: BLE001 - every failure is reported
                self.failures.append(f"read {self._small}: {exc}")
                continue
            if got != self._data:
                self.failures.append(f"read {self._small}: wrong bytes")
            self.reads += 1


def test_the_master_stays_alive_while_it_mounts_totals_and_lists_a_large_tree(start_cluster: Any, tmp_path: Path) -> None:
    big, small = tmp_path / "big", tmp_path / "small"
    count = make_tree(big, FOLDERS, FILES_PER_FOLDER)
    small.mkdir()
    data = os.urandom(100_000)
    (small / "f.bin").write_bytes(data)
    cluster: Cluster = start_cluster(workers=1, **allow(tmp_path))
    admin = cluster.fs().client
    options = pb.MountOptions(read_only=True, metadata_sync_interval=3600)
    admin.mount("/small", f"file://{small}", options)
    with Watch(cluster, "/small/f.bin", data) as watch:
        started = time.monotonic()
        admin.mount("/big", f"file://{big}", options)
        mounted = time.monotonic() - started

        def totalled() -> bool:
            report = admin.report()
            return any(m.mount.path == "/big" and m.ufs_files == count for m in report.mounts)

        # The operator asks for reports on a timer: each answers at once, from the last totals.
        wait_until(totalled, 300, f"the report to total the {count} files of /big", interval=0.5)
        # A client's find walks the tree through the master's metadata cache, in pages.
        found = cluster.fs(host="finder").find("/big")
        assert len(found) == count and found[0] == "/big/d0000/f00000.bin"
        time.sleep(1)
    assert not watch.failures, watch.failures[:5]
    assert watch.reads > 0
    assert mounted < 5, f"mount add took {mounted:.1f}s"
    assert watch.health_worst < 1.0, f"/healthz took {watch.health_worst:.2f}s to answer"
    assert len(admin.workers(refresh=True)) == 1
    log = (cluster.root / "logs" / "master.log").read_text()
    assert "stopped heartbeating" not in log
    assert "from metadata" not in log  # no stale answers: the store was healthy throughout


# A folder whose listing is larger than gRPC's 64 MiB message limit (contract.rpc
# MAX_MESSAGE_BYTES) without millions of files: long names in a deep folder make each entry
# about 2 KiB (its path, its name), so 40,000 files list as ~80 MiB.
LONG_FILES = 40_000


def test_a_listing_larger_than_the_message_limit_lists_whole(
        start_cluster: Any, tmp_path: Path, mount_fuse: Callable[..., FuseProcess]) -> None:
    root = tmp_path / "tree"
    deep = root.joinpath(*[f"{level}" + "d" * 240 for level in range(5)])
    deep.mkdir(parents=True)
    names = [f"{i:06d}" + "n" * 240 for i in range(LONG_FILES)]
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in names:
            os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    cluster: Cluster = start_cluster(workers=1, **allow(tmp_path))
    fs = cluster.fs()
    fs.client.mount("/long", f"file://{root}", pb.MountOptions(read_only=True, metadata_sync_interval=3600))
    folder = "/long/" + str(deep.relative_to(root))
    # One message could not carry it: the master says so (instead of gRPC's "Sent message
    # larger than max") and stops making it.
    with pytest.raises(ResourceExhausted, match="larger than one message may be .* list it in pages"):
        fs.client.call("ListStatus", pb.ListStatusRequest(path=folder), what=f"ls {folder}")
    expected = sorted(f"{folder}/{name}" for name in names)
    assert fs.find("/long") == expected
    assert fs.ls(folder, detail=False) == expected
    assert [f.path for f in fs.client.ls("/long", recursive=True) if not f.is_dir] == expected
    mnt = mount_fuse(cluster).path
    assert sorted(os.listdir(mnt / "long" / deep.relative_to(root))) == sorted(names)


def test_a_tree_of_many_pages_lists_every_entry_once_with_its_size_through_the_client_and_fuse(
        start_cluster: Any, tmp_path: Path, mount_fuse: Callable[..., FuseProcess]) -> None:
    root = tmp_path / "paged"
    sizes: dict[str, int] = {}
    for folder in range(3):
        (root / f"d{folder}").mkdir(parents=True)
        for i in range(2500):  # a folder is 3 pages of the master's listing (1,000 entries a page)
            rel = f"d{folder}/f{i:05d}"
            sizes[rel] = folder * 3000 + i
            (root / rel).write_bytes(b"x" * sizes[rel])
    cluster: Cluster = start_cluster(workers=1, **allow(tmp_path))
    fs = cluster.fs()
    fs.client.mount("/paged", f"file://{root}", pb.MountOptions(read_only=True, metadata_sync_interval=3600))
    found = fs.find("/paged", detail=True)
    assert {p.removeprefix("/paged/"): e["size"] for p, e in found.items()} == sizes
    assert sum(len(page) for page in fs.client.ls_pages("/paged", recursive=True)) == len(sizes) + 3
    mnt = mount_fuse(cluster).path / "paged"
    listed = [f"{folder}/{name}" for folder in sorted(os.listdir(mnt)) for name in os.listdir(mnt / folder)]
    assert sorted(listed) == sorted(sizes) and len(listed) == len(set(listed))
    stats_before = metric(cluster.master.metrics(), "strata_master_metadata_requests", '{method="GetStatus"}')
    # `ls -l` of each folder: the sizes come from the listing, not a question to the master a file.
    assert {rel: (mnt / rel).stat().st_size for rel in listed} == sizes
    stats_after = metric(cluster.master.metrics(), "strata_master_metadata_requests", '{method="GetStatus"}')
    assert stats_after - stats_before < 10


def test_a_walk_through_fuse_sees_each_folder_as_the_master_lists_it_when_read(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    """FUSE lists the next folders of a walk ahead of it (fuse/prefetch.py): on a writable
    mount (every answer asked for again) a file written by another client after the walk
    began, before it reached the folder, is in that folder's listing."""
    cluster = start_cluster(workers=1)
    for folder in "abc":
        cluster.s3.put_object(bucket, f"{folder}/old", b"x")
    cluster.mount_bucket("/w", bucket, metadata_sync_interval=5)
    mnt = mount_fuse(cluster).path / "w"
    assert sorted(os.listdir(mnt)) == ["a", "b", "c"]  # the walk's first folder: a and b listed ahead
    assert os.listdir(mnt / "a") == ["old"]
    cluster.fs(host="other").pipe_file("/w/b/new", b"written meanwhile")
    assert sorted(os.listdir(mnt / "b")) == ["new", "old"]
    assert (mnt / "b" / "new").read_bytes() == b"written meanwhile"
