"""A real master in this process, on an event loop of its own in a daemon thread (127.0.0.1,
any free port), for tests that drive it from plain synchronous code (clients, FUSE
operations):

    with threaded_master(tmp_path) as (handle, run):
        client = StrataClient(master=f"127.0.0.1:{handle.port}", token=MASTER_TOKEN)
        ...
        run(handle.stop(grace=0))   # a coroutine run on the master's loop

file:// sources under `tmp_path` may be mounted. Tests import it by name (pytest puts
tests/support on sys.path).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from strata.cacheserver.auth import Credentials
from strata.cacheserver.master.server import MasterHandle, start_master
from strata.contract.config import ServerConfig

# The master's admin token.
MASTER_TOKEN = "client-test-token"
T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]


@contextmanager
def threaded_master(tmp_path: Path) -> Iterator[tuple[MasterHandle, Run[Any]]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="master-loop", daemon=True)
    thread.start()

    def run(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=30)

    config = ServerConfig.model_validate({"blockSize": "1Mi", "localSources": {"allowedRoots": [str(tmp_path)]}})
    handle = run(start_master(config, journal_dir=tmp_path / "journal",
                              credentials=Credentials.from_admin(MASTER_TOKEN), bind="127.0.0.1", port=0, http_port=0))
    try:
        yield handle, run
    finally:
        run(handle.stop(grace=0))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
