"""Where cached blocks are: an index built from workers' block reports.

A million cached blocks must not cost the master a gigabyte, nor leave its memory in pieces
the allocator cannot give back, so a block is no Python object: it is one entry of a table
packed in arrays (blocktable.py: 32 bytes a slot, ~64 a block at the table's average fill):

- its key is a 64-bit hash of its file, (mount id, path, version, block size), and its index;
- its entry packs its length, its mount (a small number from a table of mounts) and up to
  four workers holding it (a lane of 16 bits each: the worker's number, from a table of
  workers, + 1): `length | mount number << 48 | lanes << 64`; a fifth holder and more
  (copies on more than four workers, rare) are kept in a dict by block, a bit a worker.

Sums the master's answers need are kept running as blocks come and go: bytes per mount, per
(mount, worker), and per file for the blocks after a file's first (the first block's own
entry answers for it, so a file of one block costs nothing more). A worker's blocks are
found, when it is dropped, from its journal: the keys it was given, in two arrays of 64-bit
ints (16 bytes a block it holds), kept at most about twice its blocks by dropping the keys it
no longer holds.

Two blocks whose files' hashes are equal share an entry; with 64 bits that takes billions of
cached files to become likely, and it would name a holder for a block it does not hold or put
a sum off, never serve a wrong byte: workers name, find and check blocks by their full key.
Two reports of one block (same file, version, block size and index) with two lengths keep
the last: the other's holders are forgotten until they report it again.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Iterable, Iterator
from itertools import islice
from typing import Generic, TypeVar

from strata.contract.errors import InvalidArgument
from strata.contract.proto import strata_pb2 as pb
from ..common.blockrefs import reported_key
from ..common.keys import BlockKey
from .blocktable import BlockTable

# Blocks one LocateBlocks request may ask about (a worker asks for the one it misses).
MAX_LOCATE_BLOCKS = 256
# Blocks (or files) the index takes, drops or sums in one go when the caller lets the master
# serve what waits between steps (heartbeats, reads, /healthz): ~15 ms of a busy master's time.
STEP = 2_000

_HASH_BITS = 64
_HASH_MASK = (1 << _HASH_BITS) - 1
_LENGTH_BITS = 48  # a block of up to 256 TiB
_LENGTH_MASK = (1 << _LENGTH_BITS) - 1
_MOUNT_BITS = 16  # mounts with cached blocks at once
_MOUNT_MASK = (1 << _MOUNT_BITS) - 1
_HOLDERS_SHIFT = _LENGTH_BITS + _MOUNT_BITS
_VALUE_MASK = (1 << _HOLDERS_SHIFT) - 1
# A block's first four holders are in its entry, a lane of 16 bits each (worker number + 1);
# more (rare: copies on more than four workers) in a dict by block.
_LANE = (1 << 16) - 1
_LANE_SHIFTS = (0, 16, 32, 48)
# Keys a worker's journal may hold beyond twice its blocks before those it no longer holds go.
_JOURNAL_SLACK = 64


def file_hash(mount_id: int, path: str, version: str, block_size: int) -> int:
    """The file part of a block's key in the index (stable while the master runs)."""
    return hash((mount_id, path, version, block_size)) & _HASH_MASK


def reported_hash(ref: pb.BlockRef) -> int:
    """The file hash of a block in a worker's block report (its key in the index is that and
    its index); InvalidArgument for a block no worker can hold (checked as BlockKey checks it,
    without making one: a report may list a million blocks)."""
    if not ref.path or ref.block_size <= 0 or ref.length > ref.block_size or ref.length > _LENGTH_MASK:
        reported_key(ref)  # raises, naming the field and value
        raise InvalidArgument(f"block report: block {ref.path}#{ref.index} is longer ({ref.length} bytes) "
                              f"than the block index holds ({_LENGTH_MASK} bytes)")
    return file_hash(ref.mount_id, ref.path, ref.version, ref.block_size)


def _subtract(sums: dict[_Sum, int], key: _Sum, n: int) -> None:
    left = sums.get(key, 0) - n
    if left > 0:
        sums[key] = left
    else:
        sums.pop(key, None)


Name = TypeVar("Name", bound=Hashable)
_Sum = TypeVar("_Sum", bound=Hashable)


