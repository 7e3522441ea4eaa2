"""Listings in pages while the store's walk keeps the first page back: the master says it is
still at it, and a client waiting a bounded time for each page gets the whole listing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from threadmaster import MASTER_TOKEN, threaded_master

from strata.cacheserver.client.core import StrataClient
from strata.cacheserver.master import files
from strata.cacheserver.namespace.tree import Namespace
from strata.contract.proto import strata_pb2 as pb


async def slow_pages(delay: float) -> AsyncIterator[str]:
    await asyncio.sleep(delay)
    yield "first"
    yield "second"


async def test_keepalives_come_while_an_item_is_awaited_and_only_then() -> None:
    got = [item async for item in files.with_keepalives(slow_pages(0.5), 0.1)]
    assert got[-2:] == ["first", "second"]
    assert set(got[:-2]) == {None} and 2 <= len(got) - 2 <= 6


async def test_a_reader_that_stops_early_leaves_nothing_running() -> None:
    pages = files.with_keepalives(slow_pages(30), 0.05)
    assert await pages.__anext__() is None
    await pages.aclose()  # the page awaited is cancelled, not left pending
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]


def test_a_listing_whose_walk_outlasts_the_clients_wait_for_a_page_lists_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's walk of millions of files takes longer than a client waits for a page
    (master_timeout): before, `find` failed with "no page of the listing within 30s"."""
    store = tmp_path / "store"
    store.mkdir()
    for i in range(3):
        (store / f"f{i}").write_bytes(b"x")
    listing = Namespace.list_pages

    def walking_slowly(self: Namespace, *args: Any, **kwargs: Any) -> AsyncIterator[list[Any]]:
        async def pages() -> AsyncIterator[list[Any]]:
            await asyncio.sleep(2.0)  # a walk of a big store
            async for page in listing(self, *args, **kwargs):
                yield page
        return pages()

    monkeypatch.setattr(Namespace, "list_pages", walking_slowly)
    monkeypatch.setattr(files, "LISTING_KEEPALIVE_SECONDS", 0.2)
    monkeypatch.setenv("STRATA_CLIENT_MASTER_TIMEOUT", "1")
    with threaded_master(tmp_path) as (handle, _):
        client = StrataClient(master=f"127.0.0.1:{handle.port}", token=MASTER_TOKEN)
        try:
            client.mount("/m", f"file://{store}", pb.MountOptions(metadata_sync_interval=0))
            assert sorted(i.path for i in client.ls("/m", recursive=True)) == ["/m/f0", "/m/f1", "/m/f2"]
            pages = list(client.ls_pages("/m", recursive=True))
            assert all(pages)  # the empty ones were the master's word that it walks
        finally:
            client.close()
