"""The table of small files' bytes a worker shares with the processes of its node: its records.

A new process on a node (a training loader of each epoch) that found a file's status in the
node's status table (common/statustable.py) still asked the node's worker for the file's
block: one round trip an open. For a small warm file the worker also publishes its bytes in
a second table of the same layout (magic MAGIC, fewer slots for its size), and the process
answers the open from its mapping: a lookup, a copy and a checksum, no request.

A record of `path` is the table's record (see statustable) whose body is, after the path:
mount id (u64), the file's length (u32), chunk size (u32), the version's length (u16), the
version, then one CRC-32C (u32) per chunk of the bytes (common/checksums.py); its payload is
the file's bytes. The table's crc32 covers the body; the bytes are checked against the
checksums on every read, and those are the block's own (made when the worker cached it), so
what a reader gets is what the store held. Nothing else is trusted: a record of another mount,
version or length, a payload past the table's end or a chunk that fails its check is a miss,
and the reader asks the worker as it would without the table.

The status's validity governs what is read (a record only matches a version): the reader
looks here only for the version a valid status names.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from .checksums import first_bad_chunk
from .statustable import TableView

MAGIC = b"STRATADT"
# Bytes of data a slot in use, for the slots' share of a table: small files of ~4 KiB fill
# the slots (half of them) and the data about together; larger ones fill the data first.
BYTES_PER_SLOT = 4096
_HEAD = struct.Struct("<QIIH")  # mount id, length, chunk size, version length
_CHECKSUM = struct.Struct("<I")


def record_of(mount_id: int, version: str, chunk_size: int, checksums: Sequence[int], length: int) -> bytes:
    """The body (after the path) of the record of a file of `length` bytes in these chunks."""
    encoded = version.encode()
    return (_HEAD.pack(mount_id, length, chunk_size, len(encoded)) + encoded
            + struct.pack(f"<{len(checksums)}I", *checksums))


def file_bytes(view: TableView, path: str, mount_id: int, version: str, length: int) -> bytes | None:
    """The bytes of the file `path` of this mount, version and length the table holds, each
    chunk checked against its CRC-32C; None when it holds none or none that checks."""
    found = view.find(path.encode())
    if found is None:
        return None
    body = found[2]
    if len(body) < _HEAD.size:
        return None  # dropped
    mount, size, chunk_size, version_length = _HEAD.unpack_from(body, 0)
    at = _HEAD.size + version_length
    if (mount, size) != (mount_id, length) or chunk_size <= 0 or body[_HEAD.size:at] != version.encode():
        return None
    chunks = -(-length // chunk_size)
    if len(body) != at + chunks * _CHECKSUM.size:
        return None
    data = view.payload(found[1], length)
    if data is None:
        return None
    checksums = struct.unpack_from(f"<{chunks}I", body, at)
    if first_bad_chunk(data, 0, checksums, chunk_size) is not None:
        return None
    return data
