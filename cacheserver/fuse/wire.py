"""The FUSE kernel protocol (linux/fuse.h, version 7): the requests the kernel writes to
/dev/fuse and the replies Strata writes back, as bytes.

Only what Strata's session (session.py) uses is here. Every struct is little-endian on the
machines Strata runs on and is written with native byte order and no padding ("=" formats),
as the kernel lays them out (each struct in fuse.h is already 8-byte aligned by hand).
"""

from __future__ import annotations

import bisect
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass

KERNEL_VERSION = 7
# The minor version Strata speaks: every struct below has its size of this version.
KERNEL_MINOR = 40
ROOT_ID = 1
# A read of /dev/fuse must have room for the largest request: a write of max_write bytes.
MIN_READ_BUFFER = 8192

# Opcodes.
LOOKUP = 1
FORGET = 2
GETATTR = 3
SETATTR = 4
READLINK = 5
SYMLINK = 6
MKNOD = 8
MKDIR = 9
UNLINK = 10
RMDIR = 11
RENAME = 12
LINK = 13
OPEN = 14
READ = 15
WRITE = 16
STATFS = 17
RELEASE = 18
FSYNC = 20
SETXATTR = 21
GETXATTR = 22
LISTXATTR = 23
REMOVEXATTR = 24
FLUSH = 25
INIT = 26
OPENDIR = 27
READDIR = 28
RELEASEDIR = 29
FSYNCDIR = 30
ACCESS = 34
CREATE = 35
INTERRUPT = 36
DESTROY = 38
IOCTL = 39
NOTIFY_REPLY = 41
BATCH_FORGET = 42
RENAME2 = 45
# Requests the kernel expects no reply to.
NO_REPLY = frozenset({FORGET, BATCH_FORGET, INTERRUPT, NOTIFY_REPLY})

# INIT flags (fuse_init_in.flags / flags2 << 32).
ASYNC_READ = 1 << 0
ATOMIC_O_TRUNC = 1 << 3
BIG_WRITES = 1 << 5
AUTO_INVAL_DATA = 1 << 12
ASYNC_DIO = 1 << 15
PARALLEL_DIROPS = 1 << 18
MAX_PAGES = 1 << 22
INIT_EXT = 1 << 30
HAS_RESEND = 1 << 39  # the kernel can put requests in flight back in the queue (7.40)
PASSTHROUGH = 1 << 37  # an open may hand the kernel a local file to read instead (Linux 6.9+)

# fuse_write_in.write_flags: a write of the page cache (a shared mapping), not of a write(2)
WRITE_CACHE = 1 << 0
# fuse_open_out.open_flags
FOPEN_DIRECT_IO = 1 << 0
FOPEN_KEEP_CACHE = 1 << 1
FOPEN_CACHE_DIR = 1 << 3  # (opendir) the kernel keeps what READDIR answers, and answers from it while kept
FOPEN_NOFLUSH = 1 << 5  # close(2) sends no FLUSH (the kernel's own FUSE_WRITEBACK_CACHE aside)
FOPEN_PASSTHROUGH = 1 << 7  # reads and mmap go to the backing file the OPEN answer names, not here
# fuse_getattr_in.getattr_flags
GETATTR_FH = 1 << 0
# fuse_setattr_in.valid
FATTR_MODE = 1 << 0
FATTR_UID = 1 << 1
FATTR_GID = 1 << 2
FATTR_SIZE = 1 << 3
FATTR_ATIME = 1 << 4
FATTR_MTIME = 1 << 5
FATTR_FH = 1 << 6
FATTR_ATIME_NOW = 1 << 7
FATTR_MTIME_NOW = 1 << 8
# renameat2 flags
RENAME_NOREPLACE = 1 << 0
# Notifications (fuse_out_header.error of a message with unique 0).
NOTIFY_INVAL_INODE = 2
NOTIFY_INVAL_ENTRY = 3
NOTIFY_RESEND = 7
# A request the kernel sent again after NOTIFY_RESEND has this bit set in its unique id.
UNIQUE_RESEND = 1 << 63

