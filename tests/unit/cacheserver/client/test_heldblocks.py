"""Block files kept open between opens (client/heldblocks.py), on real files.

The blocks are real files read through the compiled core, as a worker's block files are. A
range that fails its check is read again through the worker's socket: here a stand-in for it
(`Worker`) answers with the block's true bytes; tests/integration/test_held_blocks.py has a
real worker.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from damage import flip_byte
from waiting import wait_until

from strata.cacheserver.client import heldblocks
from strata.cacheserver.client.heldblocks import HeldBlocks
from strata.cacheserver.client.transfer import LocalBlock, ShortCircuitReader
from strata.cacheserver.common.checksums import CHUNK_SIZE, compute_checksums
from strata.cacheserver.native import BlockFile
from strata.contract.proto import strata_pb2 as pb

BLOCK = 3 * CHUNK_SIZE + 100


@pytest.fixture(autouse=True)
def quick_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heldblocks, "CHECK_EVERY", 0.05)


class Worker:
    """Stands in for the worker's short-circuit socket: the bytes of a range read again."""

    where = "stand-in"

    def __init__(self, files: Files) -> None:
        self.files = files
        self.reads = 0

    def read(self, ref: pb.BlockRef, offset: int, length: int, read_type: int) -> bytes:
        self.reads += 1
        return self.files.data[ref.index][offset:offset + length]


class Files:
    """Block files in a folder, as a worker's tier keeps them."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.data: dict[int, bytes] = {}
        self.worker = Worker(self)

    def ref(self, index: int, version: str = "v1") -> pb.BlockRef:
        return pb.BlockRef(mount_id=1, path="/m/f.bin", version=version, index=index, block_size=BLOCK,
                           file_length=10 * BLOCK)

    def hold(self, index: int) -> LocalBlock:
        path = self.folder / f"{index}.blk"
        if index not in self.data:
            self.data[index] = os.urandom(BLOCK)
            path.write_bytes(self.data[index])
        fd = os.open(path, os.O_RDONLY)
        try:
            block = BlockFile(fd, BLOCK, list(compute_checksums(self.data[index])), CHUNK_SIZE)
        finally:
            os.close(fd)
        return LocalBlock(cast(ShortCircuitReader, self.worker), self.ref(index), 0, block)

    def evict(self, index: int) -> None:
        (self.folder / f"{index}.blk").unlink()


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path)


@pytest.fixture
def held() -> Iterator[HeldBlocks]:
    kept = HeldBlocks(4, 30.0)
    yield kept
    kept.clear()


def test_a_block_held_before_is_given_out_again_and_reads_its_bytes(files: Files, held: HeldBlocks) -> None:
    block = files.hold(0)
    held.put(files.ref(0), 0, block)
    again = held.get(files.ref(0), 0)
    assert again is block
    assert bytes(again.read(5, BLOCK)) == files.data[0][5:]


def test_another_version_index_or_read_type_is_another_block(files: Files, held: HeldBlocks) -> None:
    held.put(files.ref(0), 0, files.hold(0))
    assert held.get(files.ref(0, version="v2"), 0) is None
    assert held.get(files.ref(1), 0) is None
    assert held.get(files.ref(0), pb.NO_CACHE) is None


def test_a_block_file_the_worker_unlinked_is_not_given_out_and_is_let_go(files: Files, held: HeldBlocks) -> None:
    held.put(files.ref(0), 0, files.hold(0))
    held.put(files.ref(1), 0, files.hold(1))
    files.evict(0)
    assert held.get(files.ref(0), 0) is None  # found unlinked when asked
    files.evict(1)
    wait_until(lambda: len(held) == 0, 10, "the checking thread to let go of the unlinked file")


def test_a_block_whose_check_failed_is_not_given_out_again(files: Files, held: HeldBlocks) -> None:
    block = files.hold(0)
    held.put(files.ref(0), 0, block)
    flip_byte(files.folder / "0.blk", CHUNK_SIZE + 1)
    assert bytes(block.read(0, BLOCK)) == files.data[0]  # through the worker, which checks the block
    assert files.worker.reads == 1
    assert held.get(files.ref(0), 0) is None


def test_kept_files_are_bounded_in_number_oldest_first(files: Files, held: HeldBlocks) -> None:
    for index in range(6):
        held.put(files.ref(index), 0, files.hold(index))
    assert len(held) == 4
    assert held.get(files.ref(0), 0) is None and held.get(files.ref(1), 0) is None
    assert all(held.get(files.ref(i), 0) is not None for i in range(2, 6))


def test_kept_files_are_let_go_after_their_time_even_when_no_one_asks(files: Files) -> None:
    kept = HeldBlocks(4, 0.3)
    block = files.hold(0)
    kept.put(files.ref(0), 0, block)
    assert kept.get(files.ref(0), 0) is block
    wait_until(lambda: len(kept) == 0, 10, "the kept file to be let go after 0.3 s")
    assert kept.get(files.ref(0), 0) is None
    kept.clear()


@pytest.mark.parametrize("settings", [(0, 30.0), (4, 0.0)])
def test_none_is_kept_when_turned_off(files: Files, settings: tuple[int, float]) -> None:
    kept = HeldBlocks(*settings)
    kept.put(files.ref(0), 0, files.hold(0))
    assert len(kept) == 0 and kept.get(files.ref(0), 0) is None


def test_the_descriptor_is_closed_once_nothing_holds_the_block(files: Files, held: HeldBlocks) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for index in range(6):
        held.put(files.ref(index), 0, files.hold(index))
    assert len(os.listdir("/proc/self/fd")) == before + 4  # the two oldest closed already
    held.clear()
    assert len(os.listdir("/proc/self/fd")) == before


def test_cleared_keeps_nothing_more(files: Files, held: HeldBlocks) -> None:
    held.clear()
    held.put(files.ref(0), 0, files.hold(0))
    assert len(held) == 0

