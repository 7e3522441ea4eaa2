"""The statuses a worker keeps for its node's readers: each only within its validity."""

from __future__ import annotations

from pathlib import Path

from strata.cacheserver.cache.index import CachedBlock
from strata.cacheserver.common.keys import BlockKey
from strata.cacheserver.worker.kept import KeptStatuses
from strata.contract.proto import strata_pb2 as pb


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def status(path: str, valid_for_ms: int, version: str = "v1") -> pb.FileInfo:
    return pb.FileInfo(path=path, version=version, length=10, valid_for_ms=valid_for_ms)


def test_an_answer_is_kept_until_its_validity_from_the_question_ends() -> None:
    clock = Clock()
    kept = KeptStatuses(clock=clock)
    kept.put(status("/a", 5000), sent=clock.now - 1.0)  # asked a second ago
    got = kept.get("/a")
    assert got is not None and got.version == "v1"
    assert got.valid_for_ms == 4000  # what is left of it, for the reader to hold no longer
    clock.now += 3.999
    assert kept.get("/a") is not None
    clock.now += 0.002
    assert kept.get("/a") is None
    assert len(kept) == 0


def test_an_answer_not_marked_reusable_drops_what_was_kept() -> None:
    kept = KeptStatuses(clock=Clock())
    kept.put(status("/a", 5000), sent=100.0)
    kept.put(status("/a", 0, version="v2"), sent=100.0)  # e.g. the master saw a change
    assert kept.get("/a") is None
    kept.put(pb.FileInfo(path="/d", is_dir=True, valid_for_ms=5000), sent=100.0)
    assert kept.get("/d") is None


def test_forget_and_the_limit() -> None:
    kept = KeptStatuses(limit=2, clock=Clock())
    for name in ("/a", "/b", "/c"):
        kept.put(status(name, 5000), sent=100.0)
    assert kept.get("/a") is None  # the least recently used went
    assert kept.get("/b") is not None and kept.get("/c") is not None
    kept.forget("/b")
    assert kept.get("/b") is None


def block_of(info: pb.FileInfo, version: str | None = None) -> CachedBlock:
    key = BlockKey(info.mount_id, info.path, version or info.version, 0, 1 << 20, info.length)
    return CachedBlock(key, info.length, "MEM", Path("/tiers/mem") / key.block_id, False, (1,), 65536)


def test_a_kept_block_goes_with_its_status_and_never_names_another_version() -> None:
    clock = Clock()
    kept = KeptStatuses(clock=clock)
    info = status("/a", 5000)
    info.length = 10
    kept.hold_block(info, block_of(info))
    assert kept.opened("/a") is None  # no status kept: no block either
    kept.put(info, sent=clock.now)
    assert kept.opened("/a") == (kept.get("/a"), None)
    kept.hold_block(info, block_of(info, version="old"))  # a block of another version: not answered with
    assert kept.opened("/a")[1] is None  # type: ignore[index]
    kept.hold_block(info, block_of(info))
    assert kept.opened("/a")[1] == block_of(info)  # type: ignore[index]
    kept.lost_block("/a")  # no longer at its place: the loop answers
    assert kept.opened("/a")[1] is None  # type: ignore[index]
    kept.hold_block(info, block_of(info))
    changed = status("/a", 5000, version="v2")
    changed.length = 10
    kept.put(changed, sent=clock.now)  # a new version: the old block is forgotten
    assert kept.opened("/a")[1] is None  # type: ignore[index]
    kept.hold_block(changed, block_of(changed))
    clock.now += 6.0  # past its validity: neither is answered
    assert kept.opened("/a") is None
    kept.put(changed, sent=clock.now)
    assert kept.opened("/a")[1] is None  # type: ignore[index]
