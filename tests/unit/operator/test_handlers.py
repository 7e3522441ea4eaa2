"""The kopf glue: settings, per-object state and locking, outcomes to kopf errors, entry point."""

from __future__ import annotations

import asyncio
import logging

import kopf
import pytest

from strata.operator import main
from strata.operator.handlers import register
from strata.operator.handlers.common import log_outcome, next_delay, run_locked, state_of
from strata.operator.handlers.lifecycle import configure
from strata.operator.reconcile import Outcome
from strata.operator.settings import OperatorSettings

log = logging.getLogger(__name__)


def test_kopf_keeps_its_bookkeeping_out_of_status() -> None:
    settings = kopf.OperatorSettings()
    configure(settings)
    assert settings.persistence.finalizer == "strata.dev/finalizer"
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert settings.persistence.progress_storage.prefix == "strata.dev"
    assert isinstance(settings.persistence.diffbase_storage, kopf.AnnotationsDiffBaseStorage)


def test_every_resource_gets_change_refresh_and_delete_handlers() -> None:
    registry = kopf.OperatorRegistry()
    register(registry, OperatorSettings())
    changing = registry._changing.get_all_handlers()
    spawning = registry._spawning.get_all_handlers()
    for plural in ("cacheclusters", "mounts"):
        mine = [h for h in changing if h.selector and h.selector.any_name == plural]
        kinds = {h.reason.value if h.reason else "resume" for h in mine}
        assert kinds == {"create", "update", "delete", "resume"}
        assert all(":" not in h.id and "<" not in h.id for h in mine)  # ids become annotation keys
        (daemon,) = [h for h in spawning if h.selector and h.selector.any_name == plural]
        assert daemon.id == f"refresh-{plural.removesuffix('s').replace('cachecluster', 'cluster')}"


def test_pacing_and_logging(caplog: pytest.LogCaptureFixture) -> None:
    settings = OperatorSettings(reconcile_interval=30, retry_delay=3)
    assert next_delay(Outcome.ok("fine"), settings) == 30
    assert next_delay(Outcome.waiting("master not ready"), settings) == 3
    assert next_delay(Outcome.stuck("fix the bucket"), settings) == 30  # maybe fixed elsewhere
    with caplog.at_level(logging.INFO):
        log_outcome(Outcome.waiting("master not ready"), log)
        log_outcome(Outcome.stuck("fix the bucket"), log)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "not ready yet: master not ready"), ("WARNING", "stalled: fix the bucket")]


async def test_one_reconcile_of_an_object_at_a_time() -> None:
    memo = kopf.Memo()
    running, most = 0, 0

    async def step() -> Outcome:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0)
        running -= 1
        return Outcome.ok()

    await asyncio.gather(*(run_locked(memo, step) for _ in range(5)))
    assert most == 1
    assert state_of(memo) is state_of(memo)


def test_run_refuses_unclear_arguments() -> None:
    with pytest.raises(ValueError, match="either some namespaces or all"):
        main.run(namespaces=["a"], all_namespaces=True, liveness_endpoint=None, peering=None, standalone=True)
    with pytest.raises(ValueError, match="peering object"):
        main.run(namespaces=["a"], all_namespaces=False, liveness_endpoint=None, peering=None, standalone=False)


def test_replicas_draw_distinct_priorities() -> None:
    assert len({main.peering_priority() for _ in range(50)}) > 45
