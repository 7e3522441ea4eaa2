from __future__ import annotations

import time
from typing import Any

from strata.cacheserver.client.listings import Listings


def listing(folder: str, count: int) -> list[dict[str, Any]]:
    return [{"name": f"{folder}/{i}", "type": "file", "size": 0} for i in range(count)]


def test_the_listings_cache_lets_the_oldest_folders_go_past_its_size() -> None:
    """A walk of a tree of millions of files keeps only the last listings it made."""
    cache = Listings(1000, listings_expiry_time=None)
    for folder in range(50):
        cache[f"/d{folder}"] = listing(f"/d{folder}", 100)
    assert sorted(cache) == [f"/d{folder}" for folder in range(40, 50)]
    cache["/d49"] = listing("/d49", 10)  # listed again: counted once
    cache["/big"] = listing("/big", 5000)  # larger than the whole cache: kept alone
    assert list(cache) == ["/big"]
    del cache["/big"]
    cache["/a"] = listing("/a", 1000)
    assert list(cache) == ["/a"]


def test_expired_listings_are_dropped_and_uncounted() -> None:
    cache = Listings(1000, listings_expiry_time=0.05)
    cache["/a"] = listing("/a", 900)
    time.sleep(0.1)
    assert "/a" not in cache
    cache["/b"] = listing("/b", 900)
    assert list(cache) == ["/b"]
