"""What the FUSE session (session.py) knows of the file system it serves: the operations it
calls by path, and the few names both sides use. The protocol layer (wire.py, session.py,
kernel.py, nodes.py, kernelattrs.py and this module) imports nothing else of Strata but the errors a
user sees; operations.py implements `Operations` with the client library.

- Paths are below the mount point ("/" is the mount's root); times are in nanoseconds.
- An operation fails a request by raising an OSError (FuseError) with the errno the caller of
  the system call sees.
- File handles carry whether they were opened for writing in their lowest bit
  (`is_write_handle`), so a successor process tells a read from a write of a handle it does
  not know (see session.py).
- A read-only mount whose kernel opens files without asking reads by `Status` (which version
  of which file) instead of by handle: `status`, `read_at`, `drop_reader`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

# Largest read and write request the kernel sends (and the readahead it may do): 1 MiB.
MAX_IO = 1024 * 1024
# utimensat's "now" and "leave as is" (seconds 0, these nanoseconds), as utimens gets them.
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2


class FuseError(OSError):
    """Fail the current request with this errno."""

    def __init__(self, code: int) -> None:
        super().__init__(code, os.strerror(code))


@dataclass
class FileInfo:
    """What the operations read and set on an open file (libfuse's fuse_file_info)."""
    flags: int = 0
    fh: int = 0
    keep_cache: int = 0
    direct_io: int = 0
    backing_id: int = 0  # the kernel reads the file it names instead (passthrough, see open)


class Status(Protocol):
    """A file as a read of a file the kernel opened without asking reads it: one version."""

    @property
    def path(self) -> str: ...

    @property
    def version(self) -> str: ...


S = TypeVar("S", bound=Status)

# An entry of a directory as readdir gives it: its name, inode number and mode (its type).
DirEntry = tuple[str, int, int]


class Operations(Protocol[S]):
    """The calls of a FUSE session, by path (fusepy's names and arguments where it has them)."""

    # -- metadata

    def getattr(self, path: str, fh: FileInfo | None = None) -> dict[str, Any]:
        """os.stat's fields by name: st_ino, st_mode, st_size, st_nlink, st_uid, st_gid,
        st_mtime (nanoseconds), st_blksize."""
        ...

    def statfs(self, path: str) -> dict[str, int]:
        """f_blocks, f_bfree, f_bavail, f_bsize, f_frsize, f_namemax."""
        ...

    def readdir(self, path: str, fh: Any) -> list[DirEntry]:
        """(name, inode number, mode) of each entry, "." and ".." first."""
        ...

    def listing_unchanged(self, path: str) -> bool:
        """True while the entries readdir last gave of directory `path` are the ones it would
        give now (the kernel may answer from its copy of them instead of asking)."""
        ...

    def chmod(self, path: str, mode: int) -> int: ...

    def chown(self, path: str, uid: int, gid: int) -> int: ...

    def utimens(self, path: str, times: Any = None) -> int:
        """`times`: (atime, mtime) in nanoseconds, either UTIME_NOW or UTIME_OMIT."""
        ...

    def listxattr(self, path: str) -> list[str]: ...

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes: ...

    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int: ...

    def removexattr(self, path: str, name: str) -> int: ...

    # -- open files

    def is_write_handle(self, fh: int) -> bool: ...

    def has_handle(self, fh: int) -> bool:
        """Was `fh` opened by this process (or adopted from its predecessor)?"""
        ...

    def reopen(self, path: str, fh: int) -> None:
        """Open `path` for reading as handle `fh`, one a predecessor process opened."""
        ...

    def open(self, path: str, fi: FileInfo) -> int:
        """Sets fi.fh, and fi.keep_cache and fi.direct_io for the kernel's page cache, or
        fi.backing_id for a file the kernel reads itself (see pass_through)."""
        ...

    def create(self, path: str, mode: int, fi: FileInfo) -> int: ...

    def read(self, path: str, size: int, offset: int, fi: FileInfo) -> bytes: ...

    def write(self, path: str, data: bytes | memoryview, offset: int, fi: FileInfo) -> int: ...

    def append(self, path: str, data: bytes | memoryview, fi: FileInfo) -> int:
        """write() at the end of the open file (one opened with O_APPEND)."""
        ...

    def truncate(self, path: str, length: int, fh: FileInfo | None = None) -> int: ...

    def flush(self, path: str, fi: FileInfo) -> int: ...

    def fsync(self, path: str, datasync: int, fi: FileInfo) -> int: ...

    def release(self, path: str, fi: FileInfo) -> int: ...

    def passes_through(self) -> bool:
        """Whether opens may hand the kernel a local file to read (asked for at INIT)."""
        ...
    def pass_through(self, register: Callable[[int], int], unregister: Callable[[int], None],
                     drop_pages: Callable[[str], None], *, resumed: bool) -> None:
        """INIT agreed on passthrough (`resumed`: the predecessor's INIT, on the connection this
        process took over): `register(fd)` gives the kernel's id of an open local file (for
        fi.backing_id), `unregister(id)` lets go of one, `drop_pages(path)` has the kernel drop
        the pages it holds of a file (from a thread that answers no request)."""
        ...
    def commit_all(self) -> None:
        """Write every changed open file (the kernel ends the session)."""
        ...

    # -- files the kernel opened without asking

    def status(self, path: str) -> S | None:
        """The file at `path` as it is now (None: a directory, or a file being written here)."""
        ...

    def read_at(self, info: S, size: int, offset: int, changed: Callable[[S], None]) -> bytes:
        """Bytes of the version `info` names; if it is gone, `changed` is told the file's
        status now and the read fails."""
        ...

    def drop_reader(self, old: S, new: S | None = None) -> None:
        """Nothing reads `old` any more; `new`: the file's status now."""
        ...

    # -- changes

    def mkdir(self, path: str, mode: int) -> int: ...

    def unlink(self, path: str) -> int: ...

    def rmdir(self, path: str) -> int: ...

    def rename(self, old: str, new: str) -> int: ...
