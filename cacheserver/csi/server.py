"""`strata csi --endpoint unix:///csi/csi.sock --node-id NODE`: the CSI plugin's gRPC server.

One process serves Identity, Node and Controller on one Unix socket (kubelet's registrar and
the external-provisioner both talk to it). At start it serves again the volumes it had
published whose FUSE process is gone, and from then on it starts a successor for any volume
whose FUSE process dies (publisher.py). SIGTERM/SIGINT stop the server; the published volumes
stay mounted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from pathlib import Path

import grpc

from strata.contract.errors import InvalidArgument
from ..fuse.daemon import passthrough_room
from .kube import ApiReader, KubeResolver
from .proto import csi_pb2_grpc as csi_grpc
from .publisher import Publisher
from .service import ControllerService, IdentityService, NodeService
from .volumes import MountResolver

log = logging.getLogger("strata.csi")


def socket_path(endpoint: str) -> Path:
    """The socket file of `unix:///path`, `unix:/path` or a plain absolute path."""
    path = endpoint.removeprefix("unix://") if endpoint.startswith("unix://") else endpoint.removeprefix("unix:")
    if not path.startswith("/"):
        raise InvalidArgument(f"--endpoint {endpoint!r}: give unix:///absolute/path/to/csi.sock")
    return Path(path)


def build_server(sock: Path, node_id: str, publisher: Publisher, resolver: MountResolver) -> grpc.aio.Server:
    """The server with all three services on `sock` (a stale socket file is replaced)."""
    sock.parent.mkdir(parents=True, exist_ok=True)
    sock.unlink(missing_ok=True)
    server = grpc.aio.server()
    csi_grpc.add_IdentityServicer_to_server(IdentityService(), server)
    csi_grpc.add_NodeServicer_to_server(NodeService(node_id, publisher, resolver), server)
    csi_grpc.add_ControllerServicer_to_server(ControllerService(resolver), server)
    server.add_insecure_port(f"unix://{sock}")
    return server


async def serve(sock: Path, node_id: str, publisher: Publisher, resolver: MountResolver,
                stop: asyncio.Event | None = None) -> None:
    """Serve until `stop` is set, or SIGTERM/SIGINT when `stop` is None."""
    server = build_server(sock, node_id, publisher, resolver)
    await server.start()
    os.chmod(sock, 0o660)
    log.info("strata csi: serving %s on %s for node %s (state in %s)", "csi.strata.dev", sock, node_id,
             publisher.state_dir)
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("strata csi: stopping (published volumes stay mounted)")
    await server.stop(grace=5)
    sock.unlink(missing_ok=True)


def run_csi(*, endpoint: str, node_id: str | None, state_dir: Path | None = None, kubeconfig: str | None = None,
            tokens_secret: str = "", passthrough: str = "") -> int:
    if not node_id:
        raise InvalidArgument("--node-id is missing: pass the node's name (or set STRATA_NODE_NAME)")
    sock = socket_path(endpoint)
    if passthrough:
        passthrough_room(passthrough)  # a wrong DIR:SIZE stops the plugin here, not each volume
    publisher = Publisher(state_dir or sock.parent / "volumes", passthrough=passthrough)
    if tokens_secret and tokens_secret.count("/") != 1:
        raise InvalidArgument(f"--tokens-secret {tokens_secret!r}: give NAMESPACE/NAME of the operator's Secret")
    resolver = KubeResolver(ApiReader(kubeconfig), tokens_secret)
    stop = threading.Event()

    def look_after_volumes() -> None:
        publisher.recover()
        publisher.watch(stop)

    threading.Thread(target=look_after_volumes, name="strata-csi-volumes", daemon=True).start()
    try:
        asyncio.run(serve(sock, node_id, publisher, resolver))
    finally:
        stop.set()
    return 0
