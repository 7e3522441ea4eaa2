"""The warm-up gate's handlers: an index of the pods that carry the gate `strata.dev/warm`
(kopf keeps it from its watch of pods; a pod leaves it when its gate is taken off or it is
deleted, so a pod deleted while gated is simply forgotten), and one task that checks them
every `warm_check_interval` seconds (strata.operator.reconcile.warmup), which posts an Event
on each pod it releases (kopf.event posts only from kopf's own per-object tasks). Indexing
adds no finalizer and writes nothing to the pods.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import kopf

from strata.operator.handlers.common import deps_of
from strata.operator.reconcile.warmup import WarmState, check_gated_pods
from strata.operator.settings import OperatorSettings
from strata.operator.warmup import GatedPod, is_gated

log = logging.getLogger(__name__)

# The index's id: kopf passes each index to handlers as a keyword argument named by it.
INDEX = "warm_gated_pods"


def gated_pods(index: Iterable[Iterable[GatedPod]]) -> list[GatedPod]:
    """The pods the index holds now (a copy: kopf changes the index while a round runs)."""
    return [pod for store in list(index) for pod in list(store)]


async def keep_checking(memo: kopf.Memo, index: kopf.Index[str, GatedPod], interval: float) -> None:
    state = WarmState()
    while True:
        await asyncio.sleep(interval)
        try:
            released = await check_gated_pods(deps_of(memo), gated_pods(index.values()), state)
        except Exception as exc:  # noqa: BLE001 - the loop must outlive one failed round
            log.warning("checking the pods held by the warm-up gate failed, retrying: %s", exc)
            continue
        for pod, note in released:
            log.info("pod %s/%s released: %s %s", pod.namespace, pod.name, note.reason, note.message)


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    interval = settings.warm_check_interval

    def carries_gate(body: kopf.Body, **_: Any) -> bool:
        return is_gated(body)

    @kopf.index("", "v1", "pods", id=INDEX, when=carries_gate, registry=registry)
    def warm_gated_pods(body: kopf.Body, **_: Any) -> dict[str, GatedPod]:
        pod = GatedPod.of(body)
        return {pod.uid: pod}

    @kopf.on.startup(id="warm-gate", registry=registry)
    async def start_checking(memo: kopf.Memo, **kwargs: Any) -> None:
        index = kwargs[INDEX]
        memo["warm_gate"] = asyncio.create_task(keep_checking(memo, index, interval), name="warm-gate")

    @kopf.on.cleanup(id="warm-gate", registry=registry)
    async def stop_checking(memo: kopf.Memo, **_: Any) -> None:
        task = memo.get("warm_gate")
        if isinstance(task, asyncio.Task):
            task.cancel()
