from __future__ import annotations

import random

from strata.cacheserver.master.blocktable import SHARDS, BlockTable

HELD = 1 << 64  # an entry's holders word must not be 0


def test_keys_that_hash_to_one_slot_are_each_found_and_removed_alone() -> None:
    """Keys of one shard and one home slot (their hashes differ only in bits that neither
    the shard nor the slot reads) sit one after the other: removing any of them, first,
    middle or last of the run, leaves every other found, and the freed slots taken again."""
    same_spot = [(n << 30, 0) for n in range(1, 40)]  # bits 30-35: above the slot's, below the shard's
    table = BlockTable()
    for n, (fh, index) in enumerate(same_spot):
        table.put(fh, index, n | HELD)
    rng = random.Random(3)
    kept = {key: n for n, key in enumerate(same_spot)}
    for key in rng.sample(same_spot, len(same_spot)):
        table.delete(*key)
        del kept[key]
        assert table.get(*key) == 0
        assert all(table.get(*k) == n | HELD for k, n in kept.items())
        assert len(table) == len(kept)
    table.put(*same_spot[5], 7 | HELD)
    assert table.get(*same_spot[5]) == 7 | HELD and len(table) == 1


def test_the_table_answers_as_a_dict_would_after_any_puts_and_deletes() -> None:
    """Random puts (new keys and new values of kept ones), deletes and gets over a few
    thousand keys, some of a file's many blocks: through every growth and shrink."""
    rng = random.Random(27)
    keys = [(rng.getrandbits(64), rng.choice((0, 0, 1, 2, 1 << 40))) for _ in range(3_000)]
    table, model = BlockTable(), {}
    for step in range(60_000):
        key = rng.choice(keys)
        if rng.random() < 0.55 - 0.3 * (step // 20_000 == 2):  # the last third mostly deletes
            entry = rng.getrandbits(64) | rng.randrange(1, 1 << 64) << 64
            table.put(*key, entry)
            model[key] = entry
        else:
            table.delete(*key)
            model.pop(key, None)
        if step % 1_000 == 0:
            assert all(table.get(*k) == model.get(k, 0) for k in keys)
    assert len(table) == len(model)
    assert all(table.get(*k) == model.get(k, 0) for k in keys)


def test_memory_follows_the_keys_held_however_many_came_and_went() -> None:
    """Slots grow with the keys (at most three a key, doubling) and go back when the keys
    go: a worker's million blocks dropped leave no table of a million slots behind; blocks
    cached and evicted over and over leave no dead slots (no tombstones) either."""
    table = BlockTable()
    empty = table.slots()
    keys = [(random.getrandbits(64), n % 16) for n in range(100_000)]
    for fh, index in keys:
        table.put(fh, index, HELD)
    assert len(table) == len(keys)
    assert len(keys) < table.slots() <= 3 * len(keys) + empty
    for fh, index in keys[10:]:
        table.delete(fh, index)
    assert len(table) == 10 and table.slots() <= 2 * empty
    churned = keys[:1_000]
    for _ in range(20):
        for fh, index in churned:
            table.put(fh, index, 2 * HELD)
        for fh, index in churned[10:]:
            table.delete(fh, index)
    assert table.slots() <= 2 * empty
    assert all(table.get(*k) == 2 * HELD for k in churned[:10]) and table.get(*churned[10]) == 0


def test_no_shard_holds_much_more_than_its_part_of_the_keys() -> None:
    """A shard is rebuilt whole when it grows: the master's longest pause for it is one
    shard's keys, so the keys must spread over the shards (a file's many blocks too)."""
    table = BlockTable()
    for f in range(2_000):
        fh = random.getrandbits(64)
        for index in range(100):
            table.put(fh, index, HELD)
    per_shard = len(table) / SHARDS
    assert max(shard.count for shard in table._shards) < 2 * per_shard
