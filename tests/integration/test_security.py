"""Nobody in without the key, and a key opens only its own door: real master and worker
processes under unauthenticated floods, callers of each role, file:// mounts with links out
of their root, and many idle data-port connections."""

from __future__ import annotations

import json
import os
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from strata.cacheserver import launcher
from strata.cacheserver.auth import CREDENTIAL_ENV
from strata.cacheserver.common.blockwire import request_line, write_chunk
from strata.contract import errors, rpc
from strata.contract.constants import UPLOAD_DIR
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc

from .conftest import DATA_TOKEN, INTERNAL_TOKEN, TOKEN, Cluster, allow, free_port_range, make_worker, wait_until
from .test_cli import strata

pytestmark = pytest.mark.timeout(300)

MiB = 1024 * 1024


def rss_mib(pid: int) -> float:
    return _status_field(pid, "VmRSS") / 1024


def threads(pid: int) -> int:
    return _status_field(pid, "Threads")


def listen_queue(port: int) -> int:
    """Connections waiting to be accepted on the listening TCP socket of 127.0.0.1:`port`
    (an IPv4 socket, or an IPv6 one bound to its v4-mapped address, as gRPC binds)."""
    addresses = {f"0100007F:{port:04X}", f"0000000000000000FFFF00000100007F:{port:04X}"}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1] in addresses and fields[3] == "0A":  # LISTEN
                return int(fields[4].split(":")[1], 16)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


