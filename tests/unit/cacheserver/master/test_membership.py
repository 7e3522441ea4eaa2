from __future__ import annotations

from strata.cacheserver.master.membership import Membership
from strata.contract.proto import strata_pb2 as pb


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def worker(name: str) -> pb.WorkerInfo:
    return pb.WorkerInfo(worker_id=name, host=f"host-{name}", address=f"127.0.0.1:{len(name)}")


def test_a_worker_that_stops_heartbeating_leaves_placement() -> None:
    clock = Clock()
    members = Membership(timeout=5, clock=clock)
    members.register(worker("a"), pb.WorkerStats())
    members.register(worker("b"), pb.WorkerStats())
    clock.now += 4
    assert members.heartbeat("a", pb.WorkerStats(hits=3))
    clock.now += 2
    assert [r.info.worker_id for r in members.placement()] == ["a"]
    assert members.expire() == ["b"]
    assert not members.heartbeat("b", pb.WorkerStats())  # unknown now: must register again
    assert members.get("a") is not None and members.get("a").stats.hits == 3  # type: ignore[union-attr]


def test_decommissioned_workers_stay_readable_but_take_no_placements() -> None:
    members = Membership(timeout=5, clock=Clock())
    members.register(worker("a"), pb.WorkerStats())
    members.register(worker("b"), pb.WorkerStats())
    members.decommission(["b", "c"])
    assert [r.info.worker_id for r in members.live()] == ["a", "b"]
    assert [r.info.worker_id for r in members.placement()] == ["a"]
    members.register(worker("c"), pb.WorkerStats())  # registering later keeps the decision
    assert [r.info.worker_id for r in members.placement()] == ["a"]
    assert members.to_proto(members.get("b")).decommissioning  # type: ignore[arg-type]