IN_HEADER = struct.Struct("=IIQQIIIHH")       # len opcode unique nodeid uid gid pid total_extlen padding
OUT_HEADER = struct.Struct("=IiQ")            # len error unique
INIT_IN = struct.Struct("=IIII")              # major minor max_readahead flags
INIT_IN_EXT = struct.Struct("=I")             # flags2 (7.36+, with INIT_EXT)
INIT_OUT = struct.Struct("=IIIIHHIIHHII24x")  # ... max_pages map_alignment flags2 max_stack_depth unused[6]
ATTR = struct.Struct("=QQQQQQIIIIIIIIII")     # fuse_attr, 88 bytes
ENTRY_OUT_HEAD = struct.Struct("=QQQQII")     # nodeid generation entry_valid attr_valid *_nsec
ATTR_OUT_HEAD = struct.Struct("=QII")         # attr_valid attr_valid_nsec dummy
GETATTR_IN = struct.Struct("=IIQ")            # getattr_flags dummy fh
SETATTR_IN = struct.Struct("=IIQQQQQQIIIIIIII")
OPEN_IN = struct.Struct("=II")                # flags open_flags
OPEN_OUT = struct.Struct("=QIi")              # fh open_flags backing_id
CREATE_IN = struct.Struct("=IIII")            # flags mode umask open_flags
MKDIR_IN = struct.Struct("=II")               # mode umask
READ_IN = struct.Struct("=QQIIQII")           # fh offset size read_flags lock_owner flags padding
WRITE_IN = READ_IN                            # fh offset size write_flags lock_owner flags padding
WRITE_OUT = struct.Struct("=II")
RELEASE_IN = struct.Struct("=QIIQ")           # fh flags release_flags lock_owner
FLUSH_IN = struct.Struct("=QIIQ")             # fh unused padding lock_owner
FSYNC_IN = struct.Struct("=QII")              # fh fsync_flags padding
FORGET_IN = struct.Struct("=Q")               # nlookup
BATCH_FORGET_IN = struct.Struct("=II")        # count dummy
FORGET_ONE = struct.Struct("=QQ")             # nodeid nlookup
RENAME_IN = struct.Struct("=Q")               # newdir
RENAME2_IN = struct.Struct("=QII")            # newdir flags padding
XATTR_SIZE_IN = struct.Struct("=II")          # size padding (getxattr, listxattr)
XATTR_OUT = struct.Struct("=II")              # size padding
STATFS_OUT = struct.Struct("=QQQQQIII28x")    # blocks bfree bavail files ffree bsize namelen frsize padding spare[6]
DIRENT_HEAD = struct.Struct("=QQII")          # ino off namelen type
NOTIFY_INVAL_INODE_OUT = struct.Struct("=Qqq")  # ino off len
IOCTL_IN = struct.Struct("=QIIQII")           # fh flags cmd arg in_size out_size
NOTIFY_INVAL_ENTRY_OUT = struct.Struct("=QII")  # parent namelen flags
OPCODE_UNIQUE = struct.Struct("=4xIQ")          # the opcode and unique id of a request, from its header


@dataclass(frozen=True)
class InHeader:
    length: int
    opcode: int
    unique: int
    nodeid: int
    uid: int
    gid: int
    pid: int


def parse_header(buf: bytes | memoryview) -> InHeader:
    length, opcode, unique, nodeid, uid, gid, pid, _ext, _pad = IN_HEADER.unpack_from(buf)
    return InHeader(length, opcode, unique, nodeid, uid, gid, pid)


def out_header(unique: int, payload_len: int, error: int = 0) -> bytes:
    """The header of a reply: `error` is 0 or a positive errno (sent negated)."""
    return OUT_HEADER.pack(OUT_HEADER.size + payload_len, -error, unique)


def resend_notification() -> bytes:
    """FUSE_NOTIFY_RESEND: every request read but not answered goes back to the queue."""
    return OUT_HEADER.pack(OUT_HEADER.size, NOTIFY_RESEND, 0)


def inval_attributes_notification(nodeid: int) -> bytes:
    """FUSE_NOTIFY_INVAL_INODE of the attributes only (a negative offset: no page of the page
    cache is touched, so it waits on nothing)."""
    body = NOTIFY_INVAL_INODE_OUT.pack(nodeid, -1, 0)
    return OUT_HEADER.pack(OUT_HEADER.size + len(body), NOTIFY_INVAL_INODE, 0) + body


def inval_data_notification(nodeid: int) -> bytes:
    """FUSE_NOTIFY_INVAL_INODE of the attributes and every page the kernel caches of the file
    (offset 0, length 0: to its end). It waits for reads of those pages in flight: never sent
    while answering a READ of the same file."""
    body = NOTIFY_INVAL_INODE_OUT.pack(nodeid, 0, 0)
    return OUT_HEADER.pack(OUT_HEADER.size + len(body), NOTIFY_INVAL_INODE, 0) + body


def inval_entry_notification(parent: int, name: str) -> bytes:
    """FUSE_NOTIFY_INVAL_ENTRY of `name` in directory node `parent`: the kernel drops its entry
    (and the node, once nothing uses it, which it then forgets)."""
    raw = name.encode("utf-8", "surrogateescape")
    body = NOTIFY_INVAL_ENTRY_OUT.pack(parent, len(raw), 0) + raw + b"\0"
    return OUT_HEADER.pack(OUT_HEADER.size + len(body), NOTIFY_INVAL_ENTRY, 0) + body


