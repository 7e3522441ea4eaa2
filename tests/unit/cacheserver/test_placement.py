from __future__ import annotations

from collections import Counter

from strata.cacheserver.placement import owner, rank_workers

BLOCKS = [f"block-{i}" for i in range(3000)]


def test_every_client_finds_the_same_owner_whatever_the_worker_order() -> None:
    workers = ["w0", "w1", "w2"]
    for block in BLOCKS[:100]:
        assert owner(block, workers) == owner(block, list(reversed(workers)))


def test_blocks_spread_evenly() -> None:
    counts = Counter(owner(b, ["w0", "w1", "w2", "w3"]) for b in BLOCKS)
    assert set(counts) == {"w0", "w1", "w2", "w3"}
    assert min(counts.values()) > 0.8 * len(BLOCKS) / 4


def test_adding_a_worker_moves_only_its_share() -> None:
    before = {b: owner(b, ["w0", "w1", "w2"]) for b in BLOCKS}
    after = {b: owner(b, ["w0", "w1", "w2", "w3"]) for b in BLOCKS}
    moved = [b for b in BLOCKS if before[b] != after[b]]
    assert all(after[b] == "w3" for b in moved)
    assert 0.15 < len(moved) / len(BLOCKS) < 0.35


def test_removing_a_worker_moves_only_its_blocks_to_their_next_choice() -> None:
    for block in BLOCKS[:300]:
        ranked = rank_workers(block, ["w0", "w1", "w2"])
        survivors = [w for w in ["w0", "w1", "w2"] if w != ranked[0]]
        assert owner(block, survivors) == ranked[1]


def test_no_workers_no_owner() -> None:
    assert owner("b", []) is None
