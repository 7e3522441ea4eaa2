"""A mount handed to `strata fuse-holder` outlives the whole process tree of the server that
made it (issue 13): the keeper is the holder's child, so killing the server's session (as a
container's end kills everything in it) leaves the mount kept, and the next `strata fuse`
resumes it under a streaming reader."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from strata.cacheserver import launcher
from strata.cacheserver.fuse import keeperhost, settings
from strata.cacheserver.fuse.mountpoints import find_mount

from .conftest import BLOCK_SIZE, wait_until
from .test_cluster import payload
from .test_fuse import FuseProcess, alive, fuse_skip_reason, keeper_pid, mount_fuse, state_root  # noqa: F401
from .test_fuse_resume import start_reader, waiting

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300),
              pytest.mark.skipif(fuse_skip_reason() is not None, reason=str(fuse_skip_reason())),
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root (fusectl)")]


@dataclass
class HolderProcess:
    process: subprocess.Popen[bytes]
    socket: Path
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def fuse_holder(tmp_path: Path) -> Iterator[HolderProcess]:
    """`strata fuse-holder` for the mounts at tmp_path/<name> (their state root)."""
    root = state_root(tmp_path / "mnt")
    root.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "holder.log"
    child = launcher.start("strata fuse-holder", launcher.strata_argv("fuse-holder"), log,
                           env={**os.environ, "STRATA_FUSE_STATE_DIR": str(root)})
    started = HolderProcess(child.process, root / keeperhost.SOCKET, log)
    try:
        keeperhost.wait_ready(started.socket, wait=30)
        yield started
    finally:
        child.stop(grace=20)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def session_of(pid: int) -> list[int]:
    """Every process of session `pid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3]) == pid:
                    members.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return members


def test_a_mount_kept_by_the_holder_outlives_the_servers_whole_session(
        start_cluster: Any, bucket: str, fuse_holder: HolderProcess, mount_fuse: Callable[..., FuseProcess],
        tmp_path: Path) -> None:
    cluster = start_cluster(workers=1)
    data = payload(3 * BLOCK_SIZE + 12345)
    cluster.s3.put_object(bucket, "stream.bin", data)
    cluster.mount_bucket("/s", bucket)
    env = {settings.HOLDER_ENV: str(fuse_holder.socket)}
    fuse = mount_fuse(cluster, env=env)
    keeper = keeper_pid(fuse.path)
    assert keeper and parent_of(keeper) == fuse_holder.process.pid, "the keeper is not the holder's child"
    reader = start_reader(fuse.path / "s" / "stream.bin", data, tmp_path)
    stalls = []
    try:
        wait_until(lambda: reader.tally()["passes"] >= 2, 60, "the reader to read the file twice")
        for _ in range(2):
            members = session_of(fuse.process.pid)
            assert fuse.process.pid in members and keeper not in members
            for pid in members:  # as the end of a container would
                os.kill(pid, signal.SIGKILL)
            fuse.wait()
            wait_until(lambda: waiting(fuse.path) > 0, 30, "the reader to wait for an answer")
            assert alive(keeper) and reader.process.poll() is None
            passes = reader.tally()["passes"]
            killed = time.monotonic()
            fuse = mount_fuse(cluster, env=env, wait=False)  # the same mount point
            wait_until(lambda: "took over" in fuse.output() or not fuse.alive(), 60, "the new server to take over")
            assert fuse.alive(), fuse.output()
            wait_until(lambda: reader.tally()["passes"] >= passes + 2, 60,
                       f"the reader to read on through the new server (tally {reader.tally()})")
            stalls.append(time.monotonic() - killed)
    finally:
        (tmp_path / "reader.stop").touch()
        try:
            reader.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            reader.process.kill()
            raise
    tally = reader.tally()
    assert tally["errors"] == [] and tally["mismatches"] == 0, tally
    assert keeper_pid(fuse.path) == keeper  # the same keeper all along
    print(f"\nreader through the holder's keeper: {tally['passes']} whole passes of {len(data)} bytes, 0 errors, "
          f"longest stall {tally['max_stall']:.2f}s")
    # A clean stop ends the keeper, and the holder collects it (no zombie left).
    fuse.process.send_signal(signal.SIGTERM)
    assert fuse.wait(30) == 0, fuse.output()
    wait_until(lambda: not Path(f"/proc/{keeper}").exists(), 30, "the keeper to end and be reaped")
    # The holder says so once it has reaped it, a moment after the pid is gone.
    wait_until(lambda: f"keeper {keeper} of {fuse.path} ended" in fuse_holder.output(), 30,
               "the holder to log the keeper's end")


def test_without_its_holder_strata_fuse_fails_clearly_and_mounts_nothing(
        start_cluster: Any, bucket: str, tmp_path: Path, mount_fuse: Callable[..., FuseProcess]) -> None:
    cluster = start_cluster(workers=1)
    cluster.mount_bucket("/s", bucket)
    missing = tmp_path / "no-holder.sock"
    wait = 3  # STRATA_FUSE_HOLDER_WAIT (the default, 30 s, proves the same at ten times the cost)
    started = time.monotonic()
    fuse = mount_fuse(cluster, env={settings.HOLDER_ENV: str(missing), settings.HOLDER_WAIT_ENV: str(wait)}, wait=False)
    assert fuse.wait(wait + 30) == 1
    assert time.monotonic() - started >= wait
    assert f"the FUSE holder is not reachable at {missing} ({settings.HOLDER_ENV}) after {wait}s" in fuse.output(), \
        fuse.output()
    assert find_mount(fuse.path) is None
