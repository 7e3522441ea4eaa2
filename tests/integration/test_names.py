"""Names and paths over the namespace's limits (MAX_NAME_BYTES a name, MAX_PATH_BYTES a
path) on a real master and worker: the client refuses them before sending, the servers on
receipt, each with InvalidArgument naming the limit, and both go on serving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from strata.contract import rpc
from strata.contract.constants import MAX_NAME_BYTES, MAX_PATH_BYTES
from strata.contract.errors import InvalidArgument
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc
from strata.cacheserver.common.blockwire import write_chunk

from .conftest import TOKEN, Cluster, allow

pytestmark = pytest.mark.timeout(300)

LONG_NAME = "/src/" + "n" * 1000                   # one name of 1000 bytes, in a path that fits
LONG_PATH = "/src/" + "/".join(["d" * 200] * 330)  # 64 KiB of names each allowed


@pytest.fixture
def cluster(start_cluster: Any, tmp_path: Path) -> Cluster:
    source = tmp_path / "source"
    source.mkdir()
    (source / "kept.txt").write_bytes(b"still served")
    cluster: Cluster = start_cluster(workers=1, **allow(source))
    cluster.fs().client.mount("/src", f"file://{source}")
    return cluster


def _grpc_error(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as failed:
        call()
    return failed.value


def test_the_client_refuses_over_long_names_and_paths_before_sending(cluster: Cluster) -> None:
    fs = cluster.fs()
    for path, limit in ((LONG_NAME, f"at most {MAX_NAME_BYTES} bytes"), (LONG_PATH, f"at most {MAX_PATH_BYTES} bytes")):
        with pytest.raises(InvalidArgument, match=limit):
            fs.info(path)
        with pytest.raises(InvalidArgument, match=limit):
            fs.pipe_file(path, b"x")
        with pytest.raises(InvalidArgument, match=limit):
            fs.mv("/src/kept.txt", path)
    # A name of exactly the limit is a name like any other.
    fs.pipe_file("/src/" + "e" * MAX_NAME_BYTES, b"fits")
    assert fs.cat_file("/src/" + "e" * MAX_NAME_BYTES) == b"fits"
    assert fs.cat_file("/src/kept.txt") == b"still served"


def test_the_servers_refuse_them_on_receipt_naming_the_limit(cluster: Cluster) -> None:
    """What a client that skips the check sends: the master and the worker answer
    InvalidArgument with a short message (not an error from the store, nor one too long for
    gRPC's metadata limit), and keep serving."""
    master = pb_grpc.MasterStub(rpc.sync_channel(cluster.master_address, TOKEN))
    worker = pb_grpc.WorkerStub(rpc.sync_channel(f"127.0.0.1:{cluster.workers[0].port}", TOKEN))
    for path, limit in ((LONG_NAME, f"at most {MAX_NAME_BYTES} bytes"), (LONG_PATH, f"at most {MAX_PATH_BYTES} bytes")):
        calls = [
            lambda: master.GetStatus(pb.GetStatusRequest(path=path), timeout=30),
            lambda: master.ListStatus(pb.ListStatusRequest(path=path), timeout=30),
            lambda: master.Rename(pb.RenameRequest(src="/src/kept.txt", dst=path), timeout=30),
            lambda: worker.WriteFile(iter([write_chunk(b"x", path=path)]), timeout=30),
            lambda: worker.ReadBlock(pb.ReadBlockRequest(block=pb.BlockRef(path=path, block_size=1 << 20)),
                                     timeout=30).next(),
        ]
        for call in calls:
            error = _grpc_error(call)
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details()[:300])
            assert limit in error.details() and len(error.details()) < 1024, error.details()[:300]
    assert master.GetStatus(pb.GetStatusRequest(path="/src/kept.txt"), timeout=30).length == len(b"still served")
    assert cluster.fs().cat_file("/src/kept.txt") == b"still served"
