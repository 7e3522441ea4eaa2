"""The worker's tiered block store: blocks of remote files cached in MEM, SSD and HDD tiers.

    store = BlockStore([TierConfig("MEM", 1 << 30), TierConfig("SSD", 100 << 30, (Path("/ssd"),))])
    await store.open()
    block, hit = await store.get_or_fetch(key, fetch)
    data = await store.read(key, offset, size)
"""

from .eviction import EVICTION_POLICIES, EvictionPolicy, LRFUPolicy, LRUPolicy, make_policy
from .index import CachedBlock, TierUsage
from .metadata import BlockCorrupt, BlockMetadata
from .store import BlockStore
from .tiers import TierConfig, default_mem_dir

__all__ = [
    "EVICTION_POLICIES",
    "BlockCorrupt",
    "BlockMetadata",
    "BlockStore",
    "CachedBlock",
    "EvictionPolicy",
    "LRFUPolicy",
    "LRUPolicy",
    "TierConfig",
    "TierUsage",
    "default_mem_dir",
    "make_policy",
]
