"""Mounting a FUSE file system and ending its connection, without libfuse.

- As root: open /dev/fuse and mount(2) with its descriptor (`fd=N,rootmode=...`).
- Otherwise: fusermount3 (setuid root) mounts and hands the descriptor back over a Unix socket
  (the `_FUSE_COMMFD` protocol of libfuse's mount helper).
- `backing_open` / `backing_close` register a local file with a connection for passthrough
  (Linux 6.9+, CAP_SYS_ADMIN): an OPEN answered with its id has the kernel read that file
  itself, the server asked no READ.
- `abort` ends a connection through /sys/fs/fuse/connections/N/abort: every request waiting
  for an answer fails at once, and the mount answers ENOTCONN until it is unmounted.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
import shutil
import socket
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from strata.contract.errors import FailedPrecondition

FSTYPE = "fuse.strata"
CONNECTIONS = Path("/sys/fs/fuse/connections")
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
FUSERMOUNT_TIMEOUT = 30.0
# /dev/fuse's ioctls of linux/fuse.h: _IOW(229, 1, struct fuse_backing_map {s32 fd; u32 flags;
# u64 padding}) gives the id of a backing file, _IOW(229, 2, u32) lets go of one.
BACKING_OPEN = 0x4010E501
BACKING_CLOSE = 0x4004E502
BACKING_MAP = struct.Struct("=iIQ")


@dataclass(frozen=True)
class MountRequest:
    mountpoint: Path
    source: str             # shown in /proc/mounts, e.g. strata:/datasets
    read_only: bool = False
    allow_other: bool = False
    max_read: int = 1 << 20


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace(",", "\\,")


def _mount_as_root(request: MountRequest) -> int:
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    options = (f"fd={fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()},max_read={request.max_read}"
               + (",allow_other" if request.allow_other else ""))
    flags = MS_NOSUID | MS_NODEV | (MS_RDONLY if request.read_only else 0)
    code = _libc_mount(request.source, str(request.mountpoint), FSTYPE, flags, options)
    if code:
        os.close(fd)
        raise FailedPrecondition(f"mounting {request.mountpoint} failed: {os.strerror(code)}; is /dev/fuse usable "
                                 "here (a privileged container)?")
    return fd


def _mount_with_fusermount(request: MountRequest) -> int:
    helper = shutil.which("fusermount3")
    if helper is None:
        raise FailedPrecondition("mounting as a user needs fusermount3 (install fuse3), or run as root")
    options = ["nosuid", "nodev", "subtype=strata", f"fsname={_escape(request.source)}", f"max_read={request.max_read}",
               "ro" if request.read_only else "rw"] + (["allow_other"] if request.allow_other else [])
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        proc = subprocess.run([helper, "-o", ",".join(options), "--", str(request.mountpoint)],
                              env={**os.environ, "_FUSE_COMMFD": str(theirs.fileno())}, pass_fds=(theirs.fileno(),),
                              capture_output=True, text=True, timeout=FUSERMOUNT_TIMEOUT, check=False)
        if proc.returncode != 0:
            raise FailedPrecondition(f"fusermount3 could not mount {request.mountpoint}: {proc.stderr.strip()}")
        theirs.close()
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    if not fds:
        raise FailedPrecondition(f"fusermount3 mounted {request.mountpoint} but sent no /dev/fuse descriptor")
    os.set_inheritable(fds[0], False)
    return fds[0]


def mount(request: MountRequest) -> int:
    """Mount and return the connection's /dev/fuse descriptor (the kernel's INIT waits in it)."""
    return _mount_as_root(request) if os.geteuid() == 0 else _mount_with_fusermount(request)


def _libc_mount(source: str, target: str, fstype: str, flags: int, options: str) -> int:
    """mount(2); 0 or the errno."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.mount(source.encode(), target.encode(), fstype.encode(), flags, options.encode()) != 0:
        return ctypes.get_errno() or 1
    return 0


def connection_of(device: str) -> Path:
    """The control folder of the connection mounted as device `major:minor` (mountinfo's field).
    The fusectl file system that shows them is mounted first if it is not (as root)."""
    if CONNECTIONS.is_dir() and not any(CONNECTIONS.iterdir()) and os.geteuid() == 0:
        _libc_mount("fusectl", str(CONNECTIONS), "fusectl", 0, "")
    return CONNECTIONS / device.split(":")[1]


def abort(device: str) -> bool:
    """End the connection of device `major:minor`; False if this process may not."""
    try:
        (connection_of(device) / "abort").write_text("1")
        return True
    except OSError:
        return False


def backing_open(connection: int, fd: int) -> int:
    """The id the connection `connection` (a /dev/fuse descriptor) gives the open file `fd`, for
    OPEN answers that pass reads through to it; OSError if the kernel refuses (no passthrough
    agreed at INIT, no CAP_SYS_ADMIN, a file it cannot stack on)."""
    return int(fcntl.ioctl(connection, BACKING_OPEN, bytearray(BACKING_MAP.pack(fd, 0, 0)), True))


def backing_close(connection: int, backing_id: int) -> None:
    """Let go of a backing file's id: files the kernel opened with it keep reading it; an id
    the connection does not know (ENOENT) is no error."""
    try:
        fcntl.ioctl(connection, BACKING_CLOSE, bytearray(struct.pack("=I", backing_id)), True)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
