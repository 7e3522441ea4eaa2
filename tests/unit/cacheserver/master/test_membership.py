from __future__ import annotations

from strata.cacheserver.master.membership import TOLD_RUNS_KEPT, Membership
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


def placed(members: Membership) -> list[str]:
    return [r.info.worker_id for r in members.placement()]


def scaled_in(clock: Clock) -> Membership:
    """Three workers; the operator scaled in to two: c leaves, its run c1 got its stop
    signal and drains."""
    members = Membership(timeout=5, clock=clock)
    for name in "abc":
        members.register(worker(name), pb.WorkerStats(), incarnation=f"{name}1")
    members.decommission(["c"])
    assert members.heartbeat("c", pb.WorkerStats(), stopping=True)
    assert placed(members) == ["a", "b"]
    return members


def test_a_worker_scaled_back_in_after_its_pod_left_takes_blocks_again() -> None:
    """3 -> 2 -> 3 as the issue saw it: the leaving run is gone, the operator wants c again,
    then c's new run registers."""
    clock = Clock()
    members = scaled_in(clock)
    clock.now += 6
    for name in "ab":
        assert members.heartbeat(name, pb.WorkerStats())
    assert members.expire() == ["c"]
    assert members.serve(["a", "b", "c"]) == ["c"]
    members.register(worker("c"), pb.WorkerStats(), incarnation="c2")
    assert placed(members) == ["a", "b", "c"]
    assert not members.to_proto(members.get("c")).decommissioning  # type: ignore[arg-type]


def test_the_new_run_may_register_before_the_operator_wants_it_back() -> None:
    """The pod came back first (the operator's word to the master failed and is retried):
    no blocks until the operator says so, then at once."""
    clock = Clock()
    members = scaled_in(clock)
    members.register(worker("c"), pb.WorkerStats(), incarnation="c2")
    assert placed(members) == ["a", "b"]
    members.serve(["a", "b", "c"])
    assert placed(members) == ["a", "b", "c"]


def test_a_run_still_draining_takes_no_blocks_after_its_name_is_wanted_back() -> None:
    """Scaled out again while the old pod still drains (a StatefulSet makes the new pod of
    the name once the old one is gone): the draining run stays out, the next run comes in."""
    members = scaled_in(Clock())
    members.serve(["a", "b", "c"])
    assert members.heartbeat("c", pb.WorkerStats(), stopping=True)
    assert placed(members) == ["a", "b"]
    members.register(worker("c"), pb.WorkerStats(), incarnation="c1", stopping=True)  # the master asked it to
    assert placed(members) == ["a", "b"]
    members.register(worker("c"), pb.WorkerStats(), incarnation="c2")
    assert placed(members) == ["a", "b", "c"]
    assert members.heartbeat("c", pb.WorkerStats())
    assert placed(members) == ["a", "b", "c"]


def test_a_run_that_hears_its_stop_signal_after_its_name_is_wanted_back_stays_out() -> None:
    members = Membership(timeout=5, clock=Clock())
    for name in "abc":
        members.register(worker(name), pb.WorkerStats(), incarnation=f"{name}1")
    members.decommission(["c"])
    members.serve(["a", "b", "c"])
    assert placed(members) == ["a", "b", "c"]  # scaled back before its pod was stopped: it stays
    assert members.heartbeat("c", pb.WorkerStats(), stopping=True)  # it was stopped after all
    assert placed(members) == ["a", "b"]


def test_a_restarted_master_hears_it_again_from_the_operator_and_the_stopping_worker() -> None:
    """The master's membership is not journaled: the operator tells it again while pods of
    the scale-in still stop; the draining run registers saying it stops."""
    members = Membership(timeout=5, clock=Clock())
    for name in "ab":
        members.register(worker(name), pb.WorkerStats(), incarnation=f"{name}1")
    members.register(worker("c"), pb.WorkerStats(), incarnation="c1", stopping=True)
    members.decommission(["c"])
    assert placed(members) == ["a", "b"]
    members.serve(["a", "b", "c"])
    assert placed(members) == ["a", "b"]
    members.register(worker("c"), pb.WorkerStats(), incarnation="c2")
    assert placed(members) == ["a", "b", "c"]


def test_telling_the_same_thing_again_changes_nothing() -> None:
    members = scaled_in(Clock())
    assert members.decommission(["c"]) == []
    assert members.serve(["a", "b"]) == []
    assert placed(members) == ["a", "b"]


def test_a_pod_restarting_while_its_name_leaves_costs_the_master_a_bounded_memory() -> None:
    """Each run registered while its name leaves is remembered (a stopping one stays out
    once the name is wanted back), but only the newest few: a pod in a crash loop during a
    long drain would otherwise grow the master's memory by one name per restart."""
    members = scaled_in(Clock())
    for run in range(1000):
        members.register(worker("c"), pb.WorkerStats(), incarnation=f"c-run{run}")
    assert len(members._runs_told_to_leave["c"]) == TOLD_RUNS_KEPT  # the only way to see the bound
    members.serve(["a", "b", "c"])
    assert members.heartbeat("c", pb.WorkerStats(), stopping=True)  # the newest run stops
    assert placed(members) == ["a", "b"]
    members.register(worker("c"), pb.WorkerStats(), incarnation="c-next")
    assert placed(members) == ["a", "b", "c"]
