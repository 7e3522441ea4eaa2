"""The master as a worker sees it (MasterLink over the shared master client): the worker's
internal token is accepted, errors name what was asked, a late master is Unreachable (as a
refused call is), and a failed withdrawal is only logged."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

from strata.cacheserver.worker import masterlink
from strata.cacheserver.worker.masterlink import MasterLink
from strata.cacheserver.worker.settings import MasterLinkSettings
from strata.contract.errors import AlreadyExists, NotFound, Unreachable
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc

from .conftest import BLOCK, CREDENTIALS, Cluster


@pytest.fixture
async def link(cluster: Cluster) -> AsyncIterator[MasterLink]:
    link = MasterLink(cluster.address, CREDENTIALS.internal, worker_id="w1", block_size=BLOCK)
    yield link
    await link.close()


async def test_a_write_is_prepared_and_committed_with_the_workers_credential(cluster: Cluster,
                                                                           link: MasterLink) -> None:
    await cluster.mount()
    assert [m.path for m in (await link.mount_table()).mounts] == ["/m"]
    write_id = await link.prepare_write("/m/new", overwrite=False)
    info = await link.commit_file("/m/new", 5, "v1", persisted=False, ufs_version="", write_id=write_id)
    assert (info.path, info.length, info.block_size) == ("/m/new", 5, BLOCK)
    assert (await link.file_status("/m/new")).version == "v1"
    assert (await link.locate("/m/new")).file.version == "v1"
    with pytest.raises(AlreadyExists, match="/m/new already exists"):
        await link.prepare_write("/m/new", overwrite=False)
    with pytest.raises(NotFound):
        await link.file_status("/m/missing")


async def test_an_absent_master_is_unreachable_naming_what_was_asked(cluster: Cluster,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    # A write's calls wait `master_wait` for a master coming back; 0.5 s here, not 15.
    link = MasterLink(cluster.address, CREDENTIALS.internal, worker_id="w1", block_size=BLOCK,
                      settings=MasterLinkSettings(master_wait=0.5))
    await cluster.master.server.stop(0)
    try:
        await _absent_master_calls(link, caplog)
    finally:
        await link.close()


async def _absent_master_calls(link: MasterLink, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(Unreachable, match="^status of /m/a from the master: "):
        await link.file_status("/m/a")
    with pytest.raises(Unreachable, match="^locating the blocks of /m/a: "):
        await link.locate("/m/a")
    with pytest.raises(Unreachable, match="^committing /m/a on the master: "):
        await link.commit_file("/m/a", 1, "v", persisted=False, ufs_version="", write_id="w")
    with pytest.raises(Unreachable):
        await link.list_workers()
    with caplog.at_level(logging.WARNING):
        await link.abort_write("/m/a", "v", "w")  # best effort: logged, not raised
    assert "could not withdraw the failed write of /m/a" in caplog.text


class SilentMaster(pb_grpc.MasterServicer):  # type: ignore[misc]
    """A master that takes the call and never answers (a stopped process)."""

    async def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.FileInfo:  # noqa: N802
        await asyncio.sleep(30)
        return pb.FileInfo()


async def test_a_master_that_does_not_answer_a_status_in_time_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(masterlink, "FILE_STATUS_TIMEOUT", 0.2)
    server = grpc.aio.server()
    pb_grpc.add_MasterServicer_to_server(SilentMaster(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    link = MasterLink(f"127.0.0.1:{port}", "t", worker_id="w1", block_size=BLOCK)
    try:
        # Unreachable, as a refused call: the worker then takes a read-only file's status from its store.
        with pytest.raises(Unreachable, match="^status of /m/a from the master: timed out"):
            await link.file_status("/m/a")
    finally:
        await link.close()
        await server.stop(None)
