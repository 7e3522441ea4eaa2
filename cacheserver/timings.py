"""Durations counted into histogram buckets by a label tuple, safe from several threads,
shown as one Prometheus histogram family: what `storemetrics` and `rpcmetrics` time."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from prometheus_client.core import HistogramMetricFamily


class Timings:
    """Counts of durations in `buckets` (upper bounds, seconds) and their sum, by labels."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self._bounds = tuple(buckets)
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, ...], list[int]] = {}
        self._sums: dict[tuple[str, ...], float] = {}

    def observe(self, labels: tuple[str, ...], seconds: float) -> None:
        index = next((i for i, bound in enumerate(self._bounds) if seconds <= bound), len(self._bounds))
        with self._lock:
            self._counts.setdefault(labels, [0] * (len(self._bounds) + 1))[index] += 1
            self._sums[labels] = self._sums.get(labels, 0.0) + seconds

    def family(self, name: str, documentation: str, labels: Sequence[str]) -> HistogramMetricFamily:
        with self._lock:
            counts = {key: list(value) for key, value in self._counts.items()}
            sums = dict(self._sums)
        family = HistogramMetricFamily(name, documentation, labels=list(labels))
        for key in sorted(counts):
            cumulative, total = [], 0
            for bound, count in zip((*(repr(float(b)) for b in self._bounds), "+Inf"), counts[key]):
                total += count
                cumulative.append((bound, total))
            family.add_metric(list(key), cumulative, sums[key])
        return family
