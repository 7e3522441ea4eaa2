"""`strata fuse MOUNTPOINT`: mount the namespace (or a subtree) and serve it until unmounted.

- Strata speaks the FUSE protocol itself (session.py, wire.py): several threads answer the
  kernel's requests, reads and writes of up to 1 MiB each. The kernel reads ahead by at most
  the mount's `read_ahead_kb` (128 KiB, whatever the file system asks for), so once mounted it
  is raised to 1 MiB through sysfs where this process may write there (root, a privileged
  container): sequential reads then come as 1 MiB requests.
- The mount outlives this process (mountkeeper.py): a keeper process holds the connection, and if
  this process dies, `strata fuse` run again with the same mount point takes it over; readers
  wait meanwhile (up to --resume-timeout, then they get an error and the mount ends).
- With STRATA_FUSE_HOLDER set (a CSI node plugin's volumes), the keeper is started by the
  node's `strata fuse-holder` instead (keeperhost.py), so it also outlives the plugin's container.
- A stale mount point (ENOTCONN: its server and keeper are both gone) is lazily unmounted first.
- SIGTERM, SIGINT or SIGHUP: changed open files are written, then the mount point is unmounted
  (lazily if it is busy) and the process exits 0. The signals are blocked in every thread and
  taken by one thread with sigwait, so whichever thread the kernel picks, the same clean path runs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.contract.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    StrataError,
    Unavailable,
)
from strata.contract.modes import WriteType
from strata.contract.units import parse_size
from ..client.fs import StrataFileSystem
from ..client.settings import ClientSettings
from ..common.paths import normalize
from . import keeperhost, kernel, mountkeeper
from .mountpoints import MountState, find_mount, mount_state, unmount, unmount_gracefully
from .interface import MAX_IO
from .nodes import NodeTable
from .attrcache import attr_timeout_for
from .operations import StrataOperations
from .settings import DEFAULT_MAX_NODES, DEFAULT_READERS, DEFAULT_RESUME_TIMEOUT, FuseSettings, fuse_environment
from .session import Session
from .localcopies import MIN_BYTES
from .wire import PASSTHROUGH, InitReply

log = logging.getLogger("strata.fuse")

FSTYPE = kernel.FSTYPE
SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
# Seconds between checks for the last open file after a clean stop.
STOP_POLL = 0.1
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
    readers: int | None = None       # files of a read-only mount kept ready to read; None: DEFAULT_READERS
    max_nodes: int | None = None     # nodes the kernel is let hold (and statuses remembered); None: DEFAULT_MAX_NODES
    resume_timeout: float = DEFAULT_RESUME_TIMEOUT  # seconds readers wait for a successor of a dead server
    passthrough: str = ""            # DIR:SIZE: local copies the kernel reads itself (localcopies.py); "": none


def passthrough_room(value: str) -> tuple[Path, int]:
    """The folder and room of `--passthrough DIR:SIZE` (`strata fuse`, `strata csi`)."""
    folder, sep, size = value.rpartition(":")
    if not sep or not folder:
        raise InvalidArgument(f"--passthrough {value!r}: write DIR:SIZE, e.g. /mnt/nvme/strata-copies:50Gi")
    room = parse_size(size, what="--passthrough size")
    if room < MIN_BYTES:
        raise InvalidArgument(f"--passthrough {value!r}: give at least {MIN_BYTES} bytes of room")
    return Path(folder).absolute(), room


def passthrough_of(value: str, mountpoint: Path, read_only: bool) -> tuple[Path | None, int]:
    """The folder of this mount's local copies and their room, from `--passthrough DIR:SIZE`
    (a folder of its own in DIR for each mount point: a successor clears it)."""
    if not value:
        return None, 0
    folder, room = passthrough_room(value)
    if not read_only:
        raise InvalidArgument("--passthrough needs --read-only: a file passed through to a copy cannot be written")
    key = hashlib.sha256(str(mountpoint).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return folder / f"mount-{key}", room


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


def raise_readahead(mountpoint: Path) -> None:
    """Let the kernel read ahead MAX_IO at a time on the mount at `mountpoint` (see the module
    docstring); worker-cached files the page cache does not hold read about a third faster.
    Without write access to sysfs the kernel's 128 KiB stays, and reads still work. The mount
    is found in the mount table, never by a look at the mount point: a request of this process
    to its own mount, if the process were killed before the answer, would keep it from ending
    (its thread waits for an answer only a successor gives) and so keep its tie to the keeper."""
    entry = find_mount(mountpoint)
    if entry is None or entry.fstype != FSTYPE:
        log.info("strata fuse: kernel readahead of %s left at its default: it is not in the mount table", mountpoint)
        return
    try:
        (BDI / entry.device / "read_ahead_kb").write_text(str(MAX_IO // 1024))
    except OSError as exc:
        log.info("strata fuse: kernel readahead of %s left at its default: %s", mountpoint, exc)


def _stop_on_signal(ops: StrataOperations, mountpoint: Path, attachment: mountkeeper.Attachment) -> None:
    sig = signal.sigwait(SIGNALS)
    log.info("strata fuse: %s: writing open files and unmounting %s", signal.Signals(sig).name, mountpoint)
    ops.commit_all()
    attachment.stop()
    entry = find_mount(mountpoint)
    try:
        unmount_gracefully(mountpoint)
    except StrataError as exc:
        log.error("strata fuse: %s; exiting anyway", exc)
        os._exit(1)
    # Mount namespaces made while the mount existed (containers started meanwhile) may hold
    # copies of it that keep the connection open after the unmount here: end it once the files
    # open through it are closed (a busy mount was detached lazily, and its readers finish).
    while ops.open_files():
        time.sleep(STOP_POLL)
    if entry is not None:
        kernel.abort(entry.device)


def _mount(mountpoint: Path, root: str, options: FuseOptions, state: Path) -> mountkeeper.Attachment:
    """Mount anew, start the mount's keeper (or have the node's holder start it, see keeperhost.py)
    and attach to it."""
    environment = fuse_environment()
    holder_socket = environment.holder
    holder_wait = environment.holder_wait if holder_socket is not None else 0.0
    if holder_socket is not None:  # before mounting: a mount nobody keeps would look published
        keeperhost.wait_ready(holder_socket, holder_wait)
    prepare_mountpoint(mountpoint)
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True, mode=0o700)
    mountkeeper.write_json(state / mountkeeper.SESSION, {"mountpoint": str(mountpoint), "root": root,
                                               "read_only": options.read_only, "passthrough": options.passthrough})
    fd = kernel.mount(kernel.MountRequest(mountpoint=mountpoint, source="strata:" + root, read_only=options.read_only,
                                          allow_other=options.allow_other, max_read=MAX_IO))
    try:
        if holder_socket is not None:
            keeperhost.start_keeper(holder_socket, fd, state, mountpoint, options.resume_timeout, holder_wait)
        else:
            mountkeeper.start(fd, state, mountpoint, options.resume_timeout)
        attachment = mountkeeper.attach(state, options.resume_timeout)
    except BaseException:
        os.close(fd)
        unmount(mountpoint, lazy=True)
        raise
    os.close(fd)  # the keeper's copy is the same connection
    if attachment is None:
        unmount(mountpoint, lazy=True)
        raise Unavailable(f"the keeper of {mountpoint} ended at once; see the messages above")
    return attachment


def run_fuse(options: FuseOptions, *, master: str | None = None, token: str | None = None) -> int:
    """Mount (or take over the mount kept at the mount point) and serve until unmounted (by a
    signal, `fusermount3 -u`, or umount)."""
    # Before any thread exists, so every thread inherits the mask (see the module docstring).
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    mountpoint = options.mountpoint.absolute()
    root = normalize(options.root, what="--root")
    state = mountkeeper.state_dir(mountpoint)
    write_type = WriteType.proto_of(options.write_type)
    # A mount kept for a successor: take it over (AlreadyExists if a live server holds it).
    attachment = mountkeeper.attach(state, options.resume_timeout)
    if attachment is not None:
        kept = mountkeeper.read_json(state / mountkeeper.SESSION)
        if (kept.get("root"), kept.get("read_only"), kept.get("passthrough", "")) != (root, options.read_only,
                                                                                   options.passthrough):
            attachment.close()
            raise InvalidArgument(
                f"{mountpoint} is kept mounted with --root {kept.get('root')}"
                f"{' --read-only' if kept.get('read_only') else ''}"
                f"{' --passthrough ' + kept['passthrough'] if kept.get('passthrough') else ''}; resume it with the same options, "
                f"or unmount it first: fusermount3 -u {mountpoint}")
    max_nodes = DEFAULT_MAX_NODES if options.max_nodes is None else options.max_nodes
    if max_nodes < 1:
        raise InvalidArgument(f"--max-nodes {max_nodes}: give 1 or more")
    # The client holds a status of each file it was asked of: as many as the mount's nodes.
    fs = StrataFileSystem(master=master, token=token, readahead=options.readahead, skip_instance_cache=True,
                          client_kind="fuse", settings=ClientSettings(held_statuses=max_nodes))
    try:
        info = fs.client.stat(root)  # the master answers, the token is right, the root exists
        if not info.is_dir:
            raise InvalidArgument(f"--root {root} is a file; give a directory")
        if options.readers is not None and options.readers < 1:
            raise InvalidArgument(f"--readers {options.readers}: give 1 or more")
        timeout = options.attr_timeout
        if timeout is None:
            timeout = attr_timeout_for(fs.client.mounts(), root)
        copies, room = passthrough_of(options.passthrough, mountpoint, options.read_only)
        settings = FuseSettings(root=root, read_only=options.read_only, write_type=write_type,
                                attr_timeout=timeout, spool_dir=options.spool_dir, handles_dir=state / mountkeeper.HANDLES,
                                readers=DEFAULT_READERS if options.readers is None else options.readers,
                                max_nodes=max_nodes, passthrough_dir=copies, passthrough_room=room)
        ops = StrataOperations(fs, settings)
        resumed = attachment is not None
        if attachment is None:
            log.info("strata fuse: mounting %s at %s (master %s)", root, mountpoint, fs.client.master_address)
            attachment = _mount(mountpoint, root, options, state)
        nodes = NodeTable("/", state / mountkeeper.JOURNAL, limit=max_nodes)

        def remember_init(reply: InitReply) -> None:
            try:
                kept = mountkeeper.read_json(state / mountkeeper.SESSION)
                mountkeeper.write_json(state / mountkeeper.SESSION, {**kept, "init": reply.__dict__})
            except OSError as exc:
                log.warning("strata fuse: could not record the session in %s: %s", state, exc)

        if resumed:
            ops.adopt()  # the predecessor's open files, at their versions
        session = Session(attachment.fd, ops, nodes, timeout=timeout, read_only=options.read_only, root=root,
                          on_init=remember_init)
        if resumed and mountkeeper.read_json(state / mountkeeper.SESSION).get("init", {}).get("flags", 0) & PASSTHROUGH:
            session.pass_through(resumed=True)  # agreed at the predecessor's INIT
        threading.Thread(target=_stop_on_signal, args=(ops, mountpoint, attachment), name="strata-fuse-signals",
                         daemon=True).start()
        if resumed and not session.resume():
            # Requests the dead process read would never be answered: end the mount instead.
            entry = find_mount(mountpoint)
            if entry is not None:
                kernel.abort(entry.device)
            unmount(mountpoint, lazy=True)
            raise FailedPrecondition(
                f"this kernel cannot hand the requests in flight of a dead server to a new one (Linux 6.9+ can); "
                f"the kept mount at {mountpoint} was ended: run strata fuse again to mount anew")
        session.start()
        attachment.serving()
        if resumed:
            log.info("strata fuse: took over %s (%s at %s, %d nodes known to the kernel; requests in flight "
                     "are answered again)", mountpoint, root, fs.client.master_address, len(nodes))
        raise_readahead(mountpoint)
        session.wait()
        ops.commit_all()
        ops.drop_copies()
        attachment.stop()
        nodes.close()
        log.info("strata fuse: %s unmounted", mountpoint)
    finally:
        fs.client.close()
    return 0
