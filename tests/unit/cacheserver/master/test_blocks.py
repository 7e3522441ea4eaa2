from __future__ import annotations

from strata.cacheserver.common.keys import BlockKey
from strata.cacheserver.master.blocks import BlockIndex
from strata.contract.proto import strata_pb2 as pb

MiB = 1 << 20


def ref(path: str, index: int, *, mount: int = 1, version: str = "v1", length: int = 0) -> pb.BlockRef:
    """A block as a worker reports it: with its block size and length."""
    return pb.BlockRef(mount_id=mount, path=path, version=version, index=index, block_size=4 * MiB,
                       length=length or min(4 * MiB, 10 * MiB - index * 4 * MiB))


def key(path: str, index: int) -> BlockKey:
    return BlockKey.of_file(1, path, "v1", block_size=4 * MiB, file_length=10 * MiB, index=index)


def test_holders_and_sums_follow_reports() -> None:
    index = BlockIndex()
    index.add("w0", [ref("/d/a", 0), ref("/d/a", 1), ref("/d/a", 2)])
    index.add("w1", [ref("/d/a", 0), ref("/e/b", 0, mount=2, length=5)])
    assert index.holders(key("/d/a", 0)) == {"w0", "w1"}
    assert index.cached_bytes_of_file(1, "/d/a", "v1") == 10 * MiB  # copies count once
    assert index.cached_bytes_by_mount() == {1: 10 * MiB, 2: 5}  # so here too
    assert index.cached_bytes_by_worker(1) == {"w0": 10 * MiB, "w1": 4 * MiB}
    index.remove("w0", [ref("/d/a", 2)])
    assert index.cached_bytes_of_file(1, "/d/a", "v1") == 8 * MiB
    index.drop_worker("w1")
    assert index.holders(key("/d/a", 0)) == {"w0"}
    assert index.cached_bytes_by_mount() == {1: 8 * MiB}
    assert index.cached_bytes_of_file(1, "/d/a", "v2") == 0


def test_a_worker_reregistering_replaces_its_blocks() -> None:
    index = BlockIndex()
    index.add("w0", [ref("/d/a", 0), ref("/d/a", 1)])
    index.drop_worker("w0")
    index.add("w0", [ref("/d/a", 1)])
    assert index.holders(key("/d/a", 0)) == set()
    assert index.holders(key("/d/a", 1)) == {"w0"}
