"""Which cached block to evict first.

A policy only ranks block ids; the store decides what an eviction does (demote or drop)
and skips pinned blocks. Every policy shares the bookkeeping in `EvictionPolicy` and
overrides one method, `_mark`, which gives a block its new rank when it is added or read.
A logical clock (one tick per add or access) keeps the order independent of wall time.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import ClassVar, NamedTuple

from strata.contract.errors import InvalidArgument


class Mark(NamedTuple):
    """A block's rank (lowest is evicted first) and what the policy needs for the next one."""

    rank: float
    tick: int
    weight: float = 1.0


class EvictionPolicy(ABC):
    """Shared bookkeeping: block id -> Mark. Subclasses override `_mark` only."""

    name: ClassVar[str] = ""

    def __init__(self) -> None:
        self._tick = 0
        # Re-inserted on every touch, so insertion order stays close to rank order and the
        # sort in victims() runs in near-linear time.
        self._marks: dict[str, Mark] = {}

    def record_add(self, block_id: str) -> None:
        """A block entered the cache (also used to replay blocks found at restart)."""
        self._tick += 1
        self._marks.pop(block_id, None)
        self._marks[block_id] = self._mark(None, self._tick)

    def record_access(self, block_id: str) -> None:
        """A cached block was read. Unknown ids are ignored (the block left meanwhile)."""
        previous = self._marks.pop(block_id, None)
        if previous is None:
            return
        self._tick += 1
        self._marks[block_id] = self._mark(previous, self._tick)

    def record_remove(self, block_id: str) -> None:
        self._marks.pop(block_id, None)

    def victims(self) -> Iterator[str]:
        """All known block ids, first to evict first: a snapshot taken when called, so the
        caller may remove blocks while iterating."""
        marks = self._marks
        return iter(sorted(marks, key=lambda block_id: marks[block_id].rank))

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._marks

    def __len__(self) -> int:
        return len(self._marks)

    @abstractmethod
    def _mark(self, previous: Mark | None, tick: int) -> Mark:
        """The new mark of a block touched at `tick`; `previous` is None for a new block."""


class LRUPolicy(EvictionPolicy):
    """Least recently used first."""

    name = "LRU"

    def _mark(self, previous: Mark | None, tick: int) -> Mark:
        return Mark(float(tick), tick)


class LRFUPolicy(EvictionPolicy):
    """Least recently/frequently used (Lee et al., 2001): each block has a combined
    recency-frequency value CRF = sum over its accesses of 2 ** (-age / half_life), with age
    counted in accesses to the whole cache since then. The lowest CRF is evicted first.

    `half_life` (accesses, > 0) sets the balance: an access counts half as much after
    `half_life` more accesses to the cache. With half_life <= 1 the most recent access
    always outweighs all older ones (pure LRU); as half_life grows the policy approaches LFU.
    The default, 1024, lets a block read k times survive a scan of about
    1024 * log2(k) blocks that are read once, which protects a hot working set from one-off
    sequential reads.
    """

    name = "LRFU"
    DEFAULT_HALF_LIFE = 1024.0

    def __init__(self, half_life: float = DEFAULT_HALF_LIFE) -> None:
        if not half_life > 0 or math.isinf(half_life):
            raise InvalidArgument(f"LRFU half_life must be a finite number > 0, got {half_life!r}")
        super().__init__()
        self.half_life = float(half_life)

    def _mark(self, previous: Mark | None, tick: int) -> Mark:
        crf = 1.0
        if previous is not None:
            crf += previous.weight * 2.0 ** (-(tick - previous.tick) / self.half_life)
        # CRFs of all blocks decay by the same factor as time passes, so comparing them now
        # is comparing log2(crf) + tick / half_life, which does not change until the next
        # access of that block: a rank fixed at touch time.
        return Mark(math.log2(crf) + tick / self.half_life, tick, crf)


EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {
    policy.name: policy for policy in (LRUPolicy, LRFUPolicy)
}


def make_policy(name: str) -> EvictionPolicy:
    """A new policy by its registered name (CacheCluster spec.cachePolicy.eviction)."""
    try:
        policy = EVICTION_POLICIES[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(EVICTION_POLICIES))
        raise InvalidArgument(f"unknown eviction policy {name!r}; use one of {known}") from None
    return policy()