def _status_field(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status has no {name}")


def flood(address: str, method: str, *, rounds: int = 4, calls: int = 6, size: int = 60 * MiB,
          token: str | None = None) -> list[grpc.StatusCode]:
    """`rounds` times, `calls` concurrent calls of `method` carrying a `size`-byte message,
    each round on a new connection; the status codes the server answered."""
    payload = b"x" * size
    codes: list[grpc.StatusCode] = []
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    for _ in range(rounds):
        channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 1 << 30)])
        call = channel.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)

        def one() -> None:
            try:
                call(payload, timeout=60, metadata=metadata)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())

        workers = [threading.Thread(target=one) for _ in range(calls)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(timeout=120)
        channel.close()
    return codes


@pytest.fixture
def cluster(start_cluster: Any) -> Cluster:
    return start_cluster(workers=1)  # type: ignore[no-any-return]


def test_an_unauthenticated_flood_is_refused_before_its_bodies_are_read(cluster: Cluster, bucket: str) -> None:
    master, worker = cluster.master, cluster.workers[0]
    assert master.process is not None and worker.process is not None
    before = {"master": rss_mib(master.process.pid), "worker": rss_mib(worker.process.pid)}
    master_codes = flood(cluster.master_address, "/strata.v1.Master/Mount")
    worker_codes = flood(f"127.0.0.1:{worker.port}", "/strata.v1.Worker/FreeBlocks")
    worker_codes += flood(f"127.0.0.1:{worker.port}", "/strata.v1.Worker/WriteFile", rounds=1)
    after = {"master": rss_mib(master.process.pid), "worker": rss_mib(worker.process.pid)}
    print(f"RSS MiB before the flood {before}, after 4 rounds of 6 x 60 MiB unauthenticated: {after}")
    assert set(master_codes) == {grpc.StatusCode.UNAUTHENTICATED}
    assert set(worker_codes) == {grpc.StatusCode.UNAUTHENTICATED}
    # 24 messages of 60 MiB went to each: 1.4 GiB if they were received.
    for name in before:
        assert after[name] - before[name] < 64, f"{name} RSS grew from {before[name]:.0f} to {after[name]:.0f} MiB"

    # A data token at an admin door is refused the same way, before its message is read.
    denied = flood(cluster.master_address, "/strata.v1.Master/Mount", rounds=2, token=DATA_TOKEN)
    assert set(denied) == {grpc.StatusCode.PERMISSION_DENIED}
    assert rss_mib(master.process.pid) - before["master"] < 64

    # A caller with a token cannot send more than a message of its method's size either.
    big = flood(cluster.master_address, "/strata.v1.Master/Mount", rounds=1, calls=2, size=40 * MiB, token=TOKEN)
    assert set(big) == {grpc.StatusCode.RESOURCE_EXHAUSTED}

    # Authenticated use goes on as before.
    data = os.urandom(3 * MiB)
    cluster.s3.put_object(bucket, "f.bin", data)
    cluster.mount_bucket("/d", bucket)
    fs = cluster.data_fs(host="elsewhere")
    assert fs.cat_file("/d/f.bin") == data
    fs.pipe_file("/d/g.bin", data[:1000])
    assert cluster.s3.get_object(bucket, "g.bin") == data[:1000]
    assert rss_mib(master.process.pid) - before["master"] < 64


def _stub(cluster: Cluster, token: str) -> pb_grpc.MasterStub:
    return pb_grpc.MasterStub(rpc.sync_channel(cluster.master_address, token))


def _code(fn: Any) -> grpc.StatusCode:
    try:
        fn()
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_each_credential_opens_only_its_own_doors(cluster: Cluster, bucket: str) -> None:
    cluster.s3.put_object(bucket, "f.txt", b"hello")
    cluster.mount_bucket("/d", bucket)  # admin
    admin, data, internal = (_stub(cluster, t) for t in (TOKEN, DATA_TOKEN, INTERNAL_TOKEN))
    wrong = _stub(cluster, "not-a-token")

    # The store's credentials leave the master only to workers (the internal credential).
    table = internal.GetMountTable(pb.GetMountTableRequest(), timeout=10)
    assert [m.path for m in table.mounts] == ["/d"]
    for stub in (admin, data):
        with pytest.raises(grpc.RpcError) as denied:
            stub.GetMountTable(pb.GetMountTableRequest(), timeout=10)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "GetMountTable needs the internal credential" in (denied.value.details() or "")
    assert _code(lambda: wrong.ListMounts(pb.ListMountsRequest(), timeout=10)) == grpc.StatusCode.UNAUTHENTICATED

    # The data credential reads and writes files, and manages nothing.
    fs = cluster.data_fs(host="elsewhere")
    assert fs.cat_file("/d/f.txt") == b"hello"
    fs.pipe_file("/d/new.txt", b"written")
    assert cluster.s3.get_object(bucket, "new.txt") == b"written"
    assert [m.path for m in fs.client.mounts()] == ["/d"]
    for call in (
        lambda: data.Mount(pb.MountRequest(path="/etc", source="file:///etc"), timeout=10),
        lambda: data.Unmount(pb.UnmountRequest(path="/d"), timeout=10),
        lambda: data.Free(pb.FreeRequest(path="/d"), timeout=10),
        lambda: data.SetPinned(pb.SetPinnedRequest(path="/d", pinned=True), timeout=10),
        lambda: list(data.Load(pb.LoadRequest(path="/d"), timeout=10)),
        lambda: data.Report(pb.ReportRequest(), timeout=10),
        lambda: data.DecommissionWorkers(pb.DecommissionWorkersRequest(worker_ids=["worker-0"]), timeout=10),
        lambda: data.RegisterWorker(pb.RegisterWorkerRequest(worker=pb.WorkerInfo(worker_id="x", address="1.2.3.4:1")), timeout=10),
        lambda: data.CommitFile(pb.CommitFileRequest(path="/d/f.txt", length=1, version="evil"), timeout=10),
    ):
        assert _code(call) == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(errors.PermissionDenied, match="needs the admin credential"):
        fs.client.free("/d")

    # Worker doors: block management is for the master and peers only.
    worker = pb_grpc.WorkerStub(rpc.sync_channel(f"127.0.0.1:{cluster.workers[0].port}", DATA_TOKEN))
    assert _code(lambda: worker.FreeBlocks(pb.FreeBlocksRequest(mount_id=1), timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
    assert _code(lambda: worker.PinBlocks(pb.PinBlocksRequest(), timeout=10)) == grpc.StatusCode.PERMISSION_DENIED

    # The admin credential manages the cache and reads files too.
    assert admin.Report(pb.ReportRequest(), timeout=10).workers
    assert cluster.fs().cat_file("/d/f.txt") == b"hello"


def test_a_write_that_will_be_refused_is_refused_before_its_bytes_are_taken(cluster: Cluster, bucket: str) -> None:
    # A data credential may write files, but not into a read-only mount, onto a mount point,
    # outside every mount or into the store's hidden upload folder: the worker says so from
    # the first message, without staging the rest of the stream on its disk first.
    cluster.s3.put_object(bucket, "f.txt", b"hello")
    cluster.mount_bucket("/d", bucket)
    cluster.mount_bucket("/ro", bucket, read_only=True)
    worker = pb_grpc.WorkerStub(rpc.sync_channel(f"127.0.0.1:{cluster.workers[0].port}", DATA_TOKEN))
    refused = {
        "/ro/new.bin": (grpc.StatusCode.PERMISSION_DENIED, "read-only"),
        "/d": (grpc.StatusCode.INVALID_ARGUMENT, "is a mount point"),
        "/nowhere/new.bin": (grpc.StatusCode.NOT_FOUND, "no mount covers /nowhere/new.bin"),
        f"/d/{UPLOAD_DIR}/planted": (grpc.StatusCode.PERMISSION_DENIED, f"{UPLOAD_DIR} is Strata's own upload folder"),
    }
    for path, (code, message) in refused.items():
        rest = threading.Event()

        def stream(path: str = path, rest: threading.Event = rest) -> Iterator[pb.WriteFileChunk]:
            yield write_chunk(b"x" * MiB, path=path, write_type=pb.THROUGH)
            rest.wait(60)  # the rest of the file comes only once the worker answered
            for _ in range(4):
                yield write_chunk(b"x" * MiB)

        call = worker.WriteFile.future(stream(), timeout=120)
        try:
            error = call.exception(timeout=60)
        except grpc.FutureTimeoutError:
            raise AssertionError(f"the worker took no decision on {path} from its first message") from None
        finally:
            rest.set()
        assert isinstance(error, grpc.RpcError), path
        assert (error.code(), message in (error.details() or "")) == (code, True), (path, error.details())

    # The upload folder is closed to every other change by clients too.
    fs = cluster.data_fs(host="elsewhere")
    for call in (lambda: fs.client.mv("/d/f.txt", f"/d/{UPLOAD_DIR}/planted"),
                 lambda: fs.client.copy_file("/d/f.txt", f"/d/{UPLOAD_DIR}/planted"),
                 lambda: fs.client.write_file(f"/d/{UPLOAD_DIR}/planted", [b"x"], append=True)):
        with pytest.raises(errors.PermissionDenied, match=f"{UPLOAD_DIR} is Strata's own upload folder"):
            call()
    listed = cluster.s3.client().list_objects_v2(Bucket=bucket).get("Contents", [])
    assert [o["Key"] for o in listed if UPLOAD_DIR in o["Key"]] == []
    assert fs.cat_file("/d/f.txt") == b"hello"


def test_no_error_shows_a_value_of_the_mounts_credentials(cluster: Cluster, bucket: str) -> None:
    # Store options may come from the Mount's credentials Secret; a value there that is not
    # what the option takes is refused naming the key, never showing the value.
    client = cluster.fs().client
    options = cluster.s3.storage_options()
    keys = {"key": options.pop("key"), "secret": options.pop("secret")}
    secrets = {"use_ssl": "not-a-bool-but-a-secret-1", "max_concurrency": "not-a-number-but-a-secret-2"}
    for key, value in secrets.items():
        with pytest.raises(errors.InvalidArgument) as refused:
            client.mount("/c", f"s3://{bucket}", pb.MountOptions(options=options, credentials={**keys, key: value}))
        message = str(refused.value)
        assert key in message and "credentials" in message, message
        assert value not in message, message
    # An endpoint given among the credentials is not shown when the store cannot be reached.
    hidden = f"http://127.0.0.1:{free_port_range(1)}/secret-path-3"
    with pytest.raises(errors.Unavailable) as unreachable:
        client.mount("/c", f"s3://{bucket}", pb.MountOptions(credentials={**keys, "endpoint_url": hidden, "region": "us-east-1"}))
    assert "secret-path-3" not in str(unreachable.value), unreachable.value


@pytest.fixture
def folders(tmp_path: Path) -> Iterator[dict[str, Path]]:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    source = allowed / "src"
    (source / "sub").mkdir(parents=True)
    outside.mkdir()
    (source / "ok.txt").write_bytes(b"inside")
    (source / "sub" / "deep.txt").write_bytes(b"deep")
    (outside / "secret.txt").write_bytes(b"host secret")
    (source / "passwd").symlink_to("/etc/passwd")
    (source / "secret").symlink_to(outside / "secret.txt")
    (source / "outdir").symlink_to(outside, target_is_directory=True)
    (source / "alias.txt").symlink_to(source / "ok.txt")  # a link that stays inside is fine
    (allowed / "escape").symlink_to(outside, target_is_directory=True)
    yield {"allowed": allowed, "outside": outside, "source": source}


def test_file_sources_need_a_root_the_owner_allows(start_cluster: Any, folders: dict[str, Path]) -> None:
    closed = start_cluster(workers=1)
    with pytest.raises(errors.PermissionDenied, match="allows no file:// sources.*allowedRoots"):
        closed.fs().client.mount("/x", "file:///etc")

    cluster = start_cluster(workers=1, **allow(folders["allowed"]))
    client = cluster.fs().client
    with pytest.raises(errors.PermissionDenied, match="not under a folder this cluster allows"):
        client.mount("/x", "file:///etc")
    with pytest.raises(errors.PermissionDenied, match="not under a folder"):
        client.mount("/x", f"file://{folders['allowed']}/escape")  # a link out of the allowed root
    with pytest.raises(errors.InvalidArgument, match="wraps another filesystem"):
        client.mount("/x", "simplecache:///etc", pb.MountOptions(options={"target_protocol": "file"}))
    client.mount("/src", f"file://{folders['source']}")
    assert cluster.fs().cat_file("/src/ok.txt") == b"inside"


def test_no_read_listing_or_write_leaves_a_file_root(start_cluster: Any, folders: dict[str, Path]) -> None:
    cluster = start_cluster(workers=1, **allow(folders["allowed"]))
    # Metadata checked on every access: each call below reaches the store.
    cluster.fs().client.mount("/src", f"file://{folders['source']}", pb.MountOptions(metadata_sync_interval=0))
    fs = cluster.data_fs(host="elsewhere")

    for name in ("passwd", "secret"):
        with pytest.raises(errors.PermissionDenied, match=f"src/{name} leads out of the mount's root"):
            fs.cat_file(f"/src/{name}")
    with pytest.raises(errors.PermissionDenied, match="outdir/secret.txt leads out"):
        fs.cat_file("/src/outdir/secret.txt")
    assert fs.cat_file("/src/alias.txt") == b"inside"

    names = sorted(fs.ls("/src", detail=False))
    assert names == ["/src/alias.txt", "/src/ok.txt", "/src/sub"]
    assert sorted(fs.find("/src")) == ["/src/alias.txt", "/src/ok.txt", "/src/sub/deep.txt"]

    with pytest.raises(errors.PermissionDenied, match="outdir/planted.txt leads out"):
        fs.pipe_file("/src/outdir/planted.txt", b"x")
    assert not (folders["outside"] / "planted.txt").exists()
    with pytest.raises((errors.InvalidArgument, errors.NotFound, errors.PermissionDenied)):
        fs.cat_file("/src/../allowed/escape/secret.txt")
    fs.pipe_file("/src/sub/written.txt", b"fine")
    assert (folders["source"] / "sub" / "written.txt").read_bytes() == b"fine"

    # A file swapped for a link after its metadata was read: the worker's read refuses it.
    same_size = folders["source"] / "swap.txt"
    same_size.write_bytes(b"x" * len(b"host secret"))
    cluster.fs().client.mount("/cached", f"file://{folders['source']}")  # metadata kept 30 s
    assert fs.info("/cached/swap.txt")["size"] == len(b"host secret")
    same_size.unlink()
    same_size.symlink_to(folders["outside"] / "secret.txt")
    with pytest.raises(errors.StrataError) as refused:
        fs.cat_file("/cached/swap.txt")
    assert "leads out of the mount's root" in str(refused.value)

    # The mount's own folder swapped for a link out of the allowed root: master (listings)
    # and worker (reads) both refuse it, each resolving links on its own host.
    moved = folders["allowed"] / "src-moved"
    folders["source"].rename(moved)
    folders["source"].symlink_to(folders["outside"], target_is_directory=True)
    for call in (lambda: fs.client.ls("/src"), lambda: fs.cat_file("/cached/ok.txt")):
        with pytest.raises(errors.PermissionDenied, match="not under a folder this cluster allows"):
            call()


def test_idle_data_port_connections_are_bounded_and_closed(start_cluster: Any, bucket: str) -> None:
    cluster = start_cluster(workers=1, extra={"dataPort": {"idleTimeout": 8}})
    worker = cluster.workers[0]
    assert worker.process is not None
    fs = cluster.data_fs(host="elsewhere")
    info = fs.client.workers()[0]
    address = ("127.0.0.1", info.data_port)
    data = os.urandom(2 * MiB)
    cluster.s3.put_object(bucket, "f.bin", data)
    cluster.mount_bucket("/d", bucket)
    baseline = threads(worker.process.pid)

    conns = [socket.create_connection(address, timeout=10) for _ in range(800)]
    try:
        # Past the limit (256 by default) a connection gets a clear answer and is closed.
        refused = []
        for conn in conns[256:]:
            reply = json.loads(conn.makefile("rb").readline())
            refused.append(reply)
        assert {r["code"] for r in refused} == {"UNAVAILABLE"}
        assert "limit of 256 connections" in refused[0]["message"]
        held = threads(worker.process.pid)
        print(f"worker threads: {baseline} before, {held} with 800 idle data-port connections")
        assert held <= baseline + 256 + 8
        # Reads go on (over gRPC while the port is full).
        assert fs.cat_file("/d/f.bin") == data
        # The idle ones are closed after the idle timeout, and their threads end.
        started = time.monotonic()
        conns[0].settimeout(30)
        assert conns[0].recv(1) == b""
        closed_after = time.monotonic() - started
        print(f"an idle data-port connection was closed after {closed_after:.1f}s (idleTimeout 8s)")
        assert closed_after < 20
        wait_until(lambda: threads(worker.process.pid) <= baseline + 8, 30, "connection threads to end")
    finally:
        for conn in conns:
            conn.close()
    assert fs.cat_file("/d/f.bin") == data
    assert cluster.worker_metric(0, "strata_worker_data_port_reads") >= 1

    # A reader that asks for a block and then takes none of its bytes holds its thread no
    # longer than the idle timeout either.
    wait_until(lambda: threads(worker.process.pid) <= baseline + 8, 30, "connection threads to end")
    settled = threads(worker.process.pid)
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(address)
    try:
        ref = fs.client.block_ref(fs.client.stat("/d/f.bin"), 0)
        stalled.sendall(request_line(DATA_TOKEN, ref, 0))
        wait_until(lambda: threads(worker.process.pid) > settled, 10, "the stalled reader's thread to start")
        started = time.monotonic()
        wait_until(lambda: threads(worker.process.pid) <= settled, 30, "the stalled reader's thread to end")
        print(f"a reader that took no bytes was dropped after {time.monotonic() - started:.1f}s")
    finally:
        stalled.close()


def _worker_and_file(cluster: Cluster, bucket: str, size: int) -> tuple[int, bytes, Any]:
    """The pid of the cluster's worker, and `size` random bytes put at /d/f.bin (the bucket
    mounted at /d) with a data client to read them."""
    assert cluster.workers[0].process is not None
    data = os.urandom(size)
    cluster.s3.put_object(bucket, "f.bin", data)
    cluster.mount_bucket("/d", bucket)
    return cluster.workers[0].process.pid, data, cluster.data_fs(host="elsewhere")


def test_the_data_port_serves_again_after_the_worker_ran_out_of_descriptors(start_cluster: Any, bucket: str) -> None:
    cluster = start_cluster(workers=1)
    pid, data, fs = _worker_and_file(cluster, bucket, 2 * MiB)
    address = ("127.0.0.1", fs.client.workers()[0].data_port)
    ref = fs.client.block_ref(fs.client.stat("/d/f.bin"), 0)

    def free_below(limit: int) -> set[int]:
        return set(range(limit)) - {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}

    # For a moment the worker has no descriptor left for a new connection (a flood of
    # connections, or anything else that fills its table): its limit is lowered to leave it
    # a few, and connections come until some wait in the port's listen queue, untaken, for 2 s.
    limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    ceiling = sorted(free_below(4096))[8]
    conns: list[socket.socket] = []
    waiting_since: list[float] = []

    def untaken_for(seconds: float) -> bool:
        if listen_queue(address[1]) == 0:
            waiting_since.clear()
            return False
        waiting_since[:] = waiting_since or [time.monotonic()]
        return time.monotonic() - waiting_since[0] >= seconds

    try:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (ceiling, limits[1]))
        conns = [socket.create_connection(address, timeout=10) for _ in range(24)]
        wait_until(lambda: untaken_for(2.0), 30, "connections the worker cannot take")
    finally:
        for conn in conns:
            conn.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)

    # Descriptors are free again: the data port takes new connections and serves them.
    with socket.create_connection(address, timeout=10) as conn:
        conn.settimeout(30)
        conn.sendall(request_line(DATA_TOKEN, ref, 0))
        try:
            reply = json.loads(conn.makefile("rb").readline())
        except TimeoutError:
            pytest.fail("the data port took no connection after the worker was out of descriptors for a moment")
        assert reply["ok"] and reply["length"] == 2 * MiB
    assert "data socket cannot accept a connection" in cluster.workers[0].log.read_text()
    assert fs.cat_file("/d/f.bin") == data


# What a gRPC client sends first: the HTTP/2 preface and an empty SETTINGS frame. A
# connection that sent them and nothing more is held by the server; no token is needed.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def test_a_flood_of_idle_grpc_connections_leaves_a_worker_the_descriptors_it_reads_with(
        start_cluster: Any, bucket: str) -> None:
    # A worker whose open file limit is 1024 (soft and hard: what many hosts start processes
    # with), and a flood of more unauthenticated gRPC connections than that, held open.
    cluster = start_cluster(workers=0)
    worker = make_worker(cluster.root, 0, cluster.master.port, cluster.env)
    worker.child = launcher.start(worker.name, ["sh", "-c", 'ulimit -n 1024 && exec "$@"', "sh",
                                                *launcher.strata_argv(*worker.args)], worker.log, env=worker.env)
    cluster.workers.append(worker)
    worker.wait_healthy()
    cluster.wait_workers(1)
    pid, data, fs = _worker_and_file(cluster, bucket, 6 * MiB)

    own = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(own[0], min(own[1], 4096)), own[1]))
    conns: list[socket.socket] = []
    try:
        for _ in range(1100):
            conn = socket.create_connection(("127.0.0.1", worker.port), timeout=10)
            conn.sendall(HTTP2_PREFACE)
            conns.append(conn)
        counts: list[int] = []

        def settled() -> bool:  # nothing left in the listen queue, and the count holds still
            counts.append(len(os.listdir(f"/proc/{pid}/fd")))
            return listen_queue(worker.port) == 0 and len(counts) > 5 and len(set(counts[-5:])) == 1

        deadline = time.monotonic() + 20  # a worker out of descriptors never settles: read anyway
        while not settled() and time.monotonic() < deadline:
            time.sleep(0.2)
        print(f"the worker holds {counts[-1]} descriptors with 1100 idle gRPC connections open")
        # A cold read needs descriptors: the data port's connection, the store's, a block file.
        assert fs.cat_file("/d/f.bin") == data
    finally:
        for conn in conns:
            conn.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, own)
    assert fs.cat_file("/d/f.bin") == data


