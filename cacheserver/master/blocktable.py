"""A hash table of cached blocks packed in arrays: no Python object a block.

A key is a block's (file hash, block index), two 64-bit numbers; its entry two 64-bit words,
`value` and `holders`, given and returned as one number `value | holders << 64`. An entry
whose holders word is 0 is no entry: a slot is empty when its holders word is.

The table is cut into SHARDS open-addressing tables (linear probing, at most two thirds
full), each four arrays of 64-bit words (keys' hashes, keys' indexes, values, holders): 32
bytes a slot, ~64 a key at the average fill. A shard doubles when two thirds full and halves
when under an eighth, rebuilt at once: one shard holds a 1/SHARDS part of the keys, so the
longest rebuild is that part's (~1,000 keys at a million, a millisecond or two), never the
whole table's. A removed key's slot is filled by moving back the keys after it that may sit
there (backward-shift deletion): no tombstones, so lookups never slow down with churn.
"""

from __future__ import annotations

from array import array

_WORD = (1 << 64) - 1
_SHARD_BITS = 10
SHARDS = 1 << _SHARD_BITS
_SHARD_SHIFT = 64 - _SHARD_BITS
_SHARD_MASK = SHARDS - 1
_MIX = 0x9E3779B97F4A7C15  # spreads a file's blocks over the table (2**64 / the golden ratio)
_SMALLEST = 8  # slots of a shard at least


def _words(n: int) -> array[int]:
    return array("Q", bytes(8 * n))


class _Shard:
    __slots__ = ("hashes", "indexes", "values", "holders", "mask", "count")

    def __init__(self, slots: int) -> None:
        self.hashes = _words(slots)
        self.indexes = _words(slots)
        self.values = _words(slots)
        self.holders = _words(slots)
        self.mask = slots - 1
        self.count = 0

    def rebuilt(self, slots: int) -> _Shard:
        shard = _Shard(slots)
        hashes, indexes, values, holders, mask = shard.hashes, shard.indexes, shard.values, shard.holders, shard.mask
        for fh, index, value, held in zip(self.hashes, self.indexes, self.values, self.holders):
            if held:
                i = (fh ^ index * _MIX) & mask
                while holders[i]:
                    i = (i + 1) & mask
                hashes[i], indexes[i], values[i], holders[i] = fh, index, value, held
        shard.count = self.count
        return shard


class BlockTable:
    """(file hash, block index) -> value | holders << 64, holders never 0."""

    def __init__(self) -> None:
        self._shards = [_Shard(_SMALLEST) for _ in range(SHARDS)]
        self._len = 0
        # Where the last `get` found its key, or the empty slot it would take: a `put` or
        # `delete` of the same key right after it starts there.
        self._shard = self._shards[0]
        self._slot = 0
        self._fh = self._index = -1  # no key: rebuilds and deletes move keys

    def __len__(self) -> int:
        return self._len

    def get(self, fh: int, index: int) -> int:
        """The key's entry, 0 if it has none."""
        spot = fh ^ index * _MIX
        self._shard = shard = self._shards[spot >> _SHARD_SHIFT & _SHARD_MASK]
        self._fh, self._index = fh, index
        holders, mask = shard.holders, shard.mask
        i = spot & mask
        while held := holders[i]:
            if shard.hashes[i] == fh and shard.indexes[i] == index:
                self._slot = i
                return shard.values[i] | held << 64
            i = (i + 1) & mask
        self._slot = i
        return 0

    def _at(self, fh: int, index: int) -> tuple[_Shard, int]:
        """The shard and slot of the key, or of the empty slot it would take."""
        if fh != self._fh or index != self._index:
            self.get(fh, index)
        return self._shard, self._slot

    def put(self, fh: int, index: int, entry: int) -> None:
        """Set the key's entry (its holders word, `entry >> 64`, must not be 0)."""
        holders = entry >> 64
        assert 0 < holders <= _WORD, f"block table entry {entry:#x}: its holders word must be one non-zero word"
        if fh != self._fh or index != self._index:
            self.get(fh, index)
        shard, i = self._shard, self._slot
        if shard.holders[i]:
            shard.values[i], shard.holders[i] = entry & _WORD, holders
            return
        shard.hashes[i], shard.indexes[i], shard.values[i], shard.holders[i] = fh, index, entry & _WORD, holders
        shard.count += 1
        self._len += 1
        if 3 * shard.count > 2 * (shard.mask + 1):
            self._fh = -1
            self._shards[(fh ^ index * _MIX) >> _SHARD_SHIFT & _SHARD_MASK] = shard.rebuilt(2 * (shard.mask + 1))

    def delete(self, fh: int, index: int) -> None:
        """Forget the key (if it has an entry)."""
        shard, i = self._at(fh, index)
        hashes, indexes, values, holders, mask = shard.hashes, shard.indexes, shard.values, shard.holders, shard.mask
        if not holders[i]:
            return
        j = i
        while True:  # move back each key after the hole that may sit in it
            j = (j + 1) & mask
            if not holders[j]:
                break
            home = (hashes[j] ^ indexes[j] * _MIX) & mask
            if (home <= i < j) or (j < home <= i) or (i < j < home):
                hashes[i], indexes[i], values[i], holders[i] = hashes[j], indexes[j], values[j], holders[j]
                i = j
        holders[i] = 0
        self._fh = -1
        shard.count -= 1
        self._len -= 1
        if mask + 1 > _SMALLEST and 8 * shard.count < mask + 1:
            self._shards[(fh ^ index * _MIX) >> _SHARD_SHIFT & _SHARD_MASK] = shard.rebuilt((mask + 1) // 2)

    def slots(self) -> int:
        """Slots the table has (filled or not): its memory is 32 bytes a slot."""
        return sum(shard.mask + 1 for shard in self._shards)
