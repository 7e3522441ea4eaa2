"""`strata fuse` on real FUSE mounts over a real master, workers and S3 store: what programs
that read and write files see."""

from __future__ import annotations

import concurrent.futures
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from strata.cacheserver import launcher
from strata.cacheserver.fuse.locations import parse_locations
from strata.cacheserver.fuse.mountpoints import MountState, find_mount, mount_state, wait_mounted
from strata.contract import errors
from strata.contract.modes import WriteType
from strata.contract.proto import strata_pb2 as pb

from .conftest import BLOCK_SIZE, Cluster, allow, metric, wait_until
from .test_cluster import payload

FSTYPE = "fuse.strata"
MIB = 1 << 20
WRITE_TYPES = list(WriteType)


def fuse_skip_reason() -> str | None:
    """Why FUSE cannot be mounted here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (no FUSE in this kernel or container)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user"
    if os.geteuid() != 0 and not shutil.which("fusermount3"):
        return "not root and no fusermount3 (install fuse3)"
    return None


pytestmark = [pytest.mark.fuse, pytest.mark.timeout(240),
              pytest.mark.skipif(fuse_skip_reason() is not None, reason=str(fuse_skip_reason()))]


@dataclass
class FuseProcess:
    path: Path
    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float = 20) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"strata fuse at {self.path} did not exit:\n{self.output()[-3000:]}") from None


def start_fuse(cluster: Cluster, mountpoint: Path, *args: str, host: str = "fuse-client",
               wait: bool = True, env: dict[str, str] | None = None) -> FuseProcess:
    """`strata fuse MOUNTPOINT ARGS` as a user runs it (in its own session, as a daemon would be)."""
    try:
        if find_mount(mountpoint) is None:  # a mount there (a dead one, or one kept for a successor) may not answer
            mountpoint.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno != errno.ENOTCONN:  # a dead mount point is for strata fuse to replace
            raise
    log = mountpoint.parent / f"{mountpoint.name}.{time.monotonic_ns()}.log"
    full_env = {**cluster.env, "STRATA_MASTER": cluster.master_address, "STRATA_HOSTNAME": host,
                "STRATA_FUSE_STATE_DIR": str(state_root(mountpoint)), **(env or {})}
    child = launcher.start("strata fuse", launcher.strata_argv("fuse", str(mountpoint), *args), log, env=full_env)
    fuse = FuseProcess(mountpoint, child.process, log)
    if wait:
        try:
            wait_mounted(mountpoint, 30, fstype=FSTYPE, alive=fuse.alive, what="strata fuse")
        except Exception as exc:
            raise AssertionError(f"{exc}\n{fuse.output()[-3000:]}") from exc
    return fuse


def state_root(mountpoint: Path) -> Path:
    """Where the test's mounts keep their state (short: it holds a Unix socket's path)."""
    return mountpoint.parent / "state"


def keeper_pid(mountpoint: Path) -> int:
    """The pid of the keeper holding the mount at `mountpoint` (0: none). The keepers of
    earlier tests' mounts may be removing their state folders meanwhile: those are skipped."""
    for session in state_root(mountpoint).glob("*/session.json"):
        try:
            info = json.loads(session.read_text())
            if info.get("mountpoint") == str(mountpoint.absolute()):
                return int(json.loads((session.parent / "keeper.json").read_text()).get("keeper_pid", 0))
        except FileNotFoundError:
            continue
    return 0


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stop_fuse(fuse: FuseProcess) -> None:
    """Clean up whatever a test left (never raises)."""
    keeper = keeper_pid(fuse.path)
    launcher.stop(fuse.process, grace=15)
    if keeper and alive(keeper):
        os.kill(keeper, signal.SIGKILL)
    if find_mount(fuse.path) is not None:
        subprocess.run(["fusermount3", "-uz", str(fuse.path)], check=False, capture_output=True)


@pytest.fixture
def mount_fuse(tmp_path: Path) -> Iterator[Callable[..., FuseProcess]]:
    started: list[FuseProcess] = []

    def start(cluster: Cluster, *args: str, name: str = "mnt", **kwargs: Any) -> FuseProcess:
        fuse = start_fuse(cluster, tmp_path / name, *args, **kwargs)
        started.append(fuse)
        return fuse

    yield start
    for fuse in reversed(started):
        stop_fuse(fuse)


def store_keys(cluster: Cluster, bucket: str) -> set[str]:
    return {o["Key"] for o in cluster.s3.client().list_objects_v2(Bucket=bucket).get("Contents", [])}


