"""Pacing: a byte pacer (work handed out at a steady number of bytes a second, whoever asks),
and the pause long work on an event loop makes between its steps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


# Long work on an event loop (a worker's block list of a million, a sum over a million files)
# goes in steps, and between two the loop waits this long for its I/O. Yielding with no wait is
# not enough: gRPC's poller thread, which hands the loop new calls and messages, needs the GIL,
# and a loop busy in Python lets it have it once a switch interval (5 ms), so a restart's storm
# of 100 workers' lists held heartbeat answers 2.6-4.6 s (median) and the master dropped live
# workers; with a millisecond a step (~18 ms) the median answer was 54 ms and none was dropped.
STEP_PAUSE = 0.001


async def between_steps() -> None:
    """Let the event loop serve its I/O between two steps of long work."""
    await asyncio.sleep(STEP_PAUSE)


class Pacer:
    """Grants bytes at `rate` a second to any number of callers, in the order they ask.

    A grant of n bytes ends its slot of n / rate seconds (the slot starts when the previous
    one ended, or now if that is past): the bytes granted over any window are at most
    rate x window plus the one grant that straddles its start, and time spent idle earns no
    credit for a burst later. A rate of 0 grants at once (no limit)."""

    def __init__(self, rate: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        if rate < 0:
            raise ValueError(f"a pacing rate is bytes a second, not negative: got {rate!r}")
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._free_at = float("-inf")  # when the last granted slot ends
        self._lock = asyncio.Lock()

    async def take(self, nbytes: int) -> None:
        """Return once `nbytes` fit the pace (at once for 0 bytes or no limit)."""
        if self.rate == 0 or nbytes <= 0:
            return
        async with self._lock:  # one slot after the other, in the order asked
            self._free_at = max(self._free_at, self._clock()) + nbytes / self.rate
            wait = self._free_at - self._clock()
            if wait > 0:
                await self._sleep(wait)
