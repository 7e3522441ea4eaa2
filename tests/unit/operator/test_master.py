"""The master client over real gRPC: token, deadlines, status codes to errors, Report cache."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from strata.contract.errors import NotFound, PermissionDenied, Unauthenticated, Unavailable
from strata.contract.proto import strata_pb2 as pb
from strata.contract.master import MasterClient
from strata.operator.master import Masters
from tests.unit.operator.conftest import TOKEN, RunningMaster


async def test_calls_carry_the_token(master: RunningMaster) -> None:
    async with MasterClient(master.address, TOKEN, timeout=2) as client:
        answer = await client.mount(pb.MountRequest(path="/a", source="memory://a"))
        assert answer.mount.mount_id == 1 and answer.changed
        assert not (await client.mount(pb.MountRequest(path="/a", source="memory://a"))).changed
        report = await client.report()
        assert [m.mount.path for m in report.mounts] == ["/a"]
    async with MasterClient(master.address, "wrong", timeout=2) as client:
        with pytest.raises(Unauthenticated, match="cluster token"):
            await client.report()


@pytest.mark.parametrize(
    ("code", "error"),
    [(grpc.StatusCode.NOT_FOUND, NotFound), (grpc.StatusCode.PERMISSION_DENIED, PermissionDenied),
     (grpc.StatusCode.UNAVAILABLE, Unavailable)],
)
async def test_status_codes_become_errors(master: RunningMaster, code: grpc.StatusCode, error: type) -> None:
    master.state.mount_error = (code, "NoSuchBucket: bucket")
    async with MasterClient(master.address, TOKEN, timeout=2) as client:
        with pytest.raises(error, match="NoSuchBucket"):
            await client.mount(pb.MountRequest(path="/a", source="s3://bucket"))


async def test_unreachable_master_fails_within_the_deadline(master: RunningMaster) -> None:
    address = master.address
    await master.stop()
    start = time.monotonic()
    async with MasterClient(address, TOKEN, timeout=1) as client:
        with pytest.raises(Unavailable, match="Connection refused|failed to connect"):
            await client.report()
    assert time.monotonic() - start < 5


async def test_start_load_returns_the_first_progress(master: RunningMaster) -> None:
    async with MasterClient(master.address, TOKEN, timeout=2) as client:
        progress = await client.start_load("/a/train")
    assert progress is not None and progress.bytes_total == 100


async def test_reports_are_shared_for_their_ttl(master: RunningMaster) -> None:
    masters = Masters(timeout=2, report_ttl=60)
    try:
        await masters.report(master.address, TOKEN)
        await masters.report(master.address, TOKEN)
        assert master.state.count("Report") == 1
        await masters.report(master.address, TOKEN, fresh=True)
        masters.invalidate(master.address)
        await masters.report(master.address, TOKEN)
        assert master.state.count("Report") == 3
        await masters.forget(master.address)
        await masters.report(master.address, TOKEN)  # a new channel after forget
        assert master.state.count("Report") == 4
    finally:
        await masters.close()


async def test_a_call_on_a_channel_closed_under_it_is_unavailable_not_cancelled(master: RunningMaster) -> None:
    """Deleting a cluster forgets its master (closing the channel) while a Mount's deletion
    may be unmounting on it: that step must fail like any unreachable master and be retried."""
    master.state.unmount_delay = 5.0
    masters = Masters(timeout=10, report_ttl=0)
    call = asyncio.create_task(masters.client(master.address, TOKEN).unmount("/a"))
    deadline = time.monotonic() + 5
    while master.state.count("Unmount") == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await masters.forget(master.address)
    with pytest.raises(Unavailable, match="closed during the call"):
        await call
    # A task that is itself cancelled still ends cancelled.
    call = asyncio.create_task(masters.client(master.address, TOKEN).unmount("/a"))
    await asyncio.sleep(0.2)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await masters.close()
