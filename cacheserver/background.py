"""Tasks a server starts and does not wait for (a readahead, a channel to close, a store to
total): one helper for master and worker, so each such task is named, kept referenced until
it ends (asyncio keeps only a weak reference) and cancelled when the server stops."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class BackgroundTasks:
    """The tasks one part of a server left running."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[object]] = set()

    def spawn(self, coro: Coroutine[Any, Any, object], name: str) -> asyncio.Task[object]:
        """Run `coro` as a task named `name`; it is forgotten once it ends."""
        task: asyncio.Task[object] = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        """Cancel every task still running and wait until each has ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
