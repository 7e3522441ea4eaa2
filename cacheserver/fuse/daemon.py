"""`strata fuse MOUNTPOINT`: mount the namespace (or a subtree) and serve it until unmounted.

- Multi-threaded libfuse3 session (mfusepy), reads and writes of up to 1 MiB per request. The
  kernel reads ahead by at most the mount's `read_ahead_kb` (128 KiB, whatever the file system
  asks for), so once mounted it is raised to 1 MiB through sysfs where this process may write
  there (root, a privileged container): sequential reads then come as 1 MiB requests.
- A stale mount point left by a crashed process (ENOTCONN) is lazily unmounted first; with
  fusermount3 available the mount also uses `auto_unmount`, so a killed process's mount point
  disappears by itself.
- SIGTERM, SIGINT or SIGHUP: changed open files are written, then the mount point is unmounted
  (lazily if it is busy) and the process exits 0. The signals are blocked in every thread and
  taken by one thread with sigwait, so whichever thread the kernel picks, the same clean path runs.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mfusepy

from ..client.fs import StrataFileSystem
from ..errors import AlreadyExists, FailedPrecondition, InvalidArgument, StrataError, Unavailable
from ..namespace.paths import normalize
from ..proto import strata_pb2 as pb
from .mountpoints import MountState, find_mount, mount_state, unmount, unmount_gracefully, wait_mounted
from .operations import MAX_IO, FuseSettings, StrataOperations, attr_timeout_for

log = logging.getLogger("strata.fuse")

FSTYPE = "fuse.strata"
SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
# Seconds the readahead setter waits for the mount to come up.
MOUNT_TIMEOUT = 60.0
BDI = Path("/sys/class/bdi")


@dataclass(frozen=True)
class FuseOptions:
    mountpoint: Path
    root: str = "/"                  # namespace path shown at the mount point
    read_only: bool = False
    allow_other: bool = False        # let other users (pods running as non-root) in
    write_type: str = ""             # MUST_CACHE | CACHE_THROUGH | THROUGH | ASYNC_THROUGH; "": the mount's
    attr_timeout: float | None = None  # None: from the Strata mounts' metadata sync intervals
    readahead: int | None = None     # blocks fetched ahead of a sequential reader; None: the cluster's policy
    spool_dir: str | None = None     # where files being written are buffered


def prepare_mountpoint(mountpoint: Path) -> Path:
    """The absolute mount point, with a stale mount of a dead process removed; refuses a live
    Strata mount (mounting twice hides the first)."""
    path = mountpoint.absolute()
    state = mount_state(path)
    if state is MountState.STALE:
        log.warning("%s is a stale mount point left by a process that ended; unmounting it", path)
        unmount(path, lazy=True)
    elif state is MountState.LIVE:
        entry = find_mount(path)
        if entry is not None and entry.fstype == FSTYPE:
            raise AlreadyExists(f"{path} is already a Strata mount ({entry.source}); unmount it first: "
                                f"fusermount3 -u {path}")
    if not path.is_dir():
        raise InvalidArgument(f"mount point {path} is not a directory; create it first (mkdir -p {path})")
    return path


def mount_options(root: str, options: FuseOptions) -> dict[str, Any]:
    result: dict[str, Any] = {
        "foreground": True,
        "fsname": "strata:" + root.replace("\\", "\\\\").replace(",", "\\,"),
        "subtype": "strata",
        "max_read": MAX_IO,
        "use_ino": True,  # inode numbers from the namespace paths (stable across remounts)
    }
    if options.read_only:
        result["ro"] = True
    if options.allow_other:
        result["allow_other"] = True
    if shutil.which("fusermount3"):
        result["auto_unmount"] = True
    return result


def raise_readahead(mountpoint: Path, timeout: float = MOUNT_TIMEOUT) -> None:
    """Let the kernel read ahead MAX_IO at a time on the mount at `mountpoint` (see the module
    docstring); worker-cached files the page cache does not hold read about a third faster.
    Without write access to sysfs the kernel's 128 KiB stays, and reads still work."""
    try:
        entry = wait_mounted(mountpoint, timeout, fstype=FSTYPE)
        (BDI / entry.device / "read_ahead_kb").write_text(str(MAX_IO // 1024))
    except (OSError, Unavailable) as exc:
        log.info("strata fuse: kernel readahead of %s left at its default: %s", mountpoint, exc)


def _stop_on_signal(ops: StrataOperations, mountpoint: Path) -> None:
    sig = signal.sigwait(SIGNALS)
    log.info("strata fuse: %s: writing open files and unmounting %s", signal.Signals(sig).name, mountpoint)
    ops.commit_all()
    try:
        unmount_gracefully(mountpoint)
    except StrataError as exc:
        log.error("strata fuse: %s; exiting anyway", exc)
        os._exit(1)


def run_fuse(options: FuseOptions, *, master: str | None = None, token: str | None = None) -> int:
    """Mount and serve until unmounted (by a signal, `fusermount3 -u`, or umount)."""
    # Before any thread exists, so every thread inherits the mask (see the module docstring).
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    mountpoint = prepare_mountpoint(options.mountpoint)
    root = normalize(options.root, what="--root")
    write_type = pb.WriteType.Value(options.write_type) if options.write_type else pb.WRITE_TYPE_UNSPECIFIED
    fs = StrataFileSystem(master=master, token=token, readahead=options.readahead, skip_instance_cache=True)
    try:
        info = fs.client.stat(root)  # the master answers, the token is right, the root exists
        if not info.is_dir:
            raise InvalidArgument(f"--root {root} is a file; give a directory")
        timeout = options.attr_timeout
        if timeout is None:
            timeout = attr_timeout_for(fs.client.mounts(), root)
        settings = FuseSettings(root=root, read_only=options.read_only, write_type=write_type,
                                attr_timeout=timeout, spool_dir=options.spool_dir)
        ops = StrataOperations(fs, settings)
        threading.Thread(target=_stop_on_signal, args=(ops, mountpoint), name="strata-fuse-signals",
                         daemon=True).start()
        threading.Thread(target=raise_readahead, args=(mountpoint,), name="strata-fuse-readahead",
                         daemon=True).start()
        log.info("strata fuse: mounting %s at %s (master %s)", root, mountpoint, fs.client.master_address)
        try:
            mfusepy.FUSE(ops, str(mountpoint), raw_fi=True, **mount_options(root, options))
        except RuntimeError as exc:
            raise FailedPrecondition(
                f"mounting {mountpoint} failed (libfuse: {exc}); see the messages above. Is /dev/fuse "
                "usable here (a privileged container) and fuse3 installed?") from exc
        log.info("strata fuse: %s unmounted", mountpoint)
    finally:
        fs.client.close()
    return 0
