"""The table of file statuses a worker shares with the processes of its node: its layout.

A new process on a node (a loader of each epoch, a `find` that stats what it found) would ask
the node's worker for each status it has not seen. The worker publishes the reusable statuses
it keeps (worker/kept.py) in a table of shared memory instead, and gives each process its
descriptor once (worker/published.py); the process maps it read-only and answers a stat by a
hash lookup in the mapping, with no request (client/nodetable.py).

Layout (little-endian), in one file of `size` bytes:
- header (HEADER_BYTES): magic, layout, retired (1 once the worker moved on to a new table:
  a reader asks for the new one), generation, slot count (a power of two), data size, bytes
  of data used;
- slots: one u64 each, the offset of a path's newest record (0: empty), found by linear
  probing from crc32(path);
- data: records appended, never changed once written: u32 length and u32 crc32 of the body
  that follows; the body is `valid until` (f64, seconds of CLOCK_MONOTONIC, the clock both
  sides share on one node, which neither NTP nor the administrator moves), the path's length
  (u16), the path, then the serialized FileInfo. A record may carry a payload after its body
  (from the next 8-byte boundary on), which its body describes and the crc32 does not cover:
  the node's data table (common/datatable.py) keeps a file's bytes there, checked by their
  own CRC-32C.

The same layout, under another magic and with fewer slots for its size, is the data table's.

One writer (the worker, under its lock) writes a record whole before the slot that points to
it, and a record is never written over. A reader trusts nothing it reads: a slot pointing
outside the data, a record whose checksum does not match (torn, corrupted) or whose path is
not the one asked for is a miss, and so is a record past its validity: the reader then asks
as it would without the table.
"""

from __future__ import annotations

import mmap
import struct
import zlib

MAGIC = b"STRATAST"
LAYOUT = 1
# magic, layout, retired, generation, slots, data size, data used
_HEADER = struct.Struct("<8sIIQQQQ")
HEADER_BYTES = 64
_RETIRED_AT = 12
_USED_AT = 40
_SLOT = struct.Struct("<Q")
_RECORD = struct.Struct("<II")  # body length, crc32 of the body
_BODY = struct.Struct("<dH")  # valid until, path length
# Slots probed for a path at most: past that the table is too full (the worker starts anew).
MAX_PROBES = 32
# Bytes of data per slot in use: a record of a status with a 40-character path takes ~170
# bytes, so at half the slots in use (a new table is due) the data area is about full too.
BYTES_PER_SLOT = 128
# The smallest table: a header, 64 slots and their records.
MIN_TABLE_BYTES = HEADER_BYTES + 64 * (8 + BYTES_PER_SLOT)
MAX_PATH_BYTES = 0xFFFF


class TableError(Exception):
    """The bytes are not a status table of this layout (a reader then uses none)."""


