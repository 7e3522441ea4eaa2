"""The FUSE kernel protocol's structs as Strata writes and reads them (sizes from linux/fuse.h)."""

from __future__ import annotations

import stat
import struct

import pytest

from strata.cacheserver.fuse import wire


@pytest.mark.parametrize(("layout", "size"), [
    (wire.IN_HEADER, 40), (wire.OUT_HEADER, 16), (wire.INIT_IN, 16), (wire.INIT_OUT, 64), (wire.ATTR, 88),
    (wire.GETATTR_IN, 16), (wire.SETATTR_IN, 88), (wire.OPEN_IN, 8), (wire.OPEN_OUT, 16), (wire.CREATE_IN, 16),
    (wire.MKDIR_IN, 8), (wire.READ_IN, 40), (wire.WRITE_IN, 40), (wire.WRITE_OUT, 8), (wire.RELEASE_IN, 24),
    (wire.FLUSH_IN, 24), (wire.FSYNC_IN, 16), (wire.FORGET_IN, 8), (wire.BATCH_FORGET_IN, 8), (wire.FORGET_ONE, 16),
    (wire.RENAME_IN, 8), (wire.RENAME2_IN, 16), (wire.XATTR_SIZE_IN, 8), (wire.XATTR_OUT, 8), (wire.STATFS_OUT, 80),
    (wire.DIRENT_HEAD, 24), (wire.NOTIFY_INVAL_INODE_OUT, 24),
])
def test_structs_have_the_kernels_sizes(layout: struct.Struct, size: int) -> None:
    assert layout.size == size


def test_a_request_header_is_read() -> None:
    raw = wire.IN_HEADER.pack(56, wire.LOOKUP, 7 | wire.UNIQUE_RESEND, 42, 1000, 100, 4321, 0, 0) + b"name\0"
    header = wire.parse_header(raw)
    assert header == wire.InHeader(56, wire.LOOKUP, 7 | wire.UNIQUE_RESEND, 42, 1000, 100, 4321)


def test_replies_carry_their_length_and_the_negated_errno() -> None:
    assert wire.out_header(9, 0, 2) == struct.pack("=IiQ", 16, -2, 9)
    assert wire.out_header(9, 100) == struct.pack("=IiQ", 116, 0, 9)
    # FUSE_NOTIFY_RESEND: a message with unique 0 whose error field is the notification's code.
    assert wire.resend_notification() == struct.pack("=IiQ", 16, 7, 0)
    # FUSE_NOTIFY_INVAL_INODE of the attributes only: a negative offset leaves the page cache be.
    assert wire.inval_attributes_notification(42) == struct.pack("=IiQQqq", 40, 2, 0, 42, -1, 0)


def test_entries_and_attributes() -> None:
    attr = wire.Attr(ino=5, mode=stat.S_IFREG | 0o644, size=1000, uid=1, gid=2, mtime_ns=3_000_000_007, blksize=4096)
    packed = attr.pack()
    fields = wire.ATTR.unpack(packed)
    assert fields[:6] == (5, 1000, 2, 3, 3, 3)  # ino size blocks(512 B) atime mtime ctime
    assert fields[6:9] == (7, 7, 7)
    assert fields[9:15] == (stat.S_IFREG | 0o644, 1, 1, 2, 0, 4096)
    entry = wire.entry_out(9, attr, 1.5)
    assert wire.ENTRY_OUT_HEAD.unpack_from(entry) == (9, 0, 1, 1, 500_000_000, 500_000_000)
    assert entry[wire.ENTRY_OUT_HEAD.size:] == packed and len(entry) == 128
    assert len(wire.attr_out(attr, 0)) == 104


def test_directory_entries_are_padded_to_eight_bytes_and_answered_as_many_as_fit() -> None:
    entries = wire.Dirents([("abc", 77, stat.S_IFDIR | 0o755), ("12345678", 1, stat.S_IFREG), ("é", 2, stat.S_IFREG)])
    first = entries.reply(0, 4096)
    assert len(first) == 32 + 32 + 32
    assert wire.DIRENT_HEAD.unpack_from(first) == (77, 1, 3, stat.S_IFDIR >> 12)
    assert first[24:27] == b"abc" and first[27:32] == b"\0" * 5
    assert wire.DIRENT_HEAD.unpack_from(first, 32) == (1, 2, 8, stat.S_IFREG >> 12)
    assert first[56:64] == b"12345678"  # no padding needed
    assert first[88:90] == "é".encode()
    assert entries.reply(0, 63) == first[:32]  # only whole entries: the next READDIR starts at offset 1
    assert entries.reply(1, 64) == first[32:]
    assert entries.reply(2, 31) == b""  # too small for the next: nothing (the kernel asks with more)
    assert entries.reply(3, 4096) == b"" and entries.reply(7, 4096) == b""  # the end


def test_names_are_nul_terminated() -> None:
    assert wire.names(b"old\0new\0", 2) == ["old", "new"]
    assert wire.names(memoryview(b"only\0"), 1) == ["only"]
    with pytest.raises(ValueError):
        wire.names(b"cut short", 1)


def test_init_takes_the_wanted_flags_the_kernel_offers() -> None:
    offered = wire.ASYNC_READ | wire.MAX_PAGES | wire.INIT_EXT | (1 << 20)
    body = wire.INIT_IN.pack(7, 45, 131072, offered) + wire.INIT_IN_EXT.pack(wire.HAS_RESEND >> 32) + bytes(44)
    reply = wire.negotiate(body, wire.ASYNC_READ | wire.MAX_PAGES | wire.ATOMIC_O_TRUNC, 1 << 20)
    assert reply.minor == wire.KERNEL_MINOR  # the kernel's is newer: Strata's
    assert reply.flags == wire.ASYNC_READ | wire.MAX_PAGES | wire.INIT_EXT
    assert reply.max_readahead == 131072 and reply.max_write == 1 << 20 and reply.max_pages == 256
    out = wire.INIT_OUT.unpack(reply.pack())
    assert out[:4] == (7, wire.KERNEL_MINOR, 131072, reply.flags) and out[6] == 1 << 20 and out[8] == 256
    older = wire.negotiate(wire.INIT_IN.pack(7, 31, 1 << 22, wire.ASYNC_READ), wire.ASYNC_READ, 1 << 20)
    assert older.minor == 31 and older.max_readahead == 1 << 20 and older.flags == wire.ASYNC_READ
    with pytest.raises(ValueError, match="FUSE 8"):
        wire.negotiate(wire.INIT_IN.pack(8, 0, 0, 0), 0, 1 << 20)
