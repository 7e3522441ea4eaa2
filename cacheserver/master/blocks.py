"""Where cached blocks are: an index built from workers' block reports."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from strata.contract.proto import strata_pb2 as pb
from ..common.blockrefs import reported_key
from ..common.keys import BlockKey

# Blocks one LocateBlocks request may ask about (a worker asks for the one it misses).
MAX_LOCATE_BLOCKS = 256


@dataclass(frozen=True)
class BlockRecord:
    key: BlockKey
    length: int


class BlockIndex:
    """block id -> workers holding it, with sums per mount, per worker and per file."""

    def __init__(self) -> None:
        self._holders: dict[str, set[str]] = defaultdict(set)
        self._records: dict[str, BlockRecord] = {}
        self._by_worker: dict[str, set[str]] = defaultdict(set)
        self._by_file: dict[tuple[int, str, str], set[str]] = defaultdict(set)

    def add(self, worker_id: str, refs: Iterable[pb.BlockRef]) -> None:
        for ref in refs:
            key = reported_key(ref)
            block_id = key.block_id
            self._records[block_id] = BlockRecord(key, key.length)
            self._by_file[(key.mount_id, key.path, key.version)].add(block_id)
            self._holders[block_id].add(worker_id)
            self._by_worker[worker_id].add(block_id)

    def remove(self, worker_id: str, refs: Iterable[pb.BlockRef]) -> None:
        for ref in refs:
            self._discard(worker_id, reported_key(ref).block_id)

    def drop_worker(self, worker_id: str) -> None:
        for block_id in list(self._by_worker.pop(worker_id, ())):
            self._discard(worker_id, block_id, keep_worker_entry=True)

    def _discard(self, worker_id: str, block_id: str, keep_worker_entry: bool = False) -> None:
        holders = self._holders.get(block_id)
        if holders is None:
            return
        holders.discard(worker_id)
        if not keep_worker_entry:
            self._by_worker[worker_id].discard(block_id)
        if not holders:
            del self._holders[block_id]
            record = self._records.pop(block_id, None)
            if record is not None:
                file_key = (record.key.mount_id, record.key.path, record.key.version)
                self._by_file[file_key].discard(block_id)
                if not self._by_file[file_key]:
                    del self._by_file[file_key]

    def holders(self, key: BlockKey) -> set[str]:
        return set(self._holders.get(key.block_id, ()))

    def cached_bytes_by_mount(self) -> dict[int, int]:
        """Bytes of each mount's data the cache holds; a block held by several workers
        counts once (how much of the data is cached, not how much space it takes)."""
        sums: dict[int, int] = defaultdict(int)
        for record in self._records.values():  # a record lives exactly while a worker holds it
            sums[record.key.mount_id] += record.length
        return dict(sums)

    def cached_bytes_by_worker(self, mount_id: int) -> dict[str, int]:
        sums: dict[str, int] = defaultdict(int)
        for block_id, record in self._records.items():
            if record.key.mount_id == mount_id:
                for worker_id in self._holders[block_id]:
                    sums[worker_id] += record.length
        return dict(sums)

    def cached_bytes_of_file(self, mount_id: int, path: str, version: str) -> int:
        """Bytes of one version of a file held by at least one worker (copies count once)."""
        return sum(self._records[b].length for b in self._by_file.get((mount_id, path, version), ()))