def names(data: bytes | memoryview, count: int) -> list[str]:
    """`count` NUL-terminated names (file names are bytes; Strata's are UTF-8)."""
    parts = bytes(data).split(b"\0", count)
    if len(parts) <= count:
        raise ValueError(f"expected {count} NUL-terminated names in {bytes(data)[:100]!r}")
    return [p.decode("utf-8", "surrogateescape") for p in parts[:count]]


@dataclass(frozen=True)
class Attr:
    ino: int
    mode: int
    size: int = 0
    nlink: int = 1
    uid: int = 0
    gid: int = 0
    mtime_ns: int = 0
    blksize: int = 4096

    def pack(self) -> bytes:
        sec, nsec = divmod(self.mtime_ns, 1_000_000_000)
        return ATTR.pack(self.ino, self.size, (self.size + 511) // 512, sec, sec, sec, nsec, nsec, nsec,
                         self.mode, self.nlink, self.uid, self.gid, 0, self.blksize, 0)


def _split_timeout(seconds: float) -> tuple[int, int]:
    whole = int(seconds)
    return whole, int((seconds - whole) * 1_000_000_000)


def entry_out(nodeid: int, attr: Attr, timeout: float) -> bytes:
    sec, nsec = _split_timeout(timeout)
    return ENTRY_OUT_HEAD.pack(nodeid, 0, sec, sec, nsec, nsec) + attr.pack()


def attr_out(attr: Attr, timeout: float) -> bytes:
    sec, nsec = _split_timeout(timeout)
    return ATTR_OUT_HEAD.pack(sec, nsec, 0) + attr.pack()


def open_out(fh: int, open_flags: int, backing_id: int = 0) -> bytes:
    return OPEN_OUT.pack(fh, open_flags, backing_id)


class Dirents:
    """A directory's entries (name, inode number, mode) as READDIR answers them, each packed
    once (padded to 8 bytes, the offset in it where the next READDIR starts):
    `reply(offset, size)` is the entries from `offset` that fit in `size` bytes."""

    def __init__(self, entries: Sequence[tuple[str, int, int]]) -> None:
        pack, head = DIRENT_HEAD.pack, DIRENT_HEAD.size
        packed: list[bytes] = []
        ends = [0]  # ends[i]: the bytes of the first i entries
        end = 0
        for offset, (name, ino, mode) in enumerate(entries, 1):
            raw = name.encode("utf-8", "surrogateescape")
            size = head + len(raw)
            padded = (size + 7) & ~7
            packed.append(pack(ino, offset, len(raw), (mode & 0o170000) >> 12) + raw + b"\0" * (padded - size))
            end += padded
            ends.append(end)
        self._packed = packed
        self._ends = ends

    def __len__(self) -> int:
        return len(self._packed)

    def reply(self, offset: int, size: int) -> bytes:
        if offset >= len(self._packed):
            return b""
        stop = bisect.bisect_right(self._ends, self._ends[offset] + size) - 1
        return b"".join(self._packed[offset:stop])


@dataclass(frozen=True)
class InitReply:
    """What was agreed at INIT; a successor serving the same connection needs it too."""
    major: int
    minor: int
    max_readahead: int
    flags: int
    max_write: int
    max_pages: int
    # File systems stacked under a backing file, at most (PASSTHROUGH; 1: backing files on a
    # file system that is itself on no other, as a worker's disk is).
    max_stack_depth: int = 0

    def pack(self) -> bytes:
        return INIT_OUT.pack(self.major, self.minor, self.max_readahead, self.flags & 0xFFFFFFFF, 0, 0,
                             self.max_write, 1, self.max_pages, 0, self.flags >> 32, self.max_stack_depth)


def negotiate(body: bytes | memoryview, want: int, max_io: int) -> InitReply:
    """Answer the kernel's INIT: Strata's version and the flags of `want` the kernel offers."""
    major, minor, max_readahead, flags = INIT_IN.unpack_from(body)
    if flags & INIT_EXT and len(body) >= INIT_IN.size + INIT_IN_EXT.size:
        flags |= INIT_IN_EXT.unpack_from(body, INIT_IN.size)[0] << 32
    if major != KERNEL_VERSION:
        raise ValueError(f"the kernel speaks FUSE {major}.{minor}; Strata speaks {KERNEL_VERSION}.x")
    agreed = flags & (want | INIT_EXT)
    return InitReply(major=KERNEL_VERSION, minor=min(minor, KERNEL_MINOR), max_readahead=min(max_readahead, max_io),
                     flags=agreed, max_write=max_io, max_pages=max_io // 4096,
                     max_stack_depth=1 if agreed & PASSTHROUGH else 0)
