"""Background tasks of master and worker: kept until done, cancelled and awaited on close."""

from __future__ import annotations

import asyncio

from strata.cacheserver.background import BackgroundTasks


async def test_tasks_are_forgotten_when_done_and_cancelled_on_close() -> None:
    tasks = BackgroundTasks()
    ended: list[str] = []

    async def quick() -> None:
        ended.append("quick")

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("forever cancelled")

    done = tasks.spawn(quick(), "quick")
    running = tasks.spawn(forever(), "forever")
    await done
    await asyncio.sleep(0)  # the done callback runs
    assert len(tasks) == 1 and running.get_name() == "forever"
    await tasks.close()
    assert running.cancelled() and ended == ["quick", "forever cancelled"] and len(tasks) == 0
