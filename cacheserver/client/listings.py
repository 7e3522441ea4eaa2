"""The folder listings a filesystem object keeps (fsspec's listings cache, bounded): a listed
folder's entries answer info() of each of them, by name, until they expire or a change made
through the same object drops them.
"""

from __future__ import annotations

import time
from typing import Any

from fsspec.dircache import DirCache

# How long a folder's listing answers info() of its entries in this process (fsspec's
# `listings_expiry_time`; `use_listings_cache=False` turns it off). Changes made through this
# filesystem object drop the listings they touch at once; others show after this long.
LISTINGS_EXPIRY = 10.0
# Entries of folders' listings this process keeps at most (for info() of listed files):
# ~100 MiB of them; a walk of a larger tree lets the oldest listings go.
LISTINGS_MAX_ENTRIES = 200_000


class Listing(list[dict[str, Any]]):
    """A folder's entries as fsspec's listings cache keeps them, and the same by name, so
    info() of each of 10,000 listed files is a lookup, not a scan."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        super().__init__(entries)
        self.by_name = {e["name"]: e for e in entries}


class Listings(DirCache):  # type: ignore[misc]
    """fsspec's listings cache, holding at most `max_entries` entries in all: the oldest
    listings go first (fsspec's own keeps every folder a walk of millions of files listed)."""

    def __init__(self, max_entries: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._max_entries = max_entries
        self._entries = 0

    def __setitem__(self, key: str, value: list[dict[str, Any]]) -> None:
        self.pop(key, None)
        super().__setitem__(key, value)
        if key in self._cache:
            self._entries += len(value)
        while self._entries > self._max_entries and len(self._cache) > 1:
            self.pop(next(iter(self._cache)))

    def __getitem__(self, key: str) -> list[dict[str, Any]]:
        expiry = self.listings_expiry_time
        if expiry is not None and key in self._cache and time.time() - self._times.get(key, 0) > expiry:
            del self[key]
        return self._cache[key]  # type: ignore[no-any-return]

    def __delitem__(self, key: str) -> None:
        value = self._cache.pop(key)
        self._times.pop(key, None)
        self._entries -= len(value)

    def clear(self) -> None:
        super().clear()
        self._times.clear()
        self._entries = 0
