"""The one retry helper: capped exponential backoff with full jitter.

Every call to a store goes through `call_with_backoff` (ufs.Store), and so do the steps
of an ASYNC_THROUGH upload (worker/uploads.py): no other code retries a failed call in a
loop of its own. What else repeats is not a retry: periodic work that goes on whatever the
last answer was (heartbeats, the worker's list of peers, TTL sweeps), a fallback to another
source (a reader tries the next worker; a damaged cached copy is fetched again once; a
block store that finds its disk full evicts and places the block again), or a kept
connection found closed and opened anew once. Only the error types the caller names are
retried; the last error is raised unchanged, so the caller sees the real cause. How a
store's calls are retried is the servers' setting `RetrySettings` (cacheserver/settings.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# Five tries with delays capped at 2 s ride out a store's brief hiccup (a throttled burst,
# a restarted endpoint) in a few seconds, yet a store that is really down fails a request
# well before a client's own deadline.
DEFAULT_ATTEMPTS = 5
# 50 ms is a few round trips to an object store: short enough that one lost request costs
# little, long enough that a throttling store sees fewer requests.
DEFAULT_BASE_DELAY = 0.05
# No single wait longer than 2 s: a caller is blocked on the answer.
DEFAULT_MAX_DELAY = 2.0


def backoff_delay(retry: int, *, base_delay: float, max_delay: float) -> float:
    """Seconds to wait before retry number `retry` (0 = the first retry): full jitter,
    a uniform pick in [0, min(max_delay, base_delay * 2**retry)]."""
    cap = min(max_delay, base_delay * (2.0 ** min(retry, 62)))
    return random.uniform(0.0, cap)


async def call_with_backoff(
    fn: Callable[[], Awaitable[T]],
    *,
    what: str,
    attempts: int | None = DEFAULT_ATTEMPTS,
    base_delay: float = DEFAULT_BASE_DELAY,
    max_delay: float = DEFAULT_MAX_DELAY,
    retry_on: tuple[type[BaseException], ...],
) -> T:
    """Await `fn()`; when it raises one of `retry_on`, wait and call it again, at most
    `attempts` times in all (None: until it succeeds or raises something else, for work
    that must not be given up, such as an acknowledged write's upload). `what` names the
    operation in log lines."""
    if attempts is not None and attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    attempt = 0
    while True:
        try:
            return await fn()
        except retry_on as exc:
            if attempts is not None and attempt + 1 >= attempts:
                raise
            delay = backoff_delay(attempt, base_delay=base_delay, max_delay=max_delay)
            log.info(
                "%s failed (try %d of %s), retrying in %.3fs: %s",
                what, attempt + 1, attempts or "unlimited", delay, exc,
            )
            attempt += 1
            await asyncio.sleep(delay)
