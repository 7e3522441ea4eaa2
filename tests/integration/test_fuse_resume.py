"""A `strata fuse` mount outlives the process serving it (issue 13): killed under a reader and
started again on the same mount point, it resumes; never restarted, its readers get an error
after the resume timeout, not a hang; a write cut off by the crash fails, never corrupts; a
server or successor that is stopped or hangs gives its readers an error in bounded time."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from strata.cacheserver.fuse.kernel import connection_of
from strata.cacheserver.fuse.mountkeeper import read_json
from strata.cacheserver.fuse.mountpoints import find_mount, wait_unmounted
from strata.contract.proto import strata_pb2 as pb

from .conftest import BLOCK_SIZE, Cluster, allow, wait_until
from .test_cluster import payload
from .test_fuse import FuseProcess, alive, fuse_skip_reason, keeper_pid, mount_fuse, state_root  # noqa: F401 - a fixture

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300),
              pytest.mark.skipif(fuse_skip_reason() is not None, reason=str(fuse_skip_reason())),
              # The tests watch a connection's waiting requests in /sys/fs/fuse/connections (fusectl).
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root (fusectl)")]

# Reads a file through the mount in a loop (the page cache dropped before each pass, so every
# byte comes from the FUSE server), checks each pass's SHA-256, notes errors and the longest
# wait for one read; writes its tally to OUT after each pass. Stops when STOP exists, or at the
# first error if asked to.
READER = r"""
import hashlib, json, os, sys, time
path, expected, out, stop, stop_on_error = sys.argv[1:6]
tally = {"passes": 0, "mismatches": 0, "errors": [], "max_stall": 0.0}
last = time.monotonic()
def save():
    with open(out + ".new", "w") as f:
        json.dump(tally, f)
    os.replace(out + ".new", out)
save()
while not os.path.exists(stop):
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            digest = hashlib.sha256()
            while True:
                chunk = os.read(fd, 1 << 20)
                now = time.monotonic()
                tally["max_stall"] = max(tally["max_stall"], now - last)
                last = now
                if not chunk:
                    break
                digest.update(chunk)
        finally:
            os.close(fd)
        if digest.hexdigest() == expected:
            tally["passes"] += 1
        else:
            tally["mismatches"] += 1
    except OSError as exc:
        tally["errors"].append([exc.errno, str(exc)])
        if stop_on_error == "1" or len(tally["errors"]) > 20:
            save()
            break
    save()
"""

# Writes WRITE_SIZE bytes in 1 MiB pieces; after the first piece creates HALF and waits for GO;
# writes its outcome (the errno of the first failed call, and which call) to OUT.
WRITER = r"""
import json, os, sys, time
path, size, half, go, out = sys.argv[1:6]
result = {"errno": 0, "call": ""}
piece = bytes(range(256)) * 4096
try:
    f = open(path, "wb", buffering=0)
except OSError as exc:
    result = {"errno": exc.errno, "call": "open"}
else:
    try:
        written = 0
        while written < int(size):
            f.write(piece)
            written += len(piece)
            if not os.path.exists(half):
                open(half, "w").close()
                while not os.path.exists(go):
                    time.sleep(0.01)
    except OSError as exc:
        result = {"errno": exc.errno, "call": "write"}
    try:
        f.close()
    except OSError as exc:
        result = result if result["errno"] else {"errno": exc.errno, "call": "close"}
with open(out, "w") as out_file:
    json.dump(result, out_file)
"""


@dataclass
class Helper:
    process: subprocess.Popen[bytes]
    out: Path

    def tally(self) -> dict[str, Any]:
        try:
            value = json.loads(self.out.read_text())
        except (OSError, ValueError):
            return {"passes": 0, "mismatches": 0, "errors": [], "max_stall": 0.0}
        return value if isinstance(value, dict) else {}

    def finish(self) -> dict[str, Any]:
        """Stop the reader after its pass (killed if it does not end in a minute); its tally."""
        (self.out.parent / "reader.stop").touch()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        return self.tally()


def start_reader(path: Path, data: bytes, workdir: Path, *, stop_on_error: bool = False) -> Helper:
    out = workdir / "reader.json"
    proc = subprocess.Popen([sys.executable, "-c", READER, str(path), hashlib.sha256(data).hexdigest(), str(out),
                             str(workdir / "reader.stop"), "1" if stop_on_error else "0"])
    return Helper(proc, out)


def waiting(mountpoint: Path) -> int:
    """Requests of the mount's connection waiting for an answer."""
    entry = find_mount(mountpoint)
    assert entry is not None, f"{mountpoint} is not mounted"
    return int((connection_of(entry.device) / "waiting").read_text())


