"""The client through a master outage, against the real master service (in this process, on
its own event loop thread, 127.0.0.1) stopped for real: files already looked at stay
openable for `master_outage_grace` seconds; nothing else is made up."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from strata.cacheserver.auth import Credentials
from strata.cacheserver.client.core import StrataClient
from strata.cacheserver.client.settings import ClientSettings
from strata.cacheserver.master.server import MasterHandle, start_master
from strata.contract.config import ServerConfig
from strata.contract.errors import NotFound, Unavailable

TOKEN = "client-test-token"
T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]


@pytest.fixture
def master(tmp_path: Path) -> Iterator[tuple[MasterHandle, Run[Any]]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="master-loop", daemon=True)
    thread.start()

    def run(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=30)

    config = ServerConfig.model_validate({"blockSize": "1Mi", "localSources": {"allowedRoots": [str(tmp_path)]}})
    handle = run(start_master(config, journal_dir=tmp_path / "journal", credentials=Credentials.from_admin(TOKEN),
                              bind="127.0.0.1", port=0, http_port=0))
    try:
        yield handle, run
    finally:
        run(handle.stop(grace=0))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def client_of(handle: MasterHandle, tmp_path: Path, **settings: float) -> StrataClient:
    (tmp_path / "store").mkdir(exist_ok=True)
    (tmp_path / "store" / "seen").write_bytes(b"seen")
    (tmp_path / "store" / "unseen").write_bytes(b"unseen")
    client = StrataClient(master=f"127.0.0.1:{handle.port}", token=TOKEN, host="h",
                          settings=ClientSettings(**settings))
    if not client.mounts():
        client.mount("/m", f"file://{tmp_path / 'store'}")
    return client


def test_a_file_looked_at_opens_again_while_the_master_is_down(master: tuple[MasterHandle, Run[Any]], tmp_path: Path) -> None:
    handle, run = master
    client = client_of(handle, tmp_path)
    try:
        seen = client.stat("/m/seen")
        assert client.workers() == []
        run(handle.stop(grace=0))
        started = time.monotonic()
        assert client.stat("/m/seen") == seen
        assert time.monotonic() - started < 2.5  # a refused master is told at once
        assert client.workers(refresh=True) == []  # the last list
        with pytest.raises(Unavailable):
            client.stat("/m/unseen")  # never looked at: nothing to go on with
    finally:
        client.close()


def test_without_a_grace_or_after_it_the_outage_is_an_error(master: tuple[MasterHandle, Run[Any]], tmp_path: Path) -> None:
    handle, run = master
    off = client_of(handle, tmp_path, master_outage_grace=0)
    short = client_of(handle, tmp_path, master_outage_grace=0.5)
    try:
        off.stat("/m/seen")
        short.stat("/m/seen")
        with pytest.raises(NotFound):
            short.stat("/m/missing")  # an answer of the master is never replaced
        run(handle.stop(grace=0))
        with pytest.raises(Unavailable):
            off.stat("/m/seen")
        short.stat("/m/seen")
        time.sleep(0.6)  # past the grace
        with pytest.raises(Unavailable):
            short.stat("/m/seen")
    finally:
        off.close()
        short.close()