class Numbers(Generic[Name]):
    """Small numbers for a few large or long names (mount ids, worker ids), each with a
    count of the blocks that use it; a number is free again once its count is back to 0."""

    def __init__(self, what: str, limit: int) -> None:
        self.what = what
        self.limit = limit
        self.names: list[Name | None] = []
        self.counts: list[int] = []
        self._numbers: dict[Name, int] = {}

    def get(self, name: Name) -> int | None:
        return self._numbers.get(name)

    def name(self, number: int) -> Name:
        name = self.names[number]
        assert name is not None, f"{self.what} number {number} is not in use"
        return name

    def take(self, name: Name) -> int:
        number = self._numbers.get(name)
        if number is None:
            number = self.names.index(None) if None in self.names else len(self.names)
            if number >= self.limit:
                raise InvalidArgument(f"the block index holds blocks of at most {self.limit} {self.what}s "
                                      f"at once; {name!r} would be one more")
            if number == len(self.names):
                self.names.append(None)
                self.counts.append(0)
            self.names[number] = name
            self._numbers[name] = number
        self.counts[number] += 1
        return number

    def release(self, number: int) -> None:
        self.counts[number] -= 1
        if not self.counts[number]:
            del self._numbers[self.name(number)]
            self.names[number] = None


class BlockIndex:
    """block -> workers holding it, with sums per mount, per worker and per file."""

    def __init__(self) -> None:
        self._table = BlockTable()  # (file hash, index) -> length | mount << 48 | holders << 64
        self._more: dict[int, int] = {}  # file hash | index << 64 -> holders past four, a bit each
        self._rest_of_file: dict[int, int] = {}  # file hash -> bytes of its blocks after the first
        self._mounts: Numbers[int] = Numbers("mount", 1 << _MOUNT_BITS)  # counts: blocks of the mount
        self._workers: Numbers[str] = Numbers("worker", _LANE)  # counts: blocks the worker holds
        self._by_mount: dict[int, int] = {}  # mount number -> bytes (a block held twice counts once)
        self._by_holder: dict[tuple[int, int], int] = {}  # (mount number, worker number) -> bytes
        self._journals: list[Journal] = []  # by worker number

    def __len__(self) -> int:
        return len(self._table)

    def slots(self) -> int:
        """Slots of the packed table (its memory: 32 bytes a slot)."""
        return self._table.slots()

    def add(self, worker_id: str, refs: Iterable[pb.BlockRef]) -> None:
        table, counts = self._table, self._workers.counts
        worker = self._workers.take(worker_id)  # held while its refs go in: the number stays its own
        journal = self._journal(worker)
        try:
            for ref in refs:
                fh, index, length = reported_hash(ref), ref.index, ref.length
                entry = table.get(fh, index)
                if entry:
                    if not self._matches(entry, ref.mount_id, length):
                        self._forget(fh, index, entry)
                        entry = 0
                    elif self._holds(fh, index, entry, worker):
                        continue  # reported again
                if not entry:
                    mount = self._mounts.take(ref.mount_id)
                    self._by_mount[mount] = self._by_mount.get(mount, 0) + length
                    if index:
                        self._rest_of_file[fh] = self._rest_of_file.get(fh, 0) + length
                    entry = length | mount << _LENGTH_BITS
                    table.put(fh, index, entry | (worker + 1) << _HOLDERS_SHIFT)  # its first holder
                else:
                    table.put(fh, index, self._with_holder(fh, index, entry, worker))
                counts[worker] += 1
                journal.note(fh, index)
                holder = (entry >> _LENGTH_BITS & _MOUNT_MASK, worker)
                self._by_holder[holder] = self._by_holder.get(holder, 0) + length
        finally:
            self._let_go(worker)

    def remove(self, worker_id: str, refs: Iterable[pb.BlockRef]) -> None:
        worker = self._workers.get(worker_id)
        if worker is None:
            return
        for ref in refs:
            fh, index = reported_hash(ref), ref.index
            entry = self._table.get(fh, index)
            if entry and self._matches(entry, ref.mount_id, ref.length):
                self._discard(fh, index, entry, worker)

    def drop_worker(self, worker_id: str) -> None:
        """Forget the blocks `worker_id` holds."""
        for _ in self.dropping(worker_id):
            pass

    def dropping(self, worker_id: str, step: int = STEP) -> Iterator[None]:
        """Forget the blocks `worker_id` holds, `step` of its journal's entries at a time:
        yields between steps, so the caller can let other work run (a worker of a million
        blocks takes seconds). Ends early once the worker holds nothing, so a step resumed
        after its number went to another worker touches none of that worker's blocks."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return
        for n, (fh, index) in enumerate(self._journals[worker].keys(), 1):
            entry = self._table.get(fh, index)
            if entry:
                self._discard(fh, index, entry, worker)
            if n % step == 0:
                yield
                if self._workers.get(worker_id) != worker:
                    return

    def _journal(self, worker: int) -> Journal:
        while len(self._journals) <= worker:
            self._journals.append(Journal())
        journal = self._journals[worker]
        if len(journal) > 2 * self._workers.counts[worker] + _JOURNAL_SLACK:
            held = {fh | index << _HASH_BITS for fh, index in journal.keys()
                    if self._holds(fh, index, self._table.get(fh, index), worker)}
            journal = self._journals[worker] = Journal((key & _HASH_MASK, key >> _HASH_BITS) for key in held)
        return journal

    def _let_go(self, worker: int) -> None:
        """One block (or one call) less for `worker`."""
        self._workers.release(worker)
        if not self._workers.counts[worker]:
            self._journals[worker] = Journal()  # its number may go to another worker

    def _matches(self, entry: int, mount_id: int, length: int) -> bool:
        return entry & _LENGTH_MASK == length and self._mounts.name(entry >> _LENGTH_BITS & _MOUNT_MASK) == mount_id

    def _holds(self, fh: int, index: int, entry: int, worker: int) -> bool:
        lanes = entry >> _HOLDERS_SHIFT
        if lanes == worker + 1:
            return True  # its only holder
        if worker + 1 in (lanes & _LANE, lanes >> 16 & _LANE, lanes >> 32 & _LANE, lanes >> 48):
            return True
        return bool(lanes >> 48) and bool(self._more.get(fh | index << _HASH_BITS, 0) >> worker & 1)

    def _holder_numbers(self, fh: int, index: int, entry: int) -> list[int]:
        lanes = entry >> _HOLDERS_SHIFT
        if lanes <= _LANE:
            return [lanes - 1]  # its only holder
        numbers = [(lanes >> shift & _LANE) - 1 for shift in _LANE_SHIFTS if lanes >> shift & _LANE]
        more = self._more.get(fh | index << _HASH_BITS, 0) if lanes >> 48 else 0
        return numbers + [w for w in range(more.bit_length()) if more >> w & 1]

    def _with_holder(self, fh: int, index: int, entry: int, worker: int) -> int:
        """`entry` with `worker` (not one yet) among its holders: in the first free lane, or
        past the four lanes in `_more`."""
        lanes = entry >> _HOLDERS_SHIFT
        if not lanes:
            return entry | (worker + 1) << _HOLDERS_SHIFT
        for shift in _LANE_SHIFTS:
            if not lanes >> shift & _LANE:
                return entry | (worker + 1) << (_HOLDERS_SHIFT + shift)
        key = fh | index << _HASH_BITS
        self._more[key] = self._more.get(key, 0) | 1 << worker
        return entry

    def _without_holder(self, fh: int, index: int, entry: int, worker: int) -> int:
        """`entry` without `worker` (one of its holders). The lanes stay filled from the first:
        a freed lane takes a holder from `_more`, else the last filled lane's."""
        lanes, key = entry >> _HOLDERS_SHIFT, fh | index << _HASH_BITS
        more = self._more.get(key, 0) if lanes >> 48 else 0
        freed = None
        for shift in _LANE_SHIFTS:
            if lanes >> shift & _LANE == worker + 1:
                freed = shift
                break
        if freed is None:  # a holder past the lanes
            self._keep_more(key, more & ~(1 << worker))
            return entry
        lanes &= ~(_LANE << freed)
        if more:
            self._keep_more(key, more & (more - 1))
            lanes |= (more & -more).bit_length() << freed  # the lowest worker number there, + 1
        else:
            last = max(freed, (lanes.bit_length() - 1) // 16 * 16)  # the lanes are filled from the first
            lanes = lanes & ~(_LANE << last) | (lanes >> last & _LANE) << freed
        return entry & _VALUE_MASK | lanes << _HOLDERS_SHIFT

    def _keep_more(self, key: int, more: int) -> None:
        if more:
            self._more[key] = more
        else:
            self._more.pop(key, None)

    def _discard(self, fh: int, index: int, entry: int, worker: int) -> None:
        """`worker` no longer holds block (fh, index) (if it did)."""
        if not self._holds(fh, index, entry, worker):
            return
        length, mount = entry & _LENGTH_MASK, entry >> _LENGTH_BITS & _MOUNT_MASK
        _subtract(self._by_holder, (mount, worker), length)
        self._let_go(worker)
        entry = entry & _VALUE_MASK if entry >> _HOLDERS_SHIFT == worker + 1 else \
            self._without_holder(fh, index, entry, worker)
        if entry >> _HOLDERS_SHIFT:
            self._table.put(fh, index, entry)
            return
        self._table.delete(fh, index)
        _subtract(self._by_mount, mount, length)
        self._mounts.release(mount)
        if index:
            _subtract(self._rest_of_file, fh, length)

    def _forget(self, fh: int, index: int, entry: int) -> None:
        for worker in self._holder_numbers(fh, index, entry):
            self._discard(fh, index, self._table.get(fh, index), worker)

    def holders(self, key: BlockKey) -> set[str]:
        fh = file_hash(key.mount_id, key.path, key.version, key.block_size)
        entry = self._table.get(fh, key.index)
        if not entry or not self._matches(entry, key.mount_id, key.length):
            return set()
        return {self._workers.name(w) for w in self._holder_numbers(fh, key.index, entry)}

    def cached_bytes_by_mount(self) -> dict[int, int]:
        """Bytes of each mount's data the cache holds; a block held by several workers
        counts once (how much of the data is cached, not how much space it takes)."""
        return {self._mounts.name(m): n for m, n in self._by_mount.items()}

    def cached_bytes_by_worker(self, mount_id: int) -> dict[str, int]:
        mount = self._mounts.get(mount_id)
        return {self._workers.name(w): n for (m, w), n in self._by_holder.items() if m == mount}

    def cached_bytes_of_file(self, mount_id: int, path: str, version: str, *, block_size: int,
                             file_length: int) -> int:
        """Bytes of one version of a file, cut into `block_size` blocks, held by at least one
        worker (copies count once)."""
        if file_length <= 0 or block_size <= 0:
            return 0
        return self._cached_bytes(mount_id, file_hash(mount_id, path, version, block_size),
                                  min(block_size, file_length), file_length > block_size)

    def cached_bytes_of(self, files: Files, start: int = 0, stop: int | None = None) -> int:
        """Bytes of `files` (those from `start` to `stop`) held by at least one worker
        (copies count once)."""
        chosen = islice(zip(files.mount_ids, files.hashes, files.firsts), start, stop)
        return sum(self._cached_bytes(mount_id, fh, first & _LENGTH_MASK, first > _LENGTH_MASK)
                   for mount_id, fh, first in chosen)

    def _cached_bytes(self, mount_id: int, fh: int, first_length: int, more: bool) -> int:
        first = self._table.get(fh, 0)
        held = first & _LENGTH_MASK if first and self._matches(first, mount_id, first_length) else 0
        return held + (self._rest_of_file.get(fh, 0) if more else 0)


class Journal:
    """The keys of the blocks a worker was given (some it may no longer hold), in arrays."""

    def __init__(self, keys: Iterable[tuple[int, int]] = ()) -> None:
        self._hashes = array("Q")
        self._indexes = array("Q")
        for fh, index in keys:
            self.note(fh, index)

    def __len__(self) -> int:
        return len(self._hashes)

    def note(self, fh: int, index: int) -> None:
        self._hashes.append(fh)
        self._indexes.append(index)

    def keys(self) -> Iterator[tuple[int, int]]:
        return zip(self._hashes, self._indexes)


class Files:
    """Files whose cached bytes are asked for again and again (a load's, for each Report),
    kept as three ints a file in arrays (~24 bytes) rather than an entry object each."""

    def __init__(self) -> None:
        self.mount_ids = array("Q")
        self.hashes = array("Q")
        self.firsts = array("Q")  # the first block's length, + 2**48 if the file has more blocks

    def __len__(self) -> int:
        return len(self.hashes)

    def add(self, mount_id: int, path: str, version: str, *, block_size: int, file_length: int) -> None:
        if file_length <= 0 or block_size <= 0:
            return  # no blocks
        self.mount_ids.append(mount_id)
        self.hashes.append(file_hash(mount_id, path, version, block_size))
        self.firsts.append(min(block_size, file_length, _LENGTH_MASK) | (file_length > block_size) << _LENGTH_BITS)