@pytest.mark.parametrize("options", [(), ("--read-only", "--root", "/s")], ids=["read-write", "read-only-root"])
def test_a_reader_streams_on_while_the_server_is_killed_and_started_again(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess], tmp_path: Path,
        options: tuple[str, ...]) -> None:
    """A read-only mount of a subtree (what a CSI volume is) is taken over as well: its
    kernel opens files without asking, so the successor reads with no file handle."""
    cluster = start_cluster(workers=1)
    data = payload(3 * BLOCK_SIZE + 12345)
    cluster.s3.put_object(bucket, "stream.bin", data)
    cluster.mount_bucket("/s", bucket)
    fuse = mount_fuse(cluster, *options)
    file = fuse.path / ("stream.bin" if options else "s/stream.bin")
    reader = start_reader(file, data, tmp_path)
    try:
        wait_until(lambda: reader.tally()["passes"] >= 2, 60, "the reader to read the file twice")
        for _ in range(2):
            os.kill(fuse.process.pid, signal.SIGKILL)
            fuse.wait()
            # The reader is now blocked on the dead server, the mount still there.
            wait_until(lambda: waiting(fuse.path) > 0, 30, "the reader to wait for an answer")
            assert reader.process.poll() is None
            passes = reader.tally()["passes"]
            fuse = mount_fuse(cluster, *options, wait=False)  # the same mount point
            wait_until(lambda: "took over" in fuse.output() or not fuse.alive(), 60, "the new server to take over")
            assert fuse.alive(), fuse.output()
            wait_until(lambda: reader.tally()["passes"] >= passes + 2, 60,
                       f"the reader to read on through the new server (tally {reader.tally()})")
    finally:
        tally = reader.finish()
    assert tally["errors"] == [] and tally["mismatches"] == 0, tally
    print(f"\nreader: {tally['passes']} whole passes of {len(data)} bytes, longest stall {tally['max_stall']:.2f}s")


def read_through_a_mount(start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess], tmp_path: Path,
                         resume_timeout: str) -> tuple[Cluster, FuseProcess, int, Helper]:
    """A mount with `resume_timeout` whose reader (stopping at its first error) has read a file
    through it; the cluster, the mount's server, its keeper's pid and the reader."""
    cluster = start_cluster(workers=1)
    data = payload(BLOCK_SIZE + 5)
    cluster.s3.put_object(bucket, "f.bin", data)
    cluster.mount_bucket("/b", bucket)
    fuse = mount_fuse(cluster, "--resume-timeout", resume_timeout)
    keeper = keeper_pid(fuse.path)
    assert keeper and alive(keeper)
    reader = start_reader(fuse.path / "b" / "f.bin", data, tmp_path, stop_on_error=True)
    wait_until(lambda: reader.tally()["passes"] >= 1, 60, "the reader to read the file")
    return cluster, fuse, keeper, reader


def wait_for_error(reader: Helper, what: str) -> dict[str, Any]:
    """The tally of a reader (started with stop_on_error) once it got its error; it must get
    one within a minute."""
    try:
        reader.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        reader.process.kill()
        raise AssertionError(f"the reader of a mount whose {what} hangs past every deadline "
                             f"(tally {reader.tally()})") from None
    tally = reader.tally()
    assert tally["mismatches"] == 0
    assert [e[0] for e in tally["errors"]] in ([errno.ENOTCONN], [errno.ECONNABORTED]), tally
    return tally


def test_readers_of_a_mount_nobody_takes_over_get_an_error_after_the_resume_timeout(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess], tmp_path: Path) -> None:
    cluster, fuse, keeper, reader = read_through_a_mount(start_cluster, bucket, mount_fuse, tmp_path, "3")
    os.kill(fuse.process.pid, signal.SIGKILL)
    fuse.wait()
    # A successor with other options is refused, and says how to resume.
    other = mount_fuse(cluster, "--root", "/b", wait=False)
    assert other.wait() == 1 and "resume it with the same options" in other.output()
    wait_for_error(reader, "server died")
    wait_until(lambda: not alive(keeper), 30, "the keeper to end")
    assert wait_unmounted(fuse.path, 30)
    assert "no server took over" in fuse.output()


