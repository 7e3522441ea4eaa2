"""The worker's tiered block store: blocks of remote files cached in MEM, SSD and HDD tiers.

    store = BlockStore([TierConfig("MEM", 1 << 30), TierConfig("SSD", 100 << 30, (Path("/ssd"),))])
    await store.open()
    block, hit = await store.get_or_fetch(key, fetch)
    data = await store.read(key, offset, size)
"""

from .eviction import EVICTION_POLICIES, EvictionPolicy, LRFUPolicy, LRUPolicy, make_policy
from .index import CachedBlock, TierUsage
from .keys import BlockKey
from .metadata import CHUNK_SIZE, BlockCorrupt, BlockMetadata
from .store import BlockStore
from .tiers import TierConfig, default_mem_dir

__all__ = [
    "CHUNK_SIZE",
    "EVICTION_POLICIES",
    "BlockCorrupt",
    "BlockKey",
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
