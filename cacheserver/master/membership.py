"""Worker membership: registration, heartbeats, expiry, decommissioning.

Decommissioning is the operator's word, by worker name: `decommission` before a scale-in
(the names leave), `serve` when the names are wanted again (a scale-out to the same
ordinals). The run of a worker that was told to leave and is stopping (it reports so) stays
out of placement even once its name is wanted again: the run after it takes blocks."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from strata.contract.proto import strata_pb2 as pb

# Runs (incarnations) of one name remembered as told to leave: the newest ones. A pod that
# restarts again and again while its name is leaving adds one run each time; only the runs
# that may still be alive (the last few) can report that they stop.
TOLD_RUNS_KEPT = 8


@dataclass
class WorkerRecord:
    info: pb.WorkerInfo
    stats: pb.WorkerStats
    last_heartbeat: float
    incarnation: str = ""   # names this run of the worker process
    stopping: bool = False  # this run got its stop signal and drains
    decommissioning: bool = False
    registered_at: float = field(default_factory=time.monotonic)


class Membership:
    """Live workers. A worker that misses `timeout` seconds of heartbeats leaves placement."""

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._timeout = timeout
        self._clock = clock
        self._workers: dict[str, WorkerRecord] = {}
        # Names the operator said leave and has not wanted back since.
        self._leaving: set[str] = set()
        # By name, the runs (incarnations) that were registered while their name was leaving:
        # a stopping one of them stays out of placement after its name is wanted back.
        self._runs_told_to_leave: dict[str, list[str]] = {}

    def register(self, info: pb.WorkerInfo, stats: pb.WorkerStats, *, incarnation: str = "",
                 stopping: bool = False) -> WorkerRecord:
        record = WorkerRecord(info=info, stats=stats, last_heartbeat=self._clock(), incarnation=incarnation,
                              stopping=stopping)
        self._workers[info.worker_id] = record
        if info.worker_id in self._leaving:
            self._remember_told_to_leave(info.worker_id, incarnation)
        elif incarnation not in self._runs_told_to_leave.get(info.worker_id, ()):
            self._runs_told_to_leave.pop(info.worker_id, None)  # a run after the leaving ones: they are over
        self._mark_decommissioning(record)
        return record

    def heartbeat(self, worker_id: str, stats: pb.WorkerStats, *, stopping: bool = False) -> bool:
        """Record a heartbeat; False when the worker is unknown (it must register again)."""
        record = self._workers.get(worker_id)
        if record is None:
            return False
        record.last_heartbeat = self._clock()
        record.stats = stats
        record.stopping = stopping
        self._mark_decommissioning(record)
        return True

    def heard(self, worker_id: str) -> None:
        """The worker was heard from now (its registration was answered): its heartbeats are
        counted from here."""
        record = self._workers.get(worker_id)
        if record is not None:
            record.last_heartbeat = self._clock()

    def _remember_told_to_leave(self, worker_id: str, incarnation: str) -> None:
        """Remember that run `incarnation` of `worker_id` was told to leave (the newest
        TOLD_RUNS_KEPT of a name are kept)."""
        told = self._runs_told_to_leave.setdefault(worker_id, [])
        if incarnation not in told:
            told.append(incarnation)
            del told[:-TOLD_RUNS_KEPT]

    def _mark_decommissioning(self, record: WorkerRecord) -> None:
        worker_id = record.info.worker_id
        record.decommissioning = worker_id in self._leaving or (
            record.stopping and record.incarnation in self._runs_told_to_leave.get(worker_id, ()))

    def is_live(self, record: WorkerRecord) -> bool:
        return self._clock() - record.last_heartbeat <= self._timeout

    def expire(self, registering: Collection[str] = ()) -> list[str]:
        """Forget workers whose heartbeats stopped, except those whose registration is still
        being taken in (a worker sends no heartbeat while it waits for that answer); returns
        their ids."""
        gone = [w for w, r in self._workers.items() if not self.is_live(r) and w not in registering]
        for worker_id in gone:
            del self._workers[worker_id]
        return gone

    def decommission(self, worker_ids: Iterable[str]) -> list[str]:
        """The operator's word that these names leave: no new placements on them from now
        on, whichever run registers. Returns the names that were not leaving before."""
        changed = [w for w in dict.fromkeys(worker_ids) if w not in self._leaving]
        self._leaving.update(changed)
        for worker_id in changed:
            record = self._workers.get(worker_id)
            if record is not None:
                self._remember_told_to_leave(worker_id, record.incarnation)
                self._mark_decommissioning(record)
        return changed

    def serve(self, worker_ids: Iterable[str]) -> list[str]:
        """The operator's word that these names are wanted in service again: each leaves
        decommissioning, except a run of it that was told to leave and is stopping (the run
        after it takes blocks). Returns the names that were leaving before."""
        changed = [w for w in dict.fromkeys(worker_ids) if w in self._leaving]
        self._leaving.difference_update(changed)
        for worker_id in changed:
            record = self._workers.get(worker_id)
            if record is not None:
                self._mark_decommissioning(record)
        return changed

    def get(self, worker_id: str) -> WorkerRecord | None:
        return self._workers.get(worker_id)

    def host_of(self, worker_id: str) -> str:
        record = self.get(worker_id)
        return record.info.host if record else ""

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
