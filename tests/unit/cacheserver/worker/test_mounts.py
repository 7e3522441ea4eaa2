from __future__ import annotations

import pytest

from strata.cacheserver.worker.mounts import WorkerMounts
from strata.contract.errors import FailedPrecondition, NotFound
from strata.contract.proto import strata_pb2 as pb

UNUSABLE = "mount /w (from s3://bucket) cannot be used: its sealed credentials cannot be opened"


async def test_a_mount_the_master_cannot_use_gets_no_store_and_is_never_not_found() -> None:
    # NotFound would tell the uploads of its acknowledged writes that their file is gone
    # (they would drop their only copies); a store without its credentials would reach the
    # store as whoever the host is.
    table = pb.GetMountTableResponse(version=3, mounts=[
        pb.MountInfo(path="/w", source="s3://bucket", mount_id=7, unusable=UNUSABLE),
        pb.MountInfo(path="/m", source="memory://m", mount_id=8),
    ])

    async def fetch() -> pb.GetMountTableResponse:
        return table

    mounts = WorkerMounts(fetch)
    await mounts.refresh()
    assert [v.mount_id for v in mounts.views()] == [8]
    with pytest.raises(FailedPrecondition, match="mount /w .*cannot be used"):
        await mounts.get(7)
    with pytest.raises(FailedPrecondition, match="mount /w .*cannot be used"):
        await mounts.resolve("/w/f.bin")
    assert (await mounts.resolve("/m/f")).mount_id == 8
    with pytest.raises(NotFound):
        await mounts.get(9)
    await mounts.close()
