"""What a process's store calls did, for /metrics: each `Store` operation (`read`, `info`,
`upload`, ...) timed, and its failures counted by the Strata error they became.

One table a process: every Store of every mount of a master or worker adds to it, and both
servers put it in their registries (`STORE_METRICS`). Labels are bounded: the operation
names are a fixed set, and errors are the Strata error classes."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from .timings import Timings

# Seconds: a metadata answer (ms) up to a multi-gigabyte upload (minutes).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class StoreMetrics(Collector):
    """Durations and errors of store operations, by operation."""

    def __init__(self) -> None:
        self._timings = Timings(BUCKETS)
        self._lock = threading.Lock()  # Stores of blocking filesystems finish on their threads
        self._errors: dict[tuple[str, str], int] = {}

    def observe(self, operation: str, seconds: float, error: str = "") -> None:
        """One store operation ended after `seconds` (with its retries), failed with `error`
        (the Strata error's class name) or not."""
        self._timings.observe((operation,), seconds)
        if error:
            with self._lock:
                self._errors[(operation, error)] = self._errors.get((operation, error), 0) + 1

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        yield self._timings.family("strata_store_request_seconds",
                                   "Store operations (with their retries) by operation, and how long they took",
                                   ["operation"])
        with self._lock:
            errors = dict(self._errors)
        failed = CounterMetricFamily(
            "strata_store_errors",
            "Store operations that failed (after their retries), by operation and the error they became",
            labels=["operation", "error"],
        )
        for (operation, error), count in sorted(errors.items()):
            failed.add_metric([operation, error], count)
        yield failed


STORE_METRICS = StoreMetrics()
