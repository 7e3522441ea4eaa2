"""The byte pacer: grants at its rate over any window, in order, without credit for idle time."""

from __future__ import annotations

import asyncio

import pytest

from strata.cacheserver.common.pacing import Pacer


class FakeTime:
    """A clock that sleeping moves forward, and a record of when each grant returned."""

    def __init__(self) -> None:
        self.now = 100.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def pacer(rate: float, t: FakeTime) -> Pacer:
    return Pacer(rate, clock=t.clock, sleep=t.sleep)


async def test_grants_at_the_rate_counting_each_grant_before_it_is_handed_out() -> None:
    t = FakeTime()
    p = pacer(10.0, t)
    granted = []
    for _ in range(5):
        await p.take(20)
        granted.append(t.now - 100.0)
    assert granted == [2.0, 4.0, 6.0, 8.0, 10.0]  # 100 bytes in 10 s: never ahead of the rate


async def test_idle_time_earns_no_burst() -> None:
    t = FakeTime()
    p = pacer(10.0, t)
    await p.take(10)
    t.now += 60.0  # a minute of cached blocks, nothing fetched
    start = t.now
    await p.take(10)
    await p.take(10)
    assert t.now - start == 2.0


async def test_concurrent_callers_share_one_rate_in_the_order_they_asked() -> None:
    t = FakeTime()
    p = pacer(100.0, t)
    done: list[tuple[int, float]] = []

    async def one(i: int) -> None:
        await p.take(50)
        done.append((i, t.now - 100.0))

    await asyncio.gather(*(one(i) for i in range(4)))
    assert done == [(0, 0.5), (1, 1.0), (2, 1.5), (3, 2.0)]


async def test_no_limit_and_nothing_to_fetch_grant_at_once() -> None:
    t = FakeTime()
    await pacer(0, t).take(1 << 30)
    await pacer(10.0, t).take(0)
    assert t.now == 100.0


def test_a_negative_rate_is_refused_with_the_value() -> None:
    with pytest.raises(ValueError, match="-5"):
        Pacer(-5)
