"""The worker's parts as the composition root wires them (`build_parts`), against a real
master in this process and a real S3 store (moto), with a block store on a tmp folder."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import s3server
from rangeproxy import RangeProxy

from strata.cacheserver.auth import Credentials
from strata.cacheserver.common.blockwire import write_chunk
from strata.cacheserver.master.server import MasterHandle, start_master
from strata.cacheserver.worker.membership import Endpoints, WorkerIdentity
from strata.cacheserver.worker.server import WorkerParts, build_parts
from strata.contract import rpc
from strata.contract.config import ServerConfig
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc

ADMIN = "worker-parts-admin-token"
CREDENTIALS = Credentials.from_admin(ADMIN)
BLOCK = 4096  # bytes: files of a few blocks stay small


def server_config(master_address: str = "127.0.0.1:1", tmp: Path | None = None) -> ServerConfig:
    tiers = [{"medium": "SSD", "quota": "1Mi", "dirs": [str(tmp / "ssd")]}] if tmp else []
    return ServerConfig.model_validate({"blockSize": BLOCK, "masterAddress": master_address, "tiers": tiers,
                                        "heartbeatInterval": 0.2})


@dataclass
class Cluster:
    """A master, an admin stub to it, a bucket mounted at /m, and a builder of workers."""

    master: MasterHandle
    admin: pb_grpc.MasterStub
    s3: s3server.S3Server
    bucket: str
    tmp: Path
    built: list[WorkerParts]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.master.port}"

    async def mount(self, path: str = "/m", *, endpoint_url: str | None = None, **options: object) -> pb.MountInfo:
        """The bucket's folder named like `path` mounted there (through `endpoint_url`, a
        proxy in front of the store, when given)."""
        store_options = self.s3.storage_options()
        if endpoint_url is not None:
            store_options["endpoint_url"] = endpoint_url
        response = await self.admin.Mount(pb.MountRequest(
            path=path, source=f"s3://{self.bucket}/{path.strip('/')}",
            options=pb.MountOptions(options=store_options, **options),  # type: ignore[arg-type]
        ), timeout=30)
        info: pb.MountInfo = response.mount
        return info

    def put(self, key: str, data: bytes) -> None:
        self.s3.put_object(self.bucket, key, data)

    def get(self, key: str) -> bytes:
        return self.s3.get_object(self.bucket, key)

    async def worker(self, name: str = "w1", *, register: bool = True) -> WorkerParts:
        """A worker's parts on their own folder, registered with the master (advertising
        ports nothing listens on: the parts are called directly)."""
        parts = await build_parts(server_config(self.address, self.tmp / name), data_dir=self.tmp / name,
                                  token=CREDENTIALS.internal,
                                  identity=WorkerIdentity(worker_id=name, host="host-" + name, advertise="127.0.0.1"))
        self.built.append(parts)
        parts.membership.listening(Endpoints(port=1, http_port=1, data_port=1))
        if register:
            await parts.membership.register()
        return parts

    async def status(self, path: str) -> pb.FileInfo:
        info: pb.FileInfo = await self.admin.GetStatus(pb.GetStatusRequest(path=path), timeout=30)
        return info


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Store calls of workers built from here on retry without waiting long."""
    monkeypatch.setenv("STRATA_RETRY_BASE_DELAY", "0.001")
    monkeypatch.setenv("STRATA_RETRY_MAX_DELAY", "0.01")


@pytest.fixture
def short_store(s3_server: s3server.S3Server) -> Iterator[RangeProxy]:
    """A proxy in front of the S3 server whose ranged answers can be cut short (`cut`)."""
    proxy = RangeProxy(target_port=int(s3_server.endpoint_url.rsplit(":", 1)[1]))
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
async def cluster(tmp_path: Path, s3_server: s3server.S3Server, bucket: str) -> AsyncIterator[Cluster]:
    master = await start_master(server_config(), journal_dir=tmp_path / "journal", credentials=CREDENTIALS,
                                bind="127.0.0.1", port=0, http_port=0)
    channel = rpc.aio_channel(f"127.0.0.1:{master.port}", ADMIN)
    c = Cluster(master, pb_grpc.MasterStub(channel), s3_server, bucket, tmp_path, [])
    try:
        yield c
    finally:
        for parts in c.built:
            await parts.close()
            await parts.close_channels()
        await channel.close()
        await master.stop(grace=0)


async def eventually(check: Callable[[], Awaitable[bool]], what: str, deadline: float = 20.0) -> None:
    """Wait until `check()` holds, at most `deadline` seconds (a correctness wait, not a
    speed assertion: the deadline is far above what the work needs)."""
    end = time.monotonic() + deadline
    while not await check():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {deadline:g}s")
        await asyncio.sleep(0.02)


def ref_for(info: pb.FileInfo, index: int) -> pb.BlockRef:
    return pb.BlockRef(mount_id=info.mount_id, path=info.path, version=info.version, index=index,
                       block_size=info.block_size, file_length=info.length, in_store=info.persisted)


async def chunks(path: str, data: bytes, *, write_type: int = 0, overwrite: bool = False,
                 piece: int = 3000) -> AsyncIterator[pb.WriteFileChunk]:
    """A write's stream as a client sends it: the first message names the file."""
    yield write_chunk(data[:piece], path=path, write_type=write_type, overwrite=overwrite)
    for i in range(piece, len(data), piece):
        yield write_chunk(data[i:i + piece])


def unique(prefix: str = "f") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def rpc_code(exc: BaseException) -> grpc.StatusCode | None:
    return exc.code() if isinstance(exc, grpc.RpcError) else None