def test_a_write_cut_off_by_the_servers_death_fails_and_leaves_the_file_whole(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess], tmp_path: Path) -> None:
    cluster = start_cluster(workers=1)
    old = payload(BLOCK_SIZE + 7)
    cluster.s3.put_object(bucket, "out.bin", old)
    cluster.mount_bucket("/w", bucket, write_type=pb.CACHE_THROUGH)
    fuse = mount_fuse(cluster)
    path = fuse.path / "w" / "out.bin"
    half, go, out = tmp_path / "half", tmp_path / "go", tmp_path / "writer.json"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(8 << 20), str(half), str(go), str(out)])
    try:
        wait_until(half.exists, 60, "the writer to write its first MiB")
        os.kill(fuse.process.pid, signal.SIGKILL)
        fuse.wait()
        go.touch()
        wait_until(lambda: waiting(fuse.path) > 0, 30, "the writer to wait for an answer")
        fuse = mount_fuse(cluster, wait=False)
        writer.wait(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
    result = json.loads(out.read_text())
    # The bytes buffered by the dead process are gone: the application hears so.
    assert result == {"errno": errno.EIO, "call": "write"}, result
    # The file is what it was, in the store and through the mount, never a mix.
    assert cluster.s3.get_object(bucket, "out.bin") == old
    assert path.read_bytes() == old
    # The new server writes files as usual.
    path.write_bytes(b"after the restart")
    assert cluster.s3.get_object(bucket, "out.bin") == b"after the restart"


# Opens a file, reads its first SIZE bytes, creates HALF and waits for GO; then drops the
# file's pages and reads the next SIZE bytes; writes both pieces' SHA-256 (or the errno of the
# failed read) to OUT. A process of its own: a test that held the file open itself would
# send the kernel a FLUSH of it with every process it starts (the child closes its copy).
HALF_READER = r"""
import hashlib, json, os, sys, time
path, size, half, go, out = sys.argv[1:6]
size = int(size)
fd = os.open(path, os.O_RDONLY)
first = hashlib.sha256(os.pread(fd, size, 0)).hexdigest()
open(half, "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
try:
    result = {"first": first, "rest": hashlib.sha256(os.pread(fd, size, size)).hexdigest(), "errno": 0}
except OSError as exc:
    result = {"first": first, "rest": "", "errno": exc.errno}
with open(out, "w") as f:
    json.dump(result, f)
"""


def test_a_reader_taken_over_by_a_new_server_never_reads_a_newer_version(
        start_cluster: Any, mount_fuse: Callable[..., FuseProcess], tmp_path: Path) -> None:
    # The file changes in the store while no server serves the mount: the open file goes on
    # with the version it was reading (or fails), never with the new bytes; and a file opened
    # after the change reads the new bytes, not pages the old handle puts in the kernel's
    # page cache. The versions differ in less than the millisecond of the times a mount shows.
    source = tmp_path / "source"
    source.mkdir()
    cluster = start_cluster(workers=1, **allow(tmp_path))
    cluster.fs().client.mount("/v", f"file://{source}", pb.MountOptions(metadata_sync_interval=0))
    target = source / "v.bin"
    old, new = payload(2 * BLOCK_SIZE), payload(2 * BLOCK_SIZE, seed=1)  # the same length
    millisecond = time.time_ns() // 1_000_000 * 1_000_000
    target.write_bytes(old)
    os.utime(target, ns=(millisecond + 100_000, millisecond + 100_000))
    fuse = mount_fuse(cluster)
    half, go, out = tmp_path / "half", tmp_path / "go", tmp_path / "out.json"
    reader = subprocess.Popen([sys.executable, "-c", HALF_READER, str(fuse.path / "v" / "v.bin"), str(BLOCK_SIZE),
                               str(half), str(go), str(out)])
    try:
        wait_until(half.exists, 60, "the reader to read the first block")
        os.kill(fuse.process.pid, signal.SIGKILL)
        fuse.wait()
        target.write_bytes(new)  # in place
        os.utime(target, ns=(millisecond + 600_000, millisecond + 600_000))
        fuse = mount_fuse(cluster, wait=False)  # the same mount point
        wait_until(lambda: "took over" in fuse.output() or not fuse.alive(), 60, "the new server to take over")
        assert fuse.alive(), fuse.output()
        after = os.open(fuse.path / "v" / "v.bin", os.O_RDONLY)  # opened before the old handle reads again
        try:
            go.touch()
            assert reader.wait(timeout=60) == 0
            assert os.pread(after, BLOCK_SIZE, BLOCK_SIZE) == new[BLOCK_SIZE:], "the old handle's pages were read"
        finally:
            os.close(after)
    finally:
        if reader.poll() is None:
            reader.kill()
    result = json.loads(out.read_text())
    sha = {name: hashlib.sha256(data[BLOCK_SIZE:]).hexdigest() for name, data in (("old", old), ("new", new))}
    assert result["first"] == hashlib.sha256(old[:BLOCK_SIZE]).hexdigest()
    assert result["rest"] != sha["new"], "an open file read on in a newer version of the file"
    assert result["rest"] == sha["old"] or result["errno"] == errno.EIO, result
    assert (fuse.path / "v" / "v.bin").read_bytes() == new
    # The handles' records go with them (the reader's, released after the takeover, too).
    wait_until(lambda: not list(state_root(fuse.path).glob("*/handles/*")), 30, "the handles' records to go")


# -- servers that hang, stop, or never quite end ------------------------------------------------

def test_a_server_killed_while_the_master_stalls_its_first_requests_is_taken_over(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess], tmp_path: Path) -> None:
    """A server killed in its first moments, while requests to its mount wait on a master that
    does not answer, leaves nothing holding the mount: a successor takes it over and the
    waiting reader is answered. (A request the server itself made to its own mount kept one of
    its threads, and so the whole dead process with its tie to the keeper, waiting for an
    answer only a successor could give; the keeper took the dead process for the live server
    and refused every successor: the reader and the mount waited for ever.)"""
    cluster = start_cluster(workers=1)
    cluster.s3.put_object(bucket, "f.txt", b"answered")
    cluster.mount_bucket("/b", bucket)
    master = cluster.master.process
    assert master is not None
    fuse = mount_fuse(cluster, wait=False)
    stopped, reader, device = False, None, ""
    try:
        wait_until(lambda: "mounting" in fuse.output() or not fuse.alive(), 60, "the server to start mounting")
        os.kill(master.pid, signal.SIGSTOP)
        stopped = True
        wait_until(lambda: any("init" in json.loads(p.read_text()) for p in state_root(fuse.path).glob("*/session.json")),
                   60, "the server to answer the kernel's INIT")
        entry = find_mount(fuse.path)
        assert entry is not None
        device = entry.device
        reader = subprocess.Popen([sys.executable, "-c", "import sys; print(open(sys.argv[1]).read())",
                                   str(fuse.path / "b" / "f.txt")], stdout=subprocess.PIPE)
        wait_until(lambda: waiting(fuse.path) > 0, 30, "the reader to wait for the master")
        os.kill(fuse.process.pid, signal.SIGKILL)
        os.kill(master.pid, signal.SIGCONT)
        stopped = False
        successor = mount_fuse(cluster, wait=False)
        wait_until(lambda: "took over" in successor.output() or not successor.alive(), 60,
                   "the successor to take over")
        assert successor.alive(), successor.output()
        assert reader.communicate(timeout=60)[0] == b"answered\n"
        fuse.wait(60)  # the killed server has ended: nothing of it is left
    finally:
        if stopped:
            os.kill(master.pid, signal.SIGCONT)
        if reader is not None and reader.poll() is None:
            reader.kill()
        if fuse.process.poll() is None and device:  # what is left of it waits on the connection: end it
            (connection_of(device) / "abort").write_text("1")


