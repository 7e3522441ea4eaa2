"""Worker membership: registration, heartbeats, expiry, decommissioning."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from strata.contract.proto import strata_pb2 as pb


@dataclass
class WorkerRecord:
    info: pb.WorkerInfo
    stats: pb.WorkerStats
    last_heartbeat: float
    decommissioning: bool = False
    registered_at: float = field(default_factory=time.monotonic)


class Membership:
    """Live workers. A worker that misses `timeout` seconds of heartbeats leaves placement."""

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._timeout = timeout
        self._clock = clock
        self._workers: dict[str, WorkerRecord] = {}
        self._decommissioned: set[str] = set()

    def register(self, info: pb.WorkerInfo, stats: pb.WorkerStats) -> WorkerRecord:
        record = WorkerRecord(
            info=info,
            stats=stats,
            last_heartbeat=self._clock(),
            decommissioning=info.worker_id in self._decommissioned,
        )
        self._workers[info.worker_id] = record
        return record

    def heartbeat(self, worker_id: str, stats: pb.WorkerStats) -> bool:
        """Record a heartbeat; False when the worker is unknown (it must register again)."""
        record = self._workers.get(worker_id)
        if record is None:
            return False
        record.last_heartbeat = self._clock()
        record.stats = stats
        return True

    def is_live(self, record: WorkerRecord) -> bool:
        return self._clock() - record.last_heartbeat <= self._timeout

    def expire(self) -> list[str]:
        """Forget workers whose heartbeats stopped; returns their ids."""
        gone = [w for w, r in self._workers.items() if not self.is_live(r)]
        for worker_id in gone:
            del self._workers[worker_id]
        return gone

    def decommission(self, worker_ids: list[str]) -> None:
        self._decommissioned.update(worker_ids)
        for worker_id in worker_ids:
            if worker_id in self._workers:
                self._workers[worker_id].decommissioning = True

    def get(self, worker_id: str) -> WorkerRecord | None:
        return self._workers.get(worker_id)

    def records(self) -> list[WorkerRecord]:
        return sorted(self._workers.values(), key=lambda r: r.info.worker_id)

    def live(self) -> list[WorkerRecord]:
        return [r for r in self.records() if self.is_live(r)]

    def placement(self) -> list[WorkerRecord]:
        """Workers that take new blocks: live and not leaving."""
        return [r for r in self.live() if not r.decommissioning]

    def to_proto(self, record: WorkerRecord) -> pb.WorkerInfo:
        info = pb.WorkerInfo()
        info.CopyFrom(record.info)
        info.decommissioning = record.decommissioning
        return info
