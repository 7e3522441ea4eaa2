"""Block lists travel in messages under the servers' receive limits; a taken port is named."""

from __future__ import annotations

import socket

import grpc
import pytest

from strata.cacheserver import rpcutil
from strata.cacheserver.errors import FailedPrecondition
from strata.cacheserver.proto import strata_pb2 as pb


def test_block_lists_are_split_into_bounded_batches() -> None:
    refs = [pb.BlockRef(mount_id=1, path=f"/datasets/x/part-{i:06d}.parquet", version="e" * 32, index=i,
                        block_size=16 << 20, file_length=1 << 30, in_store=True, length=16 << 20) for i in range(100_000)]
    batches, rest = [], refs
    while rest:
        batch, rest = rpcutil.split_batch(rest)
        assert batch
        batches.append(batch)
    assert [r for b in batches for r in b] == refs
    assert len(batches) > 1
    for batch in batches:
        size = pb.RegisterWorkerRequest(blocks=batch).ByteSize()
        assert size <= rpcutil.BLOCK_LIST_BATCH_BYTES + 1024
        assert size < rpcutil.MASTER_MAX_RECEIVE_BYTES
    assert rpcutil.split_batch([]) == ([], [])


async def test_a_grpc_server_on_a_taken_port_is_refused_by_name() -> None:
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        server = grpc.aio.server()
        with pytest.raises(FailedPrecondition, match=rf"^worker: port {port} is already in use \(gRPC on 127\.0\.0\.1\); .* --port$"):
            rpcutil.add_port(server, "worker", "127.0.0.1", port)
        await server.stop(0)


def test_other_listen_failures_name_the_address_and_the_flag() -> None:
    error = rpcutil.listen_error("master", "HTTP", "203.0.113.7", 19999, "--http-port",
                                 OSError(99, "Cannot assign requested address"))
    assert str(error) == ("master: cannot listen on 203.0.113.7:19999 for HTTP: Cannot assign requested address; "
                          "check --http-port and --bind")
