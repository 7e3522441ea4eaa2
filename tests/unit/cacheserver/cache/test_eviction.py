from __future__ import annotations

import random

import pytest

from strata.cacheserver.cache import EVICTION_POLICIES, EvictionPolicy, LRFUPolicy, LRUPolicy, make_policy
from strata.contract.errors import InvalidArgument


@pytest.fixture
def policy(eviction: str) -> EvictionPolicy:
    return make_policy(eviction)


def test_registry_names_match_classes() -> None:
    assert EVICTION_POLICIES == {"LRU": LRUPolicy, "LRFU": LRFUPolicy}
    for name, cls in EVICTION_POLICIES.items():
        assert type(make_policy(name)) is cls and cls.name == name


def test_unknown_policy_names_the_value_and_the_known_ones() -> None:
    with pytest.raises(InvalidArgument, match=r"unknown eviction policy 'FIFO'; use one of LRFU, LRU"):
        make_policy("FIFO")


def test_contract_new_blocks_go_last_and_removed_ones_vanish(policy: EvictionPolicy) -> None:
    for name in "abc":
        policy.record_add(name)
    assert list(policy.victims()) == ["a", "b", "c"]
    policy.record_remove("b")
    policy.record_remove("b")
    assert list(policy.victims()) == ["a", "c"] and len(policy) == 2 and "b" not in policy
    policy.record_access("ghost")  # a block that left meanwhile is not brought back
    assert "ghost" not in policy


def test_contract_victims_is_a_snapshot(policy: EvictionPolicy) -> None:
    for i in range(5):
        policy.record_add(str(i))
    seen = []
    for block_id in policy.victims():
        seen.append(block_id)
        policy.record_remove(block_id)
        policy.record_add("new" + block_id)
    assert seen == ["0", "1", "2", "3", "4"]


def test_contract_one_access_moves_a_block_behind_untouched_ones(policy: EvictionPolicy) -> None:
    for name in "abc":
        policy.record_add(name)
    policy.record_access("a")
    assert list(policy.victims()) == ["b", "c", "a"]


def test_lru_and_lrfu_differ_on_a_hot_block_followed_by_a_scan() -> None:
    # a is read often, then c is added and b read once more: LRU forgets a's history,
    # LRFU keeps it (a CRF of ~6 against 2 and 1).
    orders = {}
    for name in EVICTION_POLICIES:
        policy = make_policy(name)
        policy.record_add("a")
        policy.record_add("b")
        for _ in range(5):
            policy.record_access("a")
        policy.record_add("c")
        policy.record_access("b")
        orders[name] = list(policy.victims())
    assert orders == {"LRU": ["a", "c", "b"], "LRFU": ["c", "b", "a"]}


def test_lrfu_with_half_life_one_is_lru() -> None:
    rng = random.Random(5)
    lru, lrfu = LRUPolicy(), LRFUPolicy(half_life=1)
    names = [f"b{i}" for i in range(40)]
    for name in names:
        lru.record_add(name)
        lrfu.record_add(name)
    for _ in range(2000):
        name = rng.choice(names[: rng.randint(1, len(names))])
        lru.record_access(name)
        lrfu.record_access(name)
    assert list(lrfu.victims()) == list(lru.victims())


def test_lrfu_with_a_long_half_life_ranks_by_frequency() -> None:
    policy = LRFUPolicy(half_life=1e6)
    counts = {"x": 9, "y": 1, "z": 4}
    for name in counts:
        policy.record_add(name)
    # Interleave the accesses so recency alone would give another order.
    for round_ in range(max(counts.values())):
        for name in ("z", "x", "y"):
            if round_ < counts[name] - 1:
                policy.record_access(name)
    assert list(policy.victims()) == ["y", "z", "x"]


def test_lrfu_frequency_fades_with_the_half_life() -> None:
    policy = LRFUPolicy(half_life=4)
    policy.record_add("hot")
    for _ in range(3):
        policy.record_access("hot")  # CRF ~3.1
    # Then a scan: blocks read once. Blocks added within 4 * log2(3.1) ~ 6.6 accesses of
    # hot's last one rank below it; later ones above, as hot's frequency has faded.
    for i in range(12):
        policy.record_add(f"new{i}")
    scan = [f"new{i}" for i in range(12)]
    assert list(policy.victims()) == scan[:6] + ["hot"] + scan[6:]


@pytest.mark.parametrize("half_life", [0, -1, float("inf"), float("nan")])
def test_lrfu_half_life_must_be_positive_and_finite(half_life: float) -> None:
    with pytest.raises(InvalidArgument, match="half_life must be a finite number > 0"):
        LRFUPolicy(half_life=half_life)
