"""The operator's /metrics: each Mount's phase as its reconciles leave it, and an exposition
`promtool check metrics` finds clean."""

from __future__ import annotations

from prometheus_client import generate_latest

from strata.operator.handlers import metrics
from strata.operator.handlers.admission import AdmissionMetrics
from strata.operator.handlers.mount import phase_of
from strata.operator.reconcile import Outcome
from promtool import metrics_problems


def phases_shown(collector: metrics.MountPhases) -> dict[tuple[str, str], str]:
    (family,) = collector.collect()
    return {(s.labels["mount_namespace"], s.labels["mount"]): s.labels["phase"] for s in family.samples if s.value == 1}


def test_a_mount_s_phase_follows_its_reconciles_and_ends_with_it() -> None:
    now = [0.0]
    phases = metrics.MountPhases(expiry=100, clock=lambda: now[0])
    phases.record("ns", "data", phase_of(Outcome.waiting("master not ready")))
    phases.record("ns", "logs", phase_of(Outcome.stuck("bucket missing")))
    assert phases_shown(phases) == {("ns", "data"): "Pending", ("ns", "logs"): "Failed"}
    phases.record("ns", "data", phase_of(Outcome.ok()))
    phases.forget("ns", "logs")
    assert phases_shown(phases) == {("ns", "data"): "Mounted"}
    (family,) = phases.collect()
    assert {s.labels["phase"]: s.value for s in family.samples} == {
        "Pending": 0, "Mounted": 1, "Failed": 0, "Unmounting": 0}


def test_a_replica_that_stopped_reconciling_stops_reporting() -> None:
    now = [0.0]
    phases = metrics.MountPhases(expiry=100, clock=lambda: now[0])
    phases.record("ns", "logs", "Failed")
    now[0] = 101.0
    assert phases_shown(phases) == {}


def test_the_operator_exposition_is_clean() -> None:
    registry = metrics.metrics_registry()
    phases = metrics.MountPhases(expiry=100)
    registry.register(phases)
    AdmissionMetrics(registry)
    phases.record("ns", "data", "Mounted")
    text = generate_latest(registry).decode()
    assert 'strata_operator_mount_phase{mount="data",mount_namespace="ns",phase="Mounted"} 1.0' in text
    assert metrics_problems(text) == ""

