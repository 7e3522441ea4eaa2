"""What a run measured: series of times per contestant and phase, grouped by workload."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Series:
    contestant: str
    label: str
    phase: str                     # cold | warm | write | read-back | 4 at once | fifth
    times: list[float] = field(default_factory=list)
    note: str = ""
    skipped: str = ""              # why there are no times
    failures: list[str] = field(default_factory=list)  # reads that raised or returned wrong data
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.times) and not self.skipped

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def max(self) -> float:
        return max(self.times)

    @property
    def spread(self) -> float:
        return self.max / self.min if self.min > 0 else float("inf")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if self.ok:
            data.update(min=self.min, median=self.median, max=self.max, spread=self.spread)
        return data


@dataclass
class Workload:
    id: str
    title: str
    description: str
    bytes: int                     # bytes one read moves (0 where it means nothing)
    series: list[Series] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before and after

    def get(self, contestant: str, phase: str) -> Series | None:
        for s in self.series:
            if s.contestant == contestant and s.phase == phase:
                return s
        return None

    def series_for(self, contestant: str, label: str, phase: str) -> Series:
        found = self.get(contestant, phase)
        if found is None:
            found = Series(contestant, label, phase)
            self.series.append(found)
        return found

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "description": self.description, "bytes": self.bytes,
                "load_average": list(self.load), "series": [s.to_json() for s in self.series], "extra": self.extra}


@dataclass
class Target:
    id: str
    text: str
    verdict: str                   # PASS | MISS | N/A
    value: float | None = None     # the measured ratio
    threshold: str = ""
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write_result(out: Path, result: Any, text: str) -> None:
    """A stand-alone benchmark's result: `out`.json (every number) and `out`.md (its
    tables, also printed)."""
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)
