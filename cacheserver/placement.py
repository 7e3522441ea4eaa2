"""Block placement by rendezvous (highest random weight) hashing.

Every client computes a block's owner from the live worker list alone, without asking the
master; adding or removing a worker moves only the blocks that worker wins or held.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence


def _weight(worker_id: str, block_id: str) -> int:
    digest = hashlib.blake2b(f"{worker_id}\0{block_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rank_workers(block_id: str, worker_ids: Iterable[str]) -> list[str]:
    """Workers in order of preference for a block: the owner first, then its fallbacks."""
    return sorted(worker_ids, key=lambda w: (_weight(w, block_id), w), reverse=True)


def owner(block_id: str, worker_ids: Sequence[str]) -> str | None:
    ranked = rank_workers(block_id, worker_ids)
    return ranked[0] if ranked else None