def served_by(mountpoint: Path) -> int:
    """The pid the keeper of `mountpoint` last handed the mount to (0: none)."""
    for record in state_root(mountpoint).glob("*/keeper.json"):
        return int(read_json(record).get("server_pid", 0))
    return 0


def test_readers_get_an_error_when_the_successor_hangs_before_it_serves(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess], tmp_path: Path) -> None:
    """A successor that took the mount over but never serves (stopped, or hung while it
    starts) does not make the readers wait past their deadline."""
    # (long enough for the successor to start on a loaded machine)
    cluster, fuse, keeper, reader = read_through_a_mount(start_cluster, bucket, mount_fuse, tmp_path, "20")
    master = cluster.master.process
    assert master is not None
    os.kill(fuse.process.pid, signal.SIGKILL)
    fuse.wait()
    os.kill(master.pid, signal.SIGSTOP)  # the successor's first call waits: it attaches, then hangs
    successor = mount_fuse(cluster, "--resume-timeout", "20", wait=False)
    try:
        wait_until(lambda: served_by(fuse.path) == successor.process.pid or not successor.alive(), 60,
                   "the successor to take the mount over")
        os.kill(successor.process.pid, signal.SIGSTOP)  # and never goes on
        os.kill(master.pid, signal.SIGCONT)
        wait_for_error(reader, "successor never serves")
        wait_until(lambda: not alive(keeper), 30, "the keeper to end")
    finally:
        os.kill(master.pid, signal.SIGCONT)
        successor.process.kill()


def test_readers_get_an_error_when_the_server_is_stopped(
        start_cluster: Any, bucket: str, mount_fuse: Callable[..., FuseProcess], tmp_path: Path) -> None:
    """A server stopped (SIGSTOP) or frozen for good while it serves: its readers get an error
    after a bounded time, not a wait without end."""
    _, fuse, keeper, reader = read_through_a_mount(start_cluster, bucket, mount_fuse, tmp_path, "3")
    try:
        os.kill(fuse.process.pid, signal.SIGSTOP)
        wait_for_error(reader, "server is stopped")
        wait_until(lambda: not alive(keeper), 30, "the keeper to end")
        assert wait_unmounted(fuse.path, 30)
    finally:
        fuse.process.kill()
