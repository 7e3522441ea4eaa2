"""The block sockets (data port, short-circuit) as thin adapters over BlockReads: real
sockets in this process, the real reads behind them, the wire of `blockwire`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from rangeproxy import RangeProxy

from strata.cacheserver.common.blockwire import request_line
from strata.cacheserver.client.transfer import DataReader, Patience
from strata.cacheserver.common.checksums import CHUNK_SIZE, compute_checksums
from strata.cacheserver.worker.reads import BlockReads, BlockSource
from strata.cacheserver.worker.transfer import DataServer, ShortCircuitServer
from strata.contract.config import DataPortSettings
from strata.contract.errors import DataLoss
from strata.contract.proto import strata_pb2 as pb

from .conftest import BLOCK, CREDENTIALS, Cluster, ref_for

DATA = bytes(range(256)) * 24  # 6144 bytes: a block and a half


def _exchange(family: int, address: Any, line: bytes) -> tuple[dict[str, Any], bytes, list[int]]:
    """One request on a new connection: the reply, the bytes after it, descriptors passed."""
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(address)
        sock.sendall(line)
        received, fds = b"", []
        while b"\n" not in received:
            data, new_fds, _, _ = socket.recv_fds(sock, 65536, 4)
            if not data:
                break
            received += data
            fds += new_fds
        head, _, rest = received.partition(b"\n")
        reply = json.loads(head)
        while reply.get("ok") and family != socket.AF_UNIX and len(rest) < reply["length"]:
            more = sock.recv(65536)
            if not more:
                break
            rest += more
    return reply, rest, fds


async def exchange(family: int, address: Any, line: bytes) -> tuple[dict[str, Any], bytes, list[int]]:
    # The servers answer from their own threads but wait on this loop for the block.
    return await asyncio.to_thread(_exchange, family, address, line)


@pytest.fixture
async def reads(cluster: Cluster) -> AsyncIterator[tuple[BlockReads, pb.FileInfo]]:
    await cluster.mount()
    cluster.put("m/t.bin", DATA)
    parts = await cluster.worker()
    yield parts.reads, await cluster.status("/m/t.bin")


async def test_the_data_port_sends_the_asked_range_and_counts_it(reads: tuple[BlockReads, pb.FileInfo]) -> None:
    block_reads, info = reads
    server = DataServer(block_reads, CREDENTIALS, asyncio.get_running_loop(), DataPortSettings())
    port = server.start("127.0.0.1", 0)
    try:
        address = ("127.0.0.1", port)
        reply, body, _ = await exchange(socket.AF_INET, address, request_line(
            CREDENTIALS.data, ref_for(info, 1), 0, offset=100, length=500))
        assert (reply["ok"], reply["length"], reply["hit"], body) == (True, 500, False, DATA[BLOCK + 100:BLOCK + 600])
        assert (reply["checksums"], reply["chunk_size"]) == (list(compute_checksums(body)), CHUNK_SIZE)
        reply, body, _ = await exchange(socket.AF_INET, address, request_line(CREDENTIALS.data, ref_for(info, 0), 0))
        assert reply["hit"] is False and body == DATA[:BLOCK]
        assert reply["checksums"] == list(compute_checksums(body))
        assert block_reads.counters.data_port_reads == 2
        # Bytes are counted by path and by the kind of reader that asked; a kind the worker
        # does not know (or none) is counted as "other".
        for client in ("fuse", "fuse", "made-up"):
            reply, body, _ = await exchange(socket.AF_INET, address, request_line(
                CREDENTIALS.data, ref_for(info, 0), 0, client=client, length=1000))
            assert body == DATA[:1000]
        await asyncio.sleep(0)  # the count lands on the loop
        assert dict(block_reads.counters.served_bytes) == {
            ("data_port", "other"): 500 + BLOCK + 1000, ("data_port", "fuse"): 2000}
        # Errors travel as their gRPC status names, the token is checked first.
        reply, _, _ = await exchange(socket.AF_INET, address, request_line("wrong", ref_for(info, 0), 0))
        assert reply["code"] == "UNAUTHENTICATED"
        reply, _, _ = await exchange(socket.AF_INET, address, request_line(
            CREDENTIALS.data, ref_for(info, 0), 0, offset=BLOCK + 1))
        assert reply["code"] == "INVALID_ARGUMENT" and "past the end" in reply["message"]
    finally:
        server.stop()


async def test_the_short_circuit_socket_hands_out_the_block_file_with_its_checksums(
        reads: tuple[BlockReads, pb.FileInfo], tmp_path: Path) -> None:
    block_reads, info = reads
    server = ShortCircuitServer(block_reads, tmp_path / "sc" / "w1.sock", CREDENTIALS, asyncio.get_running_loop(),
                                DataPortSettings())
    server.start()
    try:
        reply, _, fds = await exchange(socket.AF_UNIX, str(server.socket_path),
                                       request_line(CREDENTIALS.data, ref_for(info, 0), 0, client="fuse", verify=1))
        [fd] = fds
        try:
            assert reply["length"] == BLOCK and os.pread(fd, BLOCK + 1, 0) == DATA[:BLOCK]
            assert len(reply["checksums"]) * reply["chunk_size"] >= BLOCK
        finally:
            os.close(fd)
        c = block_reads.counters
        assert (c.short_circuit_reads, c.short_circuit_rechecks) == (1, 1)
        assert dict(c.served_bytes) == {("short_circuit", "fuse"): BLOCK}
    finally:
        server.stop()
    assert not server.socket_path.exists()


async def test_a_range_off_the_chunks_goes_out_as_the_bytes_the_worker_checked(
        reads: tuple[BlockReads, pb.FileInfo]) -> None:
    # The worker checks such a range against the block's checksums and sends checksums of
    # its own for it: they must be made from the bytes it checked. A block file damaged
    # after the check (here: between finding the block and sending it) must not go out
    # with checksums that vouch for the damage.
    block_reads, info = reads
    await block_reads.cache_blocks([ref_for(info, 0)])

    class DamagedBeforeSending(DataServer):
        async def _open(self, ref: pb.BlockRef, request: dict[str, Any]) -> BlockSource:
            source = await super()._open(ref, request)
            [block] = block_reads.store.blocks()
            with open(block.path, "r+b") as f:
                f.seek(300)
                byte = f.read(1)
                f.seek(300)
                f.write(bytes([byte[0] ^ 0xFF]))
            return source

    server = DamagedBeforeSending(block_reads, CREDENTIALS, asyncio.get_running_loop(), DataPortSettings())
    port = server.start("127.0.0.1", 0)
    try:
        reply, body, _ = await exchange(socket.AF_INET, ("127.0.0.1", port), request_line(
            CREDENTIALS.data, ref_for(info, 0), 0, offset=100, length=500))
    finally:
        server.stop()
    assert reply["ok"] and reply["checksums"] == list(compute_checksums(body))
    assert body == DATA[100:600], "bytes damaged after the worker's check went out as checked"


@pytest.mark.usefixtures("quick_retries")
async def test_a_store_answer_short_of_the_bytes_asked_is_an_error_on_the_data_port(
        cluster: Cluster, short_store: RangeProxy) -> None:
    # The store answers with fewer bytes than asked (a well-formed answer, of the version
    # asked for); a read that caches nothing (NO_CACHE) promised the reader the bytes asked
    # for and sent the fewer: the reader waited for the rest until its block deadline, and
    # took the worker for stalled.
    await cluster.mount(endpoint_url=short_store.endpoint_url)
    cluster.put("m/t.bin", DATA)
    block_reads = (await cluster.worker()).reads
    info = await cluster.status("/m/t.bin")
    short_store.cut = 100
    server = DataServer(block_reads, CREDENTIALS, asyncio.get_running_loop(), DataPortSettings())
    port = server.start("127.0.0.1", 0)
    reader = DataReader("127.0.0.1", port, CREDENTIALS.data,
                        Patience(connect_timeout=5, check_after=1, block_timeout=10, alive=lambda: True))
    try:
        with pytest.raises(DataLoss, match=rf"with {BLOCK - 100} bytes, not {BLOCK}"):
            await asyncio.to_thread(reader.read, ref_for(info, 0), 0, BLOCK, pb.NO_CACHE)
    finally:
        reader.close()
        server.stop()


def test_a_range_on_the_block_files_chunks_carries_the_files_own_checksums(tmp_path: Path) -> None:
    # Those were made when the block was cached: bytes that changed on disk since fail at the
    # reader. Another range of a file has none to send: it is served from memory.
    written = os.urandom(3 * CHUNK_SIZE + 100)
    on_disk = bytearray(written)
    on_disk[CHUNK_SIZE + 1] ^= 1
    path = tmp_path / "block"
    path.write_bytes(on_disk)
    fd = os.open(path, os.O_RDONLY)
    try:
        def sent(offset: int, length: int) -> tuple[int, ...]:
            return BlockSource(hit=True, length=length, fd=fd, offset=offset, checksums=compute_checksums(written),
                               chunk_size=CHUNK_SIZE, block_length=len(written)).sent_checksums()

        assert sent(CHUNK_SIZE, len(written) - CHUNK_SIZE) == compute_checksums(written[CHUNK_SIZE:])
        assert sent(0, 2 * CHUNK_SIZE) == compute_checksums(written[:2 * CHUNK_SIZE])
        for offset, length in ((1, 2 * CHUNK_SIZE), (0, CHUNK_SIZE + 5)):
            with pytest.raises(ValueError, match="serve them from memory"):
                sent(offset, length)
    finally:
        os.close(fd)
    assert BlockSource(hit=False, length=3, data=b"abc").sent_checksums() == compute_checksums(b"abc")


def _trickle(address: tuple[str, int], line: bytes, pause: float) -> tuple[bytes, float]:
    """Send `line` but its newline a byte at a time, `pause` seconds apart, until the server
    answers or closes; what it answered, and after how many seconds."""
    with socket.create_connection(address, timeout=30) as sock:
        started = time.monotonic()
        for byte in line[:-1]:
            readable, _, _ = select.select([sock], [], [], pause)
            if readable:
                break
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
        return answer, time.monotonic() - started


async def test_a_request_trickled_a_byte_at_a_time_is_cut_off_at_the_idle_timeout(
        reads: tuple[BlockReads, pb.FileInfo]) -> None:
    # The idle timeout bounds the whole request line, not each byte of it: a reader that
    # sends a byte now and then holds a connection (and its thread) no longer than one that
    # sends nothing, and is told why it was cut off.
    block_reads, info = reads
    settings = DataPortSettings.model_validate({"idleTimeout": 1})
    server = DataServer(block_reads, CREDENTIALS, asyncio.get_running_loop(), settings)
    port = server.start("127.0.0.1", 0)
    try:
        line = request_line(CREDENTIALS.data, ref_for(info, 0), 0)
        assert len(line) * 0.1 > 10  # sent whole, the trickle would take over 10 s
        answer, seconds = await asyncio.to_thread(_trickle, ("127.0.0.1", port), line, 0.1)
        assert answer, f"the worker held a trickled request for {seconds:.1f}s without answering"
        reply = json.loads(answer.split(b"\n")[0])
        assert reply["code"] == "DEADLINE_EXCEEDED" and "idleTimeout" in reply["message"]
        print(f"a trickled request was cut off after {seconds:.1f}s (idleTimeout 1s)")
        # Readers that send their request go on as before.
        reply, body, _ = await exchange(socket.AF_INET, ("127.0.0.1", port), line)
        assert reply["ok"] and body == DATA[:BLOCK]
    finally:
        server.stop()
