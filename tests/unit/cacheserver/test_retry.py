from __future__ import annotations

import time

import pytest

from strata.cacheserver import retry
from strata.cacheserver.retry import backoff_delay, call_with_backoff


class Flaky:
    """Fails with `error` for the first `failures` calls, then returns "ok"."""

    def __init__(self, failures: int, error: BaseException) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


async def test_transient_errors_are_retried_until_success() -> None:
    fn = Flaky(2, ConnectionError("reset"))
    result = await call_with_backoff(fn, what="test", base_delay=0.001, retry_on=(ConnectionError,))
    assert result == "ok"
    assert fn.calls == 3


async def test_no_attempt_limit_retries_past_the_default_until_success() -> None:
    fn = Flaky(retry.DEFAULT_ATTEMPTS * 4, ConnectionError("store down"))
    result = await call_with_backoff(fn, what="test", attempts=None, base_delay=0.0001, max_delay=0.001,
                                     retry_on=(ConnectionError,))
    assert result == "ok"
    assert fn.calls == retry.DEFAULT_ATTEMPTS * 4 + 1


async def test_no_attempt_limit_still_raises_errors_it_does_not_retry() -> None:
    fn = Flaky(3, ValueError("not transient"))
    with pytest.raises(ValueError):
        await call_with_backoff(fn, what="test", attempts=None, base_delay=0.0001, retry_on=(ConnectionError,))
    assert fn.calls == 1


async def test_last_error_is_raised_as_is_after_all_attempts() -> None:
    error = ConnectionError("down for good")
    fn = Flaky(10, error)
    with pytest.raises(ConnectionError) as raised:
        await call_with_backoff(fn, what="test", attempts=4, base_delay=0.001, retry_on=(ConnectionError,))
    assert raised.value is error
    assert fn.calls == 4


async def test_errors_not_listed_are_not_retried() -> None:
    fn = Flaky(3, FileNotFoundError("gone"))
    with pytest.raises(FileNotFoundError):
        await call_with_backoff(fn, what="test", base_delay=0.001, retry_on=(ConnectionError,))
    assert fn.calls == 1


async def test_waits_grow_exponentially_up_to_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    # Jitter pinned to its upper end: waits are 0.02, 0.04, 0.08 (then capped at 0.1).
    monkeypatch.setattr(retry.random, "uniform", lambda low, high: high)
    fn = Flaky(4, TimeoutError())
    started = time.monotonic()
    await call_with_backoff(
        fn, what="test", attempts=5, base_delay=0.02, max_delay=0.1, retry_on=(TimeoutError,)
    )
    elapsed = time.monotonic() - started
    assert fn.calls == 5
    assert 0.02 + 0.04 + 0.08 + 0.1 <= elapsed < 2.0


def test_delay_is_full_jitter_below_the_capped_exponential() -> None:
    for attempt, cap in [(0, 0.05), (1, 0.1), (2, 0.2), (6, 2.0), (200, 2.0)]:
        samples = [backoff_delay(attempt, base_delay=0.05, max_delay=2.0) for _ in range(300)]
        assert all(0.0 <= s <= cap for s in samples)
        # Full jitter spreads over the whole range, not just near the cap.
        assert min(samples) < cap / 4 and max(samples) > cap * 3 / 4


async def test_attempts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="attempts must be at least 1, got 0"):
        await call_with_backoff(Flaky(0, OSError()), what="test", attempts=0, retry_on=(OSError,))