@pytest.fixture
def local_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {**os.environ, "STRATA_HOME": str(tmp_path / "home"), "PYTHONSAFEPATH": "1"}
    for name in ("STRATA_MASTER", *CREDENTIAL_ENV):
        env.pop(name, None)
    yield env
    strata(env, "local", "down", check=False)


def test_a_local_cluster_gives_each_role_its_own_owner_only_token(local_env: dict[str, str], tmp_path: Path) -> None:
    master_port, worker_port = free_port_range(2), free_port_range(3)
    strata(local_env, "local", "up", "--workers", "1", "--mem", "16Mi",
           "--master-port", str(master_port), "--worker-port", str(worker_port))
    folder = tmp_path / "home" / "local"
    tokens = {name: (folder / name) for name in ("token", "data-token", "internal-token")}
    for path in tokens.values():
        assert path.stat().st_mode & 0o777 == 0o600
    assert len({p.read_text() for p in tokens.values()}) == 3

    # The owner of this machine runs the cluster: file:// mounts of its folders are allowed.
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.txt").write_bytes(b"local file")
    strata(local_env, "mount", "add", "/logs", f"file://{logs}")
    assert strata(local_env, "fs", "cat", "/logs/a.txt").stdout == b"local file"

    # With only the data credential (STRATA_DATA_TOKEN_FILE), files yes, mounts no.
    data_env = {**local_env, "STRATA_DATA_TOKEN_FILE": str(tokens["data-token"]), "STRATA_HOME": str(tmp_path / "none"),
                "STRATA_MASTER": f"127.0.0.1:{master_port}"}
    assert strata(data_env, "fs", "cat", "/logs/a.txt").stdout == b"local file"
    refused = strata(data_env, "mount", "add", "/etc", "file:///etc", check=False)
    assert refused.returncode == 1 and b"needs the admin credential" in refused.stderr
