"""`strata fuse --read-only --passthrough DIR:SIZE`: the kernel reads large files itself from
whole local copies (FUSE passthrough), checked before they are handed to it, bounded in bytes,
and never of another version than the one opened. Real mounts over a real master, worker and
S3 store; the kernel's own passthrough (this machine's kernel has it: the tests say so and
fail where it does not)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import BLOCK_SIZE, wait_until
from .test_cluster import payload
from .test_fuse import FuseProcess, fuse_skip_reason, mount_fuse  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(240),
              pytest.mark.skipif(fuse_skip_reason() is not None, reason=str(fuse_skip_reason())),
              pytest.mark.skipif(os.geteuid() != 0, reason="passthrough needs CAP_SYS_ADMIN")]

# Opens the file, says so, waits for a line on stdin, then drops what the kernel holds of the
# file's pages and reads it whole: its sha256. A file passed through is read from its local
# copy; one read through the FUSE page cache asks the FUSE process for every page.
READER = """
import hashlib, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
print("opened", flush=True)
sys.stdin.readline()
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
data = b""
while chunk := os.read(fd, 1 << 20):
    data += chunk
print(hashlib.sha256(data).hexdigest(), flush=True)
"""


def copies(folder: Path) -> list[Path]:
    """The finished copies in the passthrough folder (any mount's)."""
    return [p for p in folder.glob("mount-*/*") if not p.name.endswith(".tmp")]


def copied(path: Path, data: bytes, folder: Path, count: int = 1) -> list[Path]:
    """Open and read `path` (each time its bytes) until `count` copies are in `folder`: a copy
    is made at an open once the master says every block of the version is on this node."""
    def read_and_look() -> list[Path]:
        assert read(path) == data
        found = copies(folder)
        return found if len(found) >= count else []
    return wait_until(read_and_look, 60, f"{count} cop{'ies' if count > 1 else 'y'} of {path.name}", interval=0.5)


def read(path: Path) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.readall()


def read_with_server_stopped(fuse: FuseProcess, path: Path) -> str | None:
    """The file's sha256, opened while the FUSE process answers and read whole while it is
    stopped (SIGSTOP); None when the reads waited for it (they reached the FUSE process)."""
    reader = subprocess.Popen([sys.executable, "-c", READER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert reader.stdout is not None and reader.stdin is not None
    assert reader.stdout.readline().strip() == "opened"
    os.kill(fuse.process.pid, signal.SIGSTOP)
    try:
        reader.stdin.write("go\n")
        reader.stdin.flush()
        try:
            out, _ = reader.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            return None
        return out.strip()
    finally:
        os.kill(fuse.process.pid, signal.SIGCONT)
        if reader.poll() is None:
            reader.communicate(timeout=60)


def sha256(data: bytes) -> str:
    import hashlib
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def passthrough_mount(start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess],  # noqa: F811
                      tmp_path: Path) -> Callable[..., tuple[Any, FuseProcess, Path]]:
    def start(files: dict[str, bytes], room: str = "64Mi", sync: float = 300) -> tuple[Any, FuseProcess, Path]:
        cluster = start_cluster(workers=1)
        for name, data in files.items():
            cluster.s3.put_object(bucket, f"set/{name}", data)
        cluster.mount_bucket("/ds", bucket, read_only=True, metadata_sync_interval=sync)
        folder = tmp_path / "copies"
        # On the worker's node: a file is copied once every block of it is there.
        fuse = mount_fuse(cluster, "--read-only", "--root", "/ds", "--passthrough", f"{folder}:{room}", host="node-0")
        return cluster, fuse, folder
    return start


def test_a_large_file_is_read_by_the_kernel_from_its_checked_copy_once_copied(
        passthrough_mount: Callable[..., tuple[Any, FuseProcess, Path]]) -> None:
    data, small = payload(2 * BLOCK_SIZE + 12345), payload(1000)
    _, fuse, folder = passthrough_mount({"big.bin": data, "small.bin": small})
    path = fuse.path / "set" / "big.bin"
    assert read(path) == data  # the first open reads through the page cache
    copied(path, data, folder)  # an open once the blocks are known to be here has it copied
    # The next open passes the file through: its reads never reach the FUSE process.
    assert read_with_server_stopped(fuse, path) == sha256(data), fuse.output()[-3000:]
    assert read(fuse.path / "set" / "small.bin") == small
    assert len(copies(folder)) == 1, "a file under 1 MiB is not copied"


def resident(path: Path) -> int:
    """Bytes of the file in the page cache."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         check=True, capture_output=True, text=True).stdout
    return int(out.strip())


def test_a_readahead_hint_on_a_file_passed_through_warms_its_copy(
        passthrough_mount: Callable[..., tuple[Any, FuseProcess, Path]]) -> None:
    # Readers such as pyarrow give posix_fadvise(WILLNEED) before they read: the kernel turns
    # it into reads for the FUSE file's own page cache, which no read of a file passed through
    # uses (fetched, each cost the FUSE process a MiB); the copy is what the reads will want.
    data = payload(2 * BLOCK_SIZE + 12345)
    _, fuse, folder = passthrough_mount({"big.bin": data})
    path = fuse.path / "set" / "big.bin"
    copied(path, data, folder)
    with open(path, "rb", buffering=0) as f:  # passed through (and its copy registered)
        (copy,) = copies(folder)
        fd = os.open(copy, os.O_RDONLY)
        try:
            def dropped() -> bool:  # (its last pages' write-out is only started when it is whole,
                os.fsync(fd)        # and a copy written out of order is read back once)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                return resident(copy) == 0

            wait_until(dropped, 10, "the copy's pages dropped")
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
            wait_until(lambda: resident(copy) > 0, 10, "the hint given to the copy")
        finally:
            os.close(fd)
        assert f.readall() == data
    assert read(path) == data


def test_a_damaged_copy_is_never_handed_to_the_kernel(
        passthrough_mount: Callable[..., tuple[Any, FuseProcess, Path]]) -> None:
    data = payload(3 * BLOCK_SIZE)
    _, fuse, folder = passthrough_mount({"big.bin": data})
    path = fuse.path / "set" / "big.bin"
    (copy,) = copied(path, data, folder)
    with open(copy, "r+b") as f:  # the disk under the copy changed a byte
        f.seek(BLOCK_SIZE + 7)
        original = f.read(1)
        f.seek(BLOCK_SIZE + 7)
        f.write(bytes([original[0] ^ 0xFF]))
    assert read(path) == data
    assert "failed its check" in fuse.output()
    assert not copy.exists() or copy.read_bytes() == data  # removed (made anew by that read, perhaps)
    # Copied again at a later open, checked at the one after, and passed through.
    copied(path, data, folder)
    assert read(path) == data
    assert read_with_server_stopped(fuse, path) == sha256(data), fuse.output()[-3000:]


def test_copies_stay_within_their_room_and_every_file_reads_right(
        passthrough_mount: Callable[..., tuple[Any, FuseProcess, Path]]) -> None:
    files = {f"f{i}.bin": payload(BLOCK_SIZE + 1000 * i, i) for i in range(5)}
    room = 2 * BLOCK_SIZE + 10_000  # two of the files fit
    _, fuse, folder = passthrough_mount(files, room=str(room))
    for _ in range(3):
        for name, data in files.items():
            assert read(fuse.path / "set" / name) == data
            assert sum(p.stat().st_size for p in copies(folder)) <= room
    kept = copied(fuse.path / "set" / "f4.bin", files["f4.bin"], folder)
    assert len(kept) <= 2 and sum(p.stat().st_size for p in kept) <= room
    # A file whose copy is kept (its name carries its backing id once passed through) reads right.
    for name, data in files.items():
        assert read(fuse.path / "set" / name) == data


def test_a_file_changed_in_the_store_is_read_at_its_new_version(
        passthrough_mount: Callable[..., tuple[Any, FuseProcess, Path]], bucket: str) -> None:
    old, new = payload(2 * BLOCK_SIZE, 1), payload(2 * BLOCK_SIZE + 3, 2)
    cluster, fuse, folder = passthrough_mount({"big.bin": old}, sync=0)
    path = fuse.path / "set" / "big.bin"
    copied(path, old, folder)
    assert read(path) == old  # passed through
    cluster.s3.put_object(bucket, "set/big.bin", new)
    wait_until(lambda: read(path) == new, 30, "the new version read")
    copied(path, new, folder, count=2)
    assert read_with_server_stopped(fuse, path) == sha256(new), fuse.output()[-3000:]
