"""Mount points of FUSE file systems: is one mounted, alive, or left behind by a dead process;
unmount it; wait for one to come up.

A FUSE process that dies without unmounting leaves its mount point in place, and every access
to it fails with ENOTCONN ("Transport endpoint is not connected"). Such a stale mount point
is lazily unmounted (`fusermount3 -uz`) before something is mounted there again.
"""

from __future__ import annotations

import errno
import enum
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from strata.contract.errors import FailedPrecondition, Unavailable

MOUNTINFO = Path("/proc/self/mountinfo")
# A live FUSE daemon answers a stat in microseconds; one that takes this long is hung.
PROBE_TIMEOUT = 5.0
UNMOUNT_TIMEOUT = 30.0


class MountState(enum.Enum):
    ABSENT = "absent"  # nothing is mounted there (the path may not even exist)
    LIVE = "live"      # a mount that answers
    STALE = "stale"    # a FUSE mount whose process is gone (ENOTCONN) or does not answer


@dataclass(frozen=True)
class MountEntry:
    mount_point: str
    fstype: str
    source: str
    options: str
    device: str = ""  # major:minor of the mounted file system, as /sys/class/bdi names it

    @property
    def read_only(self) -> bool:
        return "ro" in self.options.split(",")


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\ooo (octal)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[MountEntry]:
    """Entries of a /proc/<pid>/mountinfo text, in mount order."""
    entries = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 6 or len(tail) < 2:
            continue
        entries.append(MountEntry(mount_point=_unescape(fields[4]), fstype=tail[0], source=_unescape(tail[1]),
                                  options=fields[5], device=fields[2]))
    return entries


def find_mount(path: Path | str) -> MountEntry | None:
    """The topmost mount at exactly `path`, if any."""
    target = os.path.abspath(path)
    found = None
    for entry in parse_mountinfo(MOUNTINFO.read_text()):
        if entry.mount_point == target:
            found = entry
    return found


def _stat_errno(path: str, timeout: float) -> int | None:
    """errno of stat(path) (0 when it works), or None when it did not answer in time."""
    result: list[int] = []

    def probe() -> None:
        try:
            os.stat(path)
            result.append(0)
        except OSError as exc:
            result.append(exc.errno or errno.EIO)

    thread = threading.Thread(target=probe, name=f"probe {path}", daemon=True)
    thread.start()
    thread.join(timeout)
    return result[0] if result else None


def mount_state(path: Path | str, timeout: float = PROBE_TIMEOUT) -> MountState:
    entry = find_mount(path)
    code = _stat_errno(os.path.abspath(path), timeout)
    if code == errno.ENOTCONN or (entry is not None and entry.fstype.startswith("fuse") and code is None):
        return MountState.STALE
    return MountState.LIVE if entry is not None else MountState.ABSENT


def unmount(path: Path | str, *, lazy: bool = False) -> None:
    """Unmount `path` (lazily: detach it now even while it is busy or dead)."""
    target = os.path.abspath(path)
    fusermount = shutil.which("fusermount3") or shutil.which("fusermount")
    commands = []
    if fusermount:
        commands.append([fusermount, "-u", *(["-z"] if lazy else []), "-q", target])
    if os.geteuid() == 0 and shutil.which("umount"):
        commands.append(["umount", *(["-l"] if lazy else []), target])
    errors = []
    for command in commands:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=UNMOUNT_TIMEOUT, check=False)
        if proc.returncode == 0 or find_mount(target) is None:
            return
        errors.append(f"{' '.join(command)}: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    if not commands:
        raise FailedPrecondition(f"cannot unmount {target}: neither fusermount3 nor umount (as root) is available; "
                                 "install fuse3")
    raise FailedPrecondition(f"cannot unmount {target}: " + "; ".join(errors))


def unmount_gracefully(path: Path | str) -> None:
    """Unmount; if the mount is busy (open files, a process's working directory), detach it lazily."""
    try:
        unmount(path)
    except FailedPrecondition:
        unmount(path, lazy=True)


def wait_mounted(path: Path | str, timeout: float, *, fstype: str | None = None,
                 alive: Callable[[], bool] = lambda: True, what: str = "the mount") -> MountEntry:
    """Wait until a live mount (of `fstype`, if given) is at `path`. Raises Unavailable if
    `alive()` turns false or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        entry = find_mount(path)
        if entry is not None and (fstype is None or entry.fstype == fstype) and _stat_errno(str(path), 1.0) == 0:
            return entry
        if not alive():
            raise Unavailable(f"{what} at {path} ended before it was mounted")
        if time.monotonic() > deadline:
            raise Unavailable(f"{what} did not appear at {path} within {timeout:.0f}s")
        time.sleep(0.05)


def wait_unmounted(path: Path | str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while find_mount(path) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