def test_reads_give_the_stores_bytes_and_keep_the_page_cache_of_unchanged_files(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    cluster = start_cluster(workers=1)
    sizes = [0, 1, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 3 * BLOCK_SIZE + 5]
    files = {f"f-{n}": payload(n) for n in sizes}
    for name, data in files.items():
        cluster.s3.put_object(bucket, f"dir/{name}", data)
    cluster.mount_bucket("/data", bucket, metadata_sync_interval=0)
    mnt = mount_fuse(cluster).path
    assert sorted(os.listdir(mnt)) == ["data"]
    assert sorted(os.listdir(mnt / "data" / "dir")) == sorted(files)
    for name, data in files.items():
        path = mnt / "data" / "dir" / name
        assert path.stat().st_size == len(data)
        assert path.read_bytes() == data, name
    big = files[f"f-{3 * BLOCK_SIZE + 5}"]
    with open(mnt / "data" / "dir" / f"f-{3 * BLOCK_SIZE + 5}", "rb") as f:
        for start, end in [(BLOCK_SIZE - 5, BLOCK_SIZE + 5), (3 * BLOCK_SIZE, 3 * BLOCK_SIZE + 5), (7, 70_000)]:
            f.seek(start)
            assert f.read(end - start) == big[start:end]
    with pytest.raises(FileNotFoundError):
        (mnt / "data" / "missing").read_bytes()
    with pytest.raises(IsADirectoryError):
        (mnt / "data" / "dir").read_bytes()
    with pytest.raises(NotADirectoryError):
        os.listdir(mnt / "data" / "dir" / "f-1")

    # Opened again unchanged: the kernel's page cache answers, no worker is asked. (Read once
    # more first: memory pressure or the kernel's proactive reclaim may have dropped pages
    # idle since the reads above; on a loaded machine that happens between two reads now and
    # then, so a few tries: with the page cache dropped at every open, each would ask.)
    def read_from_the_page_cache() -> bool:
        assert (mnt / "data" / "dir" / f"f-{3 * BLOCK_SIZE + 5}").read_bytes() == big
        served = cluster.total_metric("strata_worker_bytes_served")
        assert (mnt / "data" / "dir" / f"f-{3 * BLOCK_SIZE + 5}").read_bytes() == big
        return cluster.total_metric("strata_worker_bytes_served") == served

    assert any(read_from_the_page_cache() for _ in range(3))
    # Changed in the store: the next open sees the new bytes, not the cached pages.
    new = payload(len(big) - 3, seed=1)
    cluster.s3.put_object(bucket, f"dir/f-{3 * BLOCK_SIZE + 5}", new)
    assert (mnt / "data" / "dir" / f"f-{3 * BLOCK_SIZE + 5}").read_bytes() == new


def test_a_subtree_mount_on_a_workers_host_reads_by_short_circuit(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    cluster = start_cluster(workers=1)
    data = payload(2 * BLOCK_SIZE + 3)
    cluster.s3.put_object(bucket, "train/part-0", data)
    cluster.mount_bucket("/datasets/x", bucket)
    mnt = mount_fuse(cluster, "--root", "/datasets/x/train", host="node-0").path
    assert os.listdir(mnt) == ["part-0"]
    before = cluster.total_metric("strata_worker_short_circuit_reads")
    assert (mnt / "part-0").read_bytes() == data
    assert cluster.total_metric("strata_worker_short_circuit_reads") >= before + 3


@pytest.mark.parametrize(("host", "path"), [("node-0", "short_circuit"), ("fuse-client", "data_port")],
                         ids=["short-circuit", "data-port"])
def test_the_bytes_served_to_fuse_mounts_are_counted_apart(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess], host: str, path: str) -> None:
    # The dashboard's "bytes served by path and reader" shows FUSE mounts' reads apart from
    # the Python client's, whichever path they take.
    cluster = start_cluster(workers=1)
    data = payload(2 * BLOCK_SIZE + 3)
    cluster.s3.put_object(bucket, "f.bin", data)
    cluster.mount_bucket("/m", bucket)
    mnt = mount_fuse(cluster, host=host).path

    def served(client: str) -> float:
        return cluster.total_metric("strata_worker_served_bytes", f'{{client="{client}",path="{path}"}}')

    assert (mnt / "m" / "f.bin").read_bytes() == data
    assert served("fuse") >= len(data)
    assert served("fsspec") == 0
    fuse = served("fuse")
    fs = cluster.fs(host=host)
    assert fs.cat_file("/m/f.bin") == data
    assert served("fsspec") >= len(data)
    assert served("fuse") == fuse


@pytest.mark.parametrize("host", ["node-0", "fuse-client"], ids=["short-circuit", "remote-worker"])
def test_threads_reading_one_open_file_at_once_get_the_stores_bytes(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess], host: str) -> None:
    # pyarrow reads a Parquet file's column chunks from several threads through one open
    # file; the kernel turns each into 128 KiB reads of that file, interleaved.
    cluster = start_cluster(workers=1)
    data = payload(6 * BLOCK_SIZE + 5)
    cluster.s3.put_object(bucket, "t/part-0", data)
    cluster.mount_bucket("/t", bucket)
    mnt = mount_fuse(cluster, host=host).path
    piece = 128 * 1024
    starts = [i * BLOCK_SIZE + 1000 * i for i in range(6)]  # one reader per block, across its end

    with open(mnt / "t" / "t" / "part-0", "rb") as f, cluster.s3.recording() as rec:
        def read(start: int) -> bytes:
            end = min(start + BLOCK_SIZE, len(data))
            return b"".join(os.pread(f.fileno(), min(piece, end - off), off) for off in range(start, end, piece))

        with concurrent.futures.ThreadPoolExecutor(len(starts)) as pool:
            got = list(pool.map(read, starts))
    for start, chunk in zip(starts, got):
        assert chunk == data[start:start + BLOCK_SIZE], f"reader at {start}"
    gets = rec.matching("GET", f"/{bucket}/t/part-0")
    assert len(gets) == 7, [(g.url, g.range) for g in gets]  # each block once


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may write the mount's readahead in sysfs")
def test_the_kernel_reads_the_mount_ahead_a_mebibyte_at_a_time(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    # Its default, 128 KiB, makes sequential reads of cached files a third slower.
    cluster = start_cluster(workers=1)
    cluster.mount_bucket("/d", bucket)
    mnt = mount_fuse(cluster).path
    entry = find_mount(mnt)
    assert entry is not None
    readahead = Path("/sys/class/bdi") / entry.device / "read_ahead_kb"
    wait_until(lambda: readahead.read_text().strip() == "1024", 10, f"{readahead} to be 1024")


def test_files_written_through_the_mount_use_its_write_type(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    cluster = start_cluster(workers=1)
    cluster.mount_bucket("/w", bucket, write_type=pb.THROUGH)
    fs = cluster.fs()
    data = payload(2 * BLOCK_SIZE + 11)
    for write_type in [*WRITE_TYPES, ""]:
        mnt = mount_fuse(cluster, *(["--write-type", write_type] if write_type else []),
                         name=f"mnt-{write_type or 'default'}").path
        name = f"out-{write_type or 'default'}.bin"
        with open(mnt / "w" / name, "wb") as f:
            f.write(data[:1000])
            f.write(b"x" * (len(data) - 1000))
            f.seek(1000)  # seek back and rewrite: the buffered write takes any pattern
            f.write(data[1000:])
        info = fs.info(f"/w/{name}")
        assert info["size"] == len(data)
        effective = write_type or "THROUGH"  # the Strata mount's write type
        if effective == "MUST_CACHE":
            assert not info["persisted"] and name not in store_keys(cluster, bucket)
        elif effective == "ASYNC_THROUGH":
            wait_until(lambda: fs.info(f"/w/{name}")["persisted"], 30, "the async write to be persisted")
        else:
            assert info["persisted"]
        if effective != "MUST_CACHE":
            assert cluster.s3.get_object(bucket, name) == data
        expect_cached = 0 if effective == "THROUGH" else len(data)
        wait_until(lambda: fs.info(f"/w/{name}")["cached_bytes"] == expect_cached, 10,
                   f"{expect_cached} cached bytes of a {write_type or 'default'} write")
        assert (mnt / "w" / name).read_bytes() == data
        assert fs.cat_file(f"/w/{name}") == data


def test_directories_renames_truncation_and_deletion(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    cluster = start_cluster(workers=1)
    cluster.s3.put_object(bucket, "keep/old.txt", b"old contents")
    cluster.mount_bucket("/d", bucket, write_type=pb.CACHE_THROUGH)
    root = mount_fuse(cluster).path / "d"
    (root / "new" / "deeper").mkdir(parents=True)  # exists here until a file lands below it
    assert (root / "new" / "deeper").is_dir() and "new" in os.listdir(root)
    with pytest.raises(FileExistsError):
        (root / "new").mkdir()
    (root / "new" / "deeper" / "a.txt").write_bytes(b"A")
    subprocess.run(["cp", str(root / "keep" / "old.txt"), str(root / "new" / "copy.txt")], check=True)
    assert store_keys(cluster, bucket) >= {"new/deeper/a.txt", "new/copy.txt"}

    os.rename(root / "new" / "copy.txt", root / "new" / "moved.txt")
    assert not (root / "new" / "copy.txt").exists() and (root / "new" / "moved.txt").read_bytes() == b"old contents"
    (root / "new" / "other.txt").write_bytes(b"other")
    os.replace(root / "new" / "other.txt", root / "new" / "moved.txt")  # rename(2) over an existing file
    assert (root / "new" / "moved.txt").read_bytes() == b"other"
    assert cluster.s3.get_object(bucket, "new/moved.txt") == b"other"

    with open(root / "keep" / "old.txt", "ab") as f:  # append: the rest of the file is kept
        f.write(b" and more")
    assert cluster.s3.get_object(bucket, "keep/old.txt") == b"old contents and more"
    os.truncate(root / "keep" / "old.txt", 3)
    assert (root / "keep" / "old.txt").read_bytes() == b"old"
    assert cluster.s3.get_object(bucket, "keep/old.txt") == b"old"

    with pytest.raises(OSError) as busy:
        (root / "new").rmdir()
    assert busy.value.errno == errno.ENOTEMPTY
    (root / "empty").mkdir()
    (root / "empty").rmdir()
    assert not (root / "empty").exists()
    os.unlink(root / "new" / "moved.txt")
    assert not (root / "new" / "moved.txt").exists()
    assert "new/moved.txt" not in store_keys(cluster, bucket)
    # Modes, owners and times come from the store; setting them is accepted and changes nothing.
    subprocess.run(["touch", str(root / "keep" / "old.txt")], check=True)
    os.chmod(root / "keep" / "old.txt", 0o600)


def test_read_only_mounts_refuse_changes_with_erofs(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    cluster = start_cluster(workers=1)
    cluster.s3.put_object(bucket, "ro/file", b"data")
    cluster.s3.put_object(bucket, "rw/file", b"data")
    cluster.mount_bucket("/ro", bucket, read_only=True)  # read-only in Strata
    cluster.fs().client.mount("/rw", f"s3://{bucket}/rw", pb.MountOptions(options=cluster.s3.storage_options()))
    flagged = mount_fuse(cluster, "--read-only", name="flagged").path  # read-only by the flag
    plain = mount_fuse(cluster, name="plain").path
    assert find_mount(flagged).read_only  # type: ignore[union-attr]
    for target in (flagged / "rw", plain / "ro" / "ro"):
        assert (target / "file").read_bytes() == b"data"
        changes: list[Callable[[], object]] = [
            lambda: (target / "file").write_bytes(b"x"),
            lambda: (target / "new").write_bytes(b"x"),
            lambda: os.unlink(target / "file"),
            lambda: os.mkdir(target / "dir"),
            lambda: os.rename(target / "file", target / "moved"),
            lambda: os.truncate(target / "file", 0),
        ]
        for change in changes:
            with pytest.raises(OSError) as refused:
                change()
            assert refused.value.errno == errno.EROFS, (target, refused.value)
    assert cluster.s3.get_object(bucket, "ro/file") == b"data"
    (plain / "rw" / "new").write_bytes(b"writable")  # the same process writes where it may
    assert cluster.s3.get_object(bucket, "rw/new") == b"writable"


def test_block_locations_are_an_extended_attribute(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    cluster = start_cluster(workers=2)
    data = payload(3 * BLOCK_SIZE + 100)
    cluster.s3.put_object(bucket, "f.bin", data)
    cluster.mount_bucket("/x", bucket)
    mnt = mount_fuse(cluster).path
    path = mnt / "x" / "f.bin"
    assert path.read_bytes() == data
    fs = cluster.fs()

    def all_cached() -> bool:
        return all(b["hosts"] for b in fs.block_locations("/x/f.bin"))

    wait_until(all_cached, 10, "every block to be reported cached")
    value = subprocess.run(["getfattr", "--only-values", "-n", "user.strata.locations", str(path)],
                           check=True, capture_output=True, text=True).stdout
    blocks = parse_locations(value)
    assert [(b.offset, b.length, sorted(b.hosts)) for b in blocks] == [
        (b["offset"], b["length"], sorted(b["hosts"])) for b in fs.block_locations("/x/f.bin")]
    assert len(blocks) == 4 and {h for b in blocks for h in b.hosts} <= {"node-0", "node-1"}
    assert "user.strata.locations" in os.listxattr(path)
    assert os.listxattr(mnt / "x") == []
    with pytest.raises(OSError) as missing:
        os.getxattr(path, "user.other")
    assert missing.value.errno == errno.ENODATA


def test_sigterm_writes_open_files_and_unmounts(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    cluster = start_cluster(workers=1)
    cluster.mount_bucket("/t", bucket, write_type=pb.CACHE_THROUGH)
    fuse = mount_fuse(cluster)
    f = open(fuse.path / "t" / "open.txt", "wb")  # noqa: SIM115 - held open across the signal
    f.write(b"written before SIGTERM")
    f.flush()
    os.kill(fuse.process.pid, signal.SIGTERM)
    wait_until(lambda: "open.txt" in store_keys(cluster, bucket), 20, "the open file to be written")
    assert cluster.s3.get_object(bucket, "open.txt") == b"written before SIGTERM"
    f.close()  # the mount was detached lazily while busy; the last close lets the process end
    assert fuse.wait() == 0
    assert find_mount(fuse.path) is None
    assert "unmounted" in fuse.output()

    idle = mount_fuse(cluster, name="idle")
    started = time.monotonic()
    os.kill(idle.process.pid, signal.SIGTERM)
    assert idle.wait() == 0
    assert find_mount(idle.path) is None and time.monotonic() - started < 5


def test_a_dead_mount_point_is_replaced_by_the_next_mount(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    cluster = start_cluster(workers=1)
    cluster.s3.put_object(bucket, "f", b"still here")
    cluster.mount_bucket("/c", bucket)
    first = mount_fuse(cluster)
    second = start_fuse(cluster, first.path, wait=False)  # the mount point is taken
    assert second.wait() == 1 and "already a Strata mount" in second.output()

    # The keeper dies first, then the FUSE process (as when a container is killed): nothing
    # holds the connection, the mount point is left dead.
    keeper = keeper_pid(first.path)
    assert keeper and alive(keeper)
    os.kill(keeper, signal.SIGKILL)
    wait_until(lambda: not alive(keeper), 10, "the keeper to die")
    os.kill(first.process.pid, signal.SIGKILL)
    first.wait()
    assert mount_state(first.path) is MountState.STALE
    with pytest.raises(OSError) as dead:
        os.listdir(first.path)
    assert dead.value.errno == errno.ENOTCONN
    replacement = mount_fuse(cluster)
    assert (replacement.path / "c" / "f").read_bytes() == b"still here"
    assert "stale mount point" in replacement.output()


# -- the mount as tools use it ---------------------------------------------------------------------


def test_tools_remove_folders_that_exist_only_as_key_prefixes(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    cluster = start_cluster(workers=1)
    for tree in ("by-rm", "by-rmtree", "by-find"):
        for key in ("a/b/f1", "a/f2", "c/f3", "top"):
            cluster.s3.put_object(bucket, f"{tree}/{key}", b"x")
    cluster.s3.put_object(bucket, "keep/only", b"x")
    cluster.mount_bucket("/p", bucket, metadata_sync_interval=30)
    mnt = mount_fuse(cluster).path / "p"
    assert sorted(os.listdir(mnt / "by-rm")) == ["a", "c", "top"]

    subprocess.run(["rm", "-r", str(mnt / "by-rm")], check=True, capture_output=True, timeout=60)
    shutil.rmtree(mnt / "by-rmtree")
    subprocess.run(["find", str(mnt / "by-find"), "-delete"], check=True, capture_output=True, timeout=60)
    for tree in ("by-rm", "by-rmtree", "by-find"):
        assert not (mnt / tree).exists()
    assert os.listdir(mnt) == ["keep"]
    assert store_keys(cluster, bucket) == {"keep/only"}

    # An emptied folder stays a folder until it is removed, as on a disk.
    os.unlink(mnt / "keep" / "only")
    assert (mnt / "keep").is_dir() and os.listdir(mnt / "keep") == []
    os.rmdir(mnt / "keep")
    assert not (mnt / "keep").exists()


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed (scripts/install-system-deps.sh)")
def test_rsync_into_the_mount_twice_sends_nothing_the_second_time(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess], tmp_path: Path) -> None:
    cluster = start_cluster(workers=1)
    cluster.mount_bucket("/r", bucket)
    mnt = mount_fuse(cluster).path / "r"
    source = tmp_path / "source"
    files = {"a.txt": b"alpha", "sub/b.bin": payload(70_000), "sub/deeper/c": b""}
    for i, (name, data) in enumerate(sorted(files.items())):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)
        os.utime(source / name, ns=(1_600_000_000_000_000_000 + i * 10**9,) * 2)

    def rsync() -> int:
        result = subprocess.run(["rsync", "-a", "--stats", f"{source}/", f"{mnt}/copy/"], capture_output=True,
                                timeout=120, text=True)
        assert result.returncode == 0, result.stderr
        sent = [line for line in result.stdout.splitlines() if line.startswith("Number of regular files transferred")]
        return int(sent[0].split(":")[1].replace(",", ""))

    assert rsync() == 3
    for name, data in files.items():
        assert (mnt / "copy" / name).read_bytes() == data
        assert (mnt / "copy" / name).stat().st_mtime_ns == (source / name).stat().st_mtime_ns
    assert rsync() == 0

    touched = mnt / "copy" / "a.txt"
    subprocess.run(["touch", "-a", str(touched)], check=True, timeout=30)  # the access time only
    assert touched.stat().st_mtime_ns == (source / "a.txt").stat().st_mtime_ns
    subprocess.run(["touch", str(touched)], check=True, timeout=30)  # now
    assert abs(touched.stat().st_mtime - time.time()) < 60
    assert touched.read_bytes() == b"alpha"


def test_inode_numbers_stay_the_same_across_remounts(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    cluster = start_cluster(workers=1)
    for key in ("d/one", "d/two", "three"):
        cluster.s3.put_object(bucket, key, b"x")
    cluster.mount_bucket("/i", bucket)
    names = ["i", "i/d", "i/d/one", "i/d/two", "i/three"]
    first = mount_fuse(cluster, name="first")
    before = {n: (first.path / n).stat().st_ino for n in names}
    listed = {e.name: e.inode() for e in os.scandir(first.path / "i" / "d")}
    stop_fuse(first)
    second = mount_fuse(cluster, name="second")
    after = {n: (second.path / n).stat().st_ino for n in reversed(names)}  # the kernel numbers in order
    assert after == before
    assert len(set(before.values())) == len(names)
    assert listed == {"one": before["i/d/one"], "two": before["i/d/two"]}


def test_listing_and_stat_agree_on_a_file_put_into_the_store(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    cluster = start_cluster(workers=1)
    cluster.s3.put_object(bucket, "e/old", b"x")
    sync = 5.0
    cluster.mount_bucket("/l", bucket, metadata_sync_interval=sync)
    mnt = mount_fuse(cluster).path / "l"
    time.sleep(sync + 0.5)  # what the master learnt at mount time (a walk of the store) is stale now

    # Looked up (absent), then put into the store directly, then listed: the listing is the
    # newer answer, and a stat must not contradict it with the older one.
    assert not (mnt / "e" / "new").exists()
    cluster.s3.put_object(bucket, "e/new", b"new bytes")
    listed = "new" in os.listdir(mnt / "e")
    readable = (mnt / "e" / "new").exists()
    assert listed and readable, f"stat says {readable}, ls says {listed}"
    assert (mnt / "e" / "new").read_bytes() == b"new bytes"


def test_the_kernel_answers_a_read_only_folders_listing_while_it_stands_then_lists_it_anew(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    """A read-only mount's folder listed again within its sync interval is answered by the
    kernel's copy (a walk repeated, each epoch of a loader that indexes its dataset, asks the
    master nothing); a file put into the store shows once the master has synced."""
    cluster = start_cluster(workers=1)
    cluster.s3.put_object(bucket, "d/old", b"x")
    sync = 3.0
    cluster.mount_bucket("/k", bucket, metadata_sync_interval=sync, read_only=True)
    mnt = mount_fuse(cluster, "--read-only").path / "k" / "d"

    def listings() -> float:
        return metric(cluster.master.metrics(), "strata_master_metadata_requests", '{method="ListStatus"}')

    assert os.listdir(mnt) == ["old"]
    before = listings()
    for _ in range(20):
        assert os.listdir(mnt) == ["old"]
    assert listings() - before <= 2  # the listing stood (once more at most: a sync came meanwhile)
    cluster.s3.put_object(bucket, "d/new", b"new bytes")
    wait_until(lambda: sorted(os.listdir(mnt)) == ["new", "old"], 4 * sync, "the new file listed after a sync")
    assert (mnt / "new").read_bytes() == b"new bytes"


def test_a_file_changed_while_open_never_mixes_versions_in_the_page_cache(
        start_cluster: Any, tmp_path: Path, mount_fuse: Callable[..., FuseProcess]) -> None:
    # The kernel keeps one page cache per file, whichever open file filled it. A file
    # opened before a change reads the old version (its handle's), one opened after it the
    # new one: neither may get the other's pages. The two versions differ in less than the
    # millisecond of the times a mount shows, so only their versions tell them apart.
    source = tmp_path / "source"
    source.mkdir()
    cluster = start_cluster(workers=1, **allow(tmp_path))
    cluster.fs().client.mount("/local", f"file://{source}", pb.MountOptions(metadata_sync_interval=0))
    target = source / "f.bin"
    old, new = payload(2 * BLOCK_SIZE), payload(2 * BLOCK_SIZE, seed=1)
    millisecond = time.time_ns() // 1_000_000 * 1_000_000
    target.write_bytes(old)
    os.utime(target, ns=(millisecond + 100_000, millisecond + 100_000))
    mnt = mount_fuse(cluster).path
    before = os.open(mnt / "local" / "f.bin", os.O_RDONLY)
    try:
        assert os.pread(before, len(old), 0) == old  # its blocks cached, its pages too
        target.write_bytes(new)  # in place, the same length
        os.utime(target, ns=(millisecond + 600_000, millisecond + 600_000))
        after = os.open(mnt / "local" / "f.bin", os.O_RDONLY)
        try:
            assert os.pread(before, len(old), 0) == old  # pages of the old version again
            assert os.pread(after, len(new), 0) == new, "a file opened after a change read the old version's pages"
            assert os.pread(before, len(old), 0) == old
        finally:
            os.close(after)
    finally:
        os.close(before)
    assert (mnt / "local" / "f.bin").read_bytes() == new


def test_an_open_from_a_held_status_goes_on_as_the_new_version_where_the_page_cache_allows(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess]) -> None:
    """A read-only mount's status is held by the FUSE process (its lookups and opens ask the
    master once). The file changes in the store (the same length) and another client's read
    makes the master notice: an open from the held status, whose first read is refused, goes
    on as the new version (the only handle of the file, its page cache dropped at open)."""
    cluster = start_cluster(workers=1)
    old, new = payload(1000), payload(1000, seed=1)
    cluster.s3.put_object(bucket, "f.bin", old)
    cluster.mount_bucket("/ro", bucket, read_only=True, metadata_sync_interval=3600)
    mnt = mount_fuse(cluster).path
    assert (mnt / "ro" / "f.bin").stat().st_size == len(old)  # looked up: its status is held
    status = cluster.fs().client.stat("/ro/f.bin")
    cluster.s3.put_object(bucket, "f.bin", new)
    other = cluster.fs(host="other")
    with pytest.raises(errors.FailedPrecondition, match="open it again"):
        other.client.read_block(other.client.block_ref(status, 0))
    assert (mnt / "ro" / "f.bin").read_bytes() == new
    assert (mnt / "ro" / "f.bin").read_bytes() == new



# -- a file that changed length in the store ------------------------------------------------------

# Reads a file through a shared mapping of the size fstat(2) shows, as programs that map
# their data files do.
MMAP_READER = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
with mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ) as m:
    sys.stdout.buffer.write(m[:])
"""


def read_as(how: str, path: Path, tmp: Path) -> bytes:
    """The file at `path` as a program reads it: whole (Python), by cp, by a mapping of its size."""
    if how == "cp":
        copy = tmp / f"copy-{time.monotonic_ns()}"
        subprocess.run(["cp", str(path), str(copy)], check=True, timeout=60)
        return copy.read_bytes()
    if how == "mmap":
        mapped = subprocess.run([sys.executable, "-c", MMAP_READER, str(path)], capture_output=True, timeout=60)
        assert mapped.returncode == 0, f"the mapping's reader ended with {mapped.returncode}: {mapped.stderr[-500:]!r}"
        return mapped.stdout
    return path.read_bytes()


def differs(got: bytes, want: bytes) -> str:
    """'' if equal, else where and how `got` differs from `want` (a short message, not 4 MiB)."""
    if got == want:
        return ""
    at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"{len(got)} bytes, not {len(want)}; first difference at byte {at}"


def change_behind_the_kernel(cluster: Any, bucket: str, tmp_path: Path, store: str, old: bytes, new: bytes,
                             start: Callable[..., FuseProcess], *args: str) -> Path:
    """A file of a mount synced every minute, looked at through a FUSE mount (the kernel holds
    its size for that minute), then replaced in the store with `new`; another client's read
    makes the master notice. The file's path in the FUSE mount."""
    if store == "file":
        source = tmp_path / "source"
        source.mkdir()
        (source / "f.bin").write_bytes(old)
        cluster.fs().client.mount("/m", f"file://{source}", pb.MountOptions(metadata_sync_interval=60))
    else:
        cluster.s3.put_object(bucket, "f.bin", old)
        cluster.mount_bucket("/m", bucket, metadata_sync_interval=60)
    path = start(cluster, *args).path / "m" / "f.bin"
    assert path.stat().st_size == len(old)
    status = cluster.fs().client.stat("/m/f.bin")
    if store == "file":
        (tmp_path / "source" / "f.bin").write_bytes(new)
    else:
        cluster.s3.put_object(bucket, "f.bin", new)
    other = cluster.fs(host="other")
    with pytest.raises(errors.FailedPrecondition):
        other.client.read_block(other.client.block_ref(status, 0))
    return path


@pytest.mark.parametrize("how", ["read", "cp", "mmap"])
@pytest.mark.parametrize("change", ["longer", "shorter"])
@pytest.mark.parametrize("store", ["s3", "file"])
def test_a_file_that_changed_length_in_the_store_reads_whole_at_its_new_length(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess], tmp_path: Path, store: str,
        change: str, how: str) -> None:
    """The kernel holds the size it was last told of a file for the mount's metadata interval,
    and cuts reads through its page cache there. An open that finds the file at another
    length must read it whole, to its new end, and fstat must show that end."""
    cluster = start_cluster(workers=1, **allow(tmp_path))
    old = payload(BLOCK_SIZE + 100_000)
    new = payload(len(old) + 300_000 if change == "longer" else len(old) - 300_000)
    path = change_behind_the_kernel(cluster, bucket, tmp_path, store, old, new, mount_fuse)
    assert differs(read_as(how, path, tmp_path), new) == ""
    with open(path, "rb") as f:
        assert os.fstat(f.fileno()).st_size == len(new)


@pytest.mark.parametrize("change", ["longer", "shorter"])
def test_every_read_of_a_read_only_mount_gets_the_new_length(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess], tmp_path: Path, change: str) -> None:
    """On a read-only FUSE mount a read does not make the kernel ask for the file's attributes
    again (it keeps no access time): without a word from Strata every open of that minute
    would read the file cut at its old size. (The kernel opens the files of a read-only mount
    without asking, see test_fuse_kernel_reads.py: the first read of the old version, which
    the store no longer has, fails; the kernel is told of the new one then.)"""
    cluster = start_cluster(workers=1)
    old = payload(BLOCK_SIZE + 100_000)
    new = payload(len(old) + 300_000 if change == "longer" else len(old) - 300_000)
    path = change_behind_the_kernel(cluster, bucket, tmp_path, "s3", old, new, mount_fuse, "--read-only")
    try:
        first = path.read_bytes()
    except OSError as exc:
        assert exc.errno == errno.EIO, exc
    else:
        assert differs(first, new) == ""
    wait_until(lambda: differs(path.read_bytes(), new) == "", 10, "the kernel to be told of the new version")
    for _ in range(3):
        assert differs(path.read_bytes(), new) == ""
        assert differs(read_as("mmap", path, tmp_path), new) == ""


@pytest.mark.parametrize("change", ["longer", "shorter"])
def test_appending_to_a_file_that_changed_length_in_the_store_appends_at_its_end(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess], tmp_path: Path, change: str) -> None:
    """The kernel places a write to a file opened with O_APPEND at the size it holds: a size
    older than the file in the store would overwrite its middle, or leave a hole of zeros."""
    cluster = start_cluster(workers=1)
    old = payload(BLOCK_SIZE + 100_000)
    new = payload(len(old) + 300_000 if change == "longer" else len(old) - 300_000)
    path = change_behind_the_kernel(cluster, bucket, tmp_path, "s3", old, new, mount_fuse)
    subprocess.run(["sh", "-c", 'printf "appended" >> "$1"', "sh", str(path)], check=True, timeout=60)
    assert differs(cluster.s3.get_object(bucket, "f.bin"), new + b"appended") == ""
    assert differs(path.read_bytes(), new + b"appended") == ""


@pytest.mark.parametrize("read_only", [False, True], ids=["read-write", "read-only"])
@pytest.mark.parametrize("change", ["longer", "shorter"])
def test_a_file_changed_while_open_reads_whole_at_each_version(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess], tmp_path: Path, change: str,
        read_only: bool) -> None:
    """A file open at its old version while it changes length in the store: an open of the
    new version reads around the page cache (direct I/O) to the new end, and the file opened
    before goes on reading the old version through the page cache, to the old end (the
    kernel holds one size of the file, and cuts reads through the page cache there). A
    read-only mount whose metadata is reused lets the kernel open files without asking, one
    version of a file at a time (see test_fuse_kernel_reads.py): here it asks, timeout 0."""
    cluster = start_cluster(workers=1)
    old = payload(8 * BLOCK_SIZE + 100_000)
    new = payload(len(old) + 300_000 if change == "longer" else BLOCK_SIZE + 100)
    cluster.s3.put_object(bucket, "f.bin", old)
    cluster.mount_bucket("/m", bucket, metadata_sync_interval=60)
    path = mount_fuse(cluster, *(["--read-only", "--attr-timeout", "0"] if read_only else [])).path / "m" / "f.bin"
    with open(path, "rb", buffering=0) as before:
        seen = 3 * BLOCK_SIZE  # these blocks cached (and the next ones read ahead)
        assert differs(b"".join(os.pread(before.fileno(), MIB, at) for at in range(0, seen, MIB)), old[:seen]) == ""
        opened = cluster.fs().client.stat("/m/f.bin")  # the old version (the master may learn of
        cluster.s3.put_object(bucket, "f.bin", new)    # the new one at once: a read-ahead meets it)
        other = cluster.fs(host="other")
        with pytest.raises(errors.FailedPrecondition):  # the old version's last block, not read yet
            other.client.read_block(other.client.block_ref(opened, 8))
        for how in ("read", "cp"):
            assert differs(read_as(how, path, tmp_path), new) == "", how
        for at in (10, 2 * BLOCK_SIZE + 10):  # within the old version's cached blocks, past the new end
            assert differs(os.pread(before.fileno(), MIB, at), old[at:at + MIB]) == "", at
