from __future__ import annotations

import socket

import grpc
import pytest

from strata.cacheserver import rpcutil
from strata.cacheserver.errors import FailedPrecondition


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