def slot_count(size: int, bytes_per_slot: int = BYTES_PER_SLOT) -> int:
    """The slots of a table of `size` bytes: the largest power of two that leaves each slot
    in use (at most half of them) `bytes_per_slot` bytes of data."""
    count = 1
    while (count * 2) * (8 + bytes_per_slot // 2) <= size - HEADER_BYTES:
        count *= 2
    return count


def _probe(path: bytes, slots: int) -> int:
    return zlib.crc32(path) & (slots - 1)


class TableView:
    """A table read in a mapping; thread-safe (it only reads)."""

    def __init__(self, table: mmap.mmap, magic: bytes = MAGIC) -> None:
        if len(table) < MIN_TABLE_BYTES:
            raise TableError(f"a table of {len(table)} bytes is shorter than the smallest, {MIN_TABLE_BYTES}")
        found, layout, _, generation, slots, data_size, _ = _HEADER.unpack_from(table, 0)
        if found != magic or layout != LAYOUT:
            raise TableError(f"not a {magic!r} table of layout {LAYOUT} (magic {found!r}, layout {layout})")
        self._data_at = HEADER_BYTES + slots * 8
        if slots < 1 or slots & (slots - 1) or self._data_at + data_size > len(table):
            raise TableError(f"a table of {len(table)} bytes cannot hold {slots} slots and "
                             f"{data_size} bytes of data")
        self.table = table
        self.generation = int(generation)
        self.slots = int(slots)
        self._data_end = self._data_at + data_size

    @property
    def retired(self) -> bool:
        """Whether the worker moved on to a new table (this one gets nothing new)."""
        return bool(struct.unpack_from("<I", self.table, _RETIRED_AT)[0])

    def find(self, path: bytes) -> tuple[float, int, bytes] | None:
        """The newest record of `path`: (valid until, its offset, the serialized FileInfo);
        None when there is none or what is there cannot be trusted (see the module docstring)."""
        table, slots = self.table, self.slots
        at = _probe(path, slots)
        for _ in range(MAX_PROBES):
            offset = _SLOT.unpack_from(table, HEADER_BYTES + at * 8)[0]
            if offset == 0:
                return None
            if not self._data_at <= offset <= self._data_end - _RECORD.size:
                return None
            length, crc = _RECORD.unpack_from(table, offset)
            start = offset + _RECORD.size
            if length < _BODY.size or start + length > self._data_end:
                return None
            body = table[start:start + length]
            if zlib.crc32(body) != crc:
                return None
            until, path_length = _BODY.unpack_from(body, 0)
            if body[_BODY.size:_BODY.size + path_length] == path:
                return until, offset, body[_BODY.size + path_length:]
            at = (at + 1) & (slots - 1)
        return None

    def payload(self, offset: int, length: int) -> bytes | None:
        """The `length` bytes of payload after the record at `offset` (one `find` returned),
        copied; None when they would lie past the data (a damaged record). Unchecked: what
        the record's body says of them checks them."""
        start = offset + _RECORD.size + _RECORD.unpack_from(self.table, offset)[0]
        start += -start % 8
        if length < 0 or start + length > self._data_end:
            return None
        return self.table[start:start + length]


class TableWriter(TableView):
    """The one writer of a table in a writable mapping (not thread-safe: its owner locks)."""

    @classmethod
    def create(cls, table: mmap.mmap, generation: int, magic: bytes = MAGIC,
               bytes_per_slot: int = BYTES_PER_SLOT) -> TableWriter:
        """Lay out an empty table over the (zeroed) mapping."""
        slots = slot_count(len(table), bytes_per_slot)
        data_size = len(table) - HEADER_BYTES - slots * 8
        _HEADER.pack_into(table, 0, magic, LAYOUT, 0, generation, slots, data_size, 0)
        return cls(table, magic)

    def __init__(self, table: mmap.mmap, magic: bytes = MAGIC) -> None:
        super().__init__(table, magic)
        self.records = 0
        self._used = int(struct.unpack_from("<Q", table, _USED_AT)[0])

    def put(self, path: bytes, until: float, info: bytes, payload: bytes | memoryview = b"") -> bool:
        """Record `info` (and `payload` after it) as what `path` has until `until` (unless
        the newest record of it says the same); False when the table has no room for it
        (then a new one is due)."""
        if len(path) > MAX_PATH_BYTES:
            return True  # never published: readers of it ask the worker
        table, slots = self.table, self.slots
        at = _probe(path, slots)
        for _ in range(MAX_PROBES):
            offset = _SLOT.unpack_from(table, HEADER_BYTES + at * 8)[0]
            if offset == 0:
                if self.records * 2 >= slots:
                    return False
                self.records += 1
                break
            found = self._record_path(offset)
            if found == path:
                known = self.find(path)
                if known is not None and known[0] == until and known[2] == info:
                    return True
                break
            at = (at + 1) & (slots - 1)
        else:
            return False
        body = _BODY.pack(until, len(path)) + path + info
        start = self._data_at + self._used
        end = start + _RECORD.size + len(body)
        end += -end % 8  # a payload and the next record start aligned
        payload_at = end
        if payload:
            end += len(payload) + -len(payload) % 8
        if end > self._data_end:
            return False
        table[start + _RECORD.size:start + _RECORD.size + len(body)] = body
        table[payload_at:payload_at + len(payload)] = payload
        _RECORD.pack_into(table, start, len(body), zlib.crc32(body))
        _SLOT.pack_into(table, HEADER_BYTES + at * 8, start)  # last: readers find the whole record
        self._used = end - self._data_at
        struct.pack_into("<Q", table, _USED_AT, self._used)
        return True

    def drop(self, path: bytes) -> bool:
        """Readers no longer find a valid status of `path`: its newest record becomes one
        valid until 0; False when the table has no room for that (a new one is due)."""
        return self.find(path) is None or self.put(path, 0.0, b"")

    def retire(self) -> None:
        """Tell the readers to ask for the new table."""
        struct.pack_into("<I", self.table, _RETIRED_AT, 1)

    def _record_path(self, offset: int) -> bytes:
        length = _RECORD.unpack_from(self.table, offset)[0]
        start = offset + _RECORD.size
        path_length = _BODY.unpack_from(self.table, start)[1]
        return self.table[start + _BODY.size:start + _BODY.size + min(path_length, length)]
