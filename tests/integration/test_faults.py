"""The fault suite for readers: a reader never hangs, and never fails where an answer exists.

Real processes throughout: moto's S3 server behind a StoreProxy that refuses, hangs or slows
the store, a master and workers started as users start them, SIGKILL and SIGSTOP sent to
them. Each test bounds its waits with deadlines and measures the longest stall of a reader.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from storeproxy import StoreProxy

from strata.contract import errors
from strata.contract.proto import strata_pb2 as pb

from .conftest import BLOCK_SIZE, Cluster, allow, free_port, metric, wait_until

pytestmark = pytest.mark.timeout(240)

T = TypeVar("T")


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """fn()'s result and how many seconds it took."""
    start = time.monotonic()
    result = fn()
    return result, time.monotonic() - start


def failure_time(fn: Callable[[], Any]) -> tuple[BaseException, float]:
    """The error fn() raises and how many seconds it took to raise it."""
    start = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc, time.monotonic() - start
    raise AssertionError("expected an error, got an answer")


# -- bad names and busy ports (item 15) ------------------------------------------------------

def _listening_socket() -> tuple[Any, int]:
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, int(sock.getsockname()[1])


@pytest.mark.parametrize("server, flag", [("master", "--port"), ("master", "--http-port"),
                                           ("worker", "--port"), ("worker", "--http-port"), ("worker", "--data-port")])
def test_a_server_on_a_busy_port_says_so_in_one_line(tmp_path: Path, server: str, flag: str) -> None:
    holder, busy = _listening_socket()
    try:
        ports = {"--port": free_port(), "--http-port": free_port(), "--data-port": free_port(), flag: busy}
        args = [sys.executable, "-P", "-m", "strata.cacheserver", server, "--bind", "127.0.0.1",
                "--port", str(ports["--port"]), "--http-port", str(ports["--http-port"])]
        if server == "worker":
            config = tmp_path / "worker.yaml"
            config.write_text(f"tiers:\n- {{medium: SSD, quota: 16Mi, dirs: [{tmp_path / 'ssd'}]}}\n"
                              f"masterAddress: 127.0.0.1:{free_port()}\n")
            args += ["--config", str(config), "--data-dir", str(tmp_path / "data"), "--data-port", str(ports["--data-port"])]
        else:
            args += ["--journal-dir", str(tmp_path / "journal")]
        env = {**os.environ, "STRATA_TOKEN": "t", "PYTHONSAFEPATH": "1"}
        done = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    finally:
        holder.close()
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert f"port {busy} is already in use" in done.stderr, output
    assert flag in done.stderr, output
    assert "Traceback" not in output, output


def test_a_nul_byte_in_a_path_is_an_invalid_argument_naming_it(start_cluster: Any, bucket: str) -> None:
    cluster: Cluster = start_cluster(workers=1)
    cluster.mount_bucket("/data", bucket)
    client = cluster.fs().client
    for call in (lambda: client.stat("/data/a\0b"), lambda: client.ls("/data/a\0b"),
                 lambda: client.write_file("/data/w\0x", [b"x"])):
        with pytest.raises(errors.InvalidArgument, match=r"NUL byte") as caught:
            call()
        assert "\\x00" in str(caught.value)
    assert client.ls("/data") == []  # the servers keep serving


def test_a_name_that_is_not_utf8_is_left_out_of_its_listing_by_name(start_cluster: Any, tmp_path: Path) -> None:
    cluster: Cluster = start_cluster(workers=1, **allow(tmp_path))
    source = tmp_path / "files"
    (source / "sub").mkdir(parents=True)
    (source / "good.txt").write_bytes(b"fine")
    (source / "sub" / "deep.txt").write_bytes(b"deeper")
    os.close(os.open(os.fsencode(source) + b"/bad-\xff-name", os.O_CREAT | os.O_WRONLY, 0o600))
    os.close(os.open(os.fsencode(source) + b"/sub/also-\xfe", os.O_CREAT | os.O_WRONLY, 0o600))
    fs = cluster.fs()
    fs.client.mount("/local", f"file://{source}")
    assert sorted(fs.ls("/local", detail=False)) == ["/local/good.txt", "/local/sub"]
    assert sorted(fs.find("/local")) == ["/local/good.txt", "/local/sub/deep.txt"]
    assert fs.cat_file("/local/good.txt") == b"fine"
    log = wait_until(lambda: (t := cluster.master.log.read_text()) and "bad-\\xff-name" in t and t, 10,
                     "a warning naming the bad name")
    assert "not UTF-8" in log


# -- the store behind a proxy ------------------------------------------------------------------

def payload(n: int) -> bytes:
    return (os.urandom(min(n, 1 << 20)) * (n // (1 << 20) + 1))[:n]


@pytest.fixture
def proxy(s3: Any) -> Iterator[StoreProxy]:
    store = StoreProxy(target_port=int(s3.endpoint_url.rsplit(":", 1)[1]))
    yield store
    store.stop()


def mount_through(cluster: Cluster, proxy: StoreProxy, path: str, bucket: str, **options: Any) -> None:
    """Mount `bucket` at `path`, reached through the proxy."""
    store_options = {**cluster.s3.storage_options(), "endpoint_url": proxy.endpoint_url}
    cluster.fs().client.mount(path, f"s3://{bucket}", pb.MountOptions(options=store_options, **options))


SYNC = 1.0  # seconds: the metadata sync interval of the mounts below


def test_a_master_that_answers_its_store_is_down_is_not_away(start_cluster: Any, bucket: str, proxy: StoreProxy) -> None:
    """Metadata a client holds stands in only for a master that does not answer at all. A
    master answering that its store is down is there: a file rewritten since the client
    looked at it must never be read as it was (found by the randomized fault test)."""
    cluster: Cluster = start_cluster(workers=1)
    mount_through(cluster, proxy, "/strict", bucket, metadata_sync_interval=0, stale_if_error=False,
                  write_type=pb.THROUGH)
    fs = cluster.fs()
    old, new = payload(BLOCK_SIZE + 7), payload(BLOCK_SIZE - 7)
    fs.pipe_file("/strict/f", old)
    assert fs.cat_file("/strict/f") == old  # the client now holds the old metadata
    fs.pipe_file("/strict/f", new)
    with proxy.refusing():
        error, _ = failure_time(lambda: fs.cat_file("/strict/f"))
    assert isinstance(error, errors.Unavailable) and not isinstance(error, errors.Unreachable), error
    assert "could not be reached" in str(error)
    assert fs.cat_file("/strict/f") == new


def test_warm_data_is_read_while_the_store_is_down(start_cluster: Any, bucket: str, proxy: StoreProxy) -> None:
    cluster: Cluster = start_cluster(workers=1)
    data = payload(BLOCK_SIZE + 100)
    cluster.s3.put_object(bucket, "dir/a", data)
    cluster.s3.put_object(bucket, "dir/b", b"bee")
    mount_through(cluster, proxy, "/warm", bucket, metadata_sync_interval=SYNC)
    # the switch, as a user turns it off outside Kubernetes
    options = [f"--option={k}={v}" for k, v in {**cluster.s3.storage_options(), "endpoint_url": proxy.endpoint_url}.items()]
    subprocess.run([sys.executable, "-P", "-m", "strata.cacheserver", "mount", "add", "/strict", f"s3://{bucket}",
                    *options, f"--sync-interval={SYNC}s", "--no-stale-if-error"],
                   env={**cluster.env, "STRATA_MASTER": cluster.master_address}, check=True, timeout=60)
    assert [m.options.stale_if_error for m in cluster.fs().client.mounts()] == [False, True]
    for root in ("/warm", "/strict"):
        assert cluster.fs().cat_file(f"{root}/dir/a") == data
        assert sorted(cluster.fs().ls(f"{root}/dir", detail=False)) == [f"{root}/dir/a", f"{root}/dir/b"]
    time.sleep(SYNC * 1.5)  # every answer the master holds is now older than the interval
    with proxy.refusing():
        got, took = timed(lambda: cluster.fs().cat_file("/warm/dir/a"))
        assert got == data
        assert sorted(cluster.fs().ls("/warm/dir", detail=False)) == ["/warm/dir/a", "/warm/dir/b"]
        error, failed_after = failure_time(lambda: cluster.fs().cat_file("/strict/dir/a"))
        assert isinstance(error, errors.Unavailable) and "could not be reached" in str(error), error
    time.sleep(SYNC * 1.5)
    with proxy.hanging():
        got, hung_took = timed(lambda: cluster.fs().cat_file("/warm/dir/a"))
        assert got == data
    print(f"\nstore refused: warm read took {took:.2f}s; stale-if-error off failed after {failed_after:.2f}s; "
          f"store hung: warm read took {hung_took:.2f}s")
    assert took < 5 and hung_took < 8  # STRATA_STORE_STALE_AFTER is 3 s
    answers = metric(cluster.master.metrics(), "strata_master_stale_metadata_answers", '{mount="/warm"}')
    assert answers >= 3
    with pytest.raises(AssertionError):
        metric(cluster.master.metrics(), "strata_master_stale_metadata_answers", '{mount="/strict"}')


def test_a_running_load_reports_what_the_cache_holds_of_it_so_far(start_cluster: Any, bucket: str,
                                                                   proxy: StoreProxy) -> None:
    """The operator's warm-up gate releases a held pod on the share of its data a load holds,
    before the load ends: one file is cached, the other's fetch waits behind the proxy."""
    cluster: Cluster = start_cluster(workers=1)
    a, b = payload(BLOCK_SIZE), payload(BLOCK_SIZE // 2)
    cluster.s3.put_object(bucket, "set/a", a)
    cluster.s3.put_object(bucket, "set/b", b)
    mount_through(cluster, proxy, "/run", bucket)
    fs = cluster.fs()
    assert fs.cat_file("/run/set/a") == a
    wait_until(lambda: fs.info("/run/set/a")["cached_bytes"] == len(a), 10, "a's block to be reported")

    def load() -> Any:
        (report,) = [m for m in fs.client.report().mounts if m.mount.path == "/run"]
        return next((load for load in report.loads if load.path == "/run/set"), None)

    with ThreadPoolExecutor(1) as pool, proxy.holding(f"GET /{bucket}/set/b".encode()):
        loading = pool.submit(lambda: list(fs.client.load("/run/set")))
        running = wait_until(lambda: (r := load()) and not r.done and r.bytes_cached == len(a) and r, 10,
                             "the running load to report a's bytes as cached")
        assert running.bytes_total == len(a) + len(b)
    assert loading.result(timeout=60)[-1].done
    wait_until(lambda: load().bytes_cached == len(a) + len(b), 10, "the whole load to be reported cached")


def test_a_file_deleted_in_the_store_is_not_served_stale(start_cluster: Any, bucket: str, proxy: StoreProxy) -> None:
    cluster: Cluster = start_cluster(workers=1)
    cluster.s3.put_object(bucket, "gone", b"soon gone")
    mount_through(cluster, proxy, "/warm", bucket, metadata_sync_interval=SYNC)
    assert cluster.fs().cat_file("/warm/gone") == b"soon gone"
    cluster.s3.client().delete_object(Bucket=bucket, Key="gone")
    time.sleep(SYNC * 1.5)
    with pytest.raises(FileNotFoundError):
        cluster.fs().cat_file("/warm/gone")


# -- hung, refused and slow stores (item 12) -------------------------------------------------

# STRATA_STORE_DEADLINE (seconds) where a test waits it out: the default, 20 s, would cost
# the test that long for each error, and a shorter one proves the same.
HUNG_DEADLINE = 5


def read_by_block(fs: Any, path: str, blocks: int, *, after_first: Callable[[], None] = lambda: None,
                  spacing: float = 0.0) -> tuple[bytes, float]:
    """The file's bytes read one block at a time from one open file, and the longest
    single read after the first (the reader's longest stall). `after_first` runs once the
    first block is read (a fault hits a read already open); `spacing` spreads the reads
    over at least that many seconds each."""
    longest = 0.0
    with fs.open(path, "rb") as f:
        parts = [f.read(BLOCK_SIZE)]
        after_first()
        for _ in range(blocks - 1):
            piece, took = timed(lambda: f.read(BLOCK_SIZE))
            parts.append(piece)
            longest = max(longest, took)
            time.sleep(max(0.0, spacing - took))
    return b"".join(parts), longest


def test_a_hung_store_gives_a_cold_reader_a_clear_error_in_seconds(start_cluster: Any, bucket: str,
                                                                    proxy: StoreProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_STORE_DEADLINE", str(HUNG_DEADLINE))  # the servers' environment
    cluster: Cluster = start_cluster(workers=2)
    cluster.s3.put_object(bucket, "cold/listed", payload(BLOCK_SIZE))
    cluster.s3.put_object(bucket, "cold/never-seen", b"x")
    mount_through(cluster, proxy, "/hung", bucket)
    fs = cluster.fs()
    fs.ls("/hung/cold")  # the metadata is fresh; the blocks are cold
    with proxy.hanging():
        error, block_after = failure_time(lambda: cluster.fs().cat_file("/hung/cold/listed"))
        assert block_after < HUNG_DEADLINE + 10, f"{block_after:.0f}s to {error!r}"
        assert isinstance(error, errors.DeadlineExceeded), repr(error)
        assert "did not answer" in str(error) and f"s3://{bucket}" in str(error), error
        assert f"within {HUNG_DEADLINE}s" in str(error), error
        error, stat_after = failure_time(lambda: cluster.fs().info("/hung/other/never-seen"))
        assert stat_after < HUNG_DEADLINE + 10, f"{stat_after:.0f}s to {error!r}"
        assert isinstance(error, errors.DeadlineExceeded), repr(error)
        assert f"s3://{bucket}" in str(error), error
    print(f"\nhung store: cold block read failed after {block_after:.1f}s, cold stat after {stat_after:.1f}s")
    assert cluster.fs().cat_file("/hung/cold/listed") == cluster.s3.get_object(bucket, "cold/listed")  # it heals


def test_a_hung_file_store_holds_up_no_other_mount(start_cluster: Any, bucket: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # A file:// mount on a file server that stops answering: every open there waits for
    # ever (here each of its files is swapped for a FIFO nobody writes, whose open waits
    # the same way). Its readers get DeadlineExceeded; readers of another mount must not
    # notice, however many of the hung store's calls are stuck.
    monkeypatch.setenv("STRATA_STORE_DEADLINE", "3")  # the servers' environment
    root = tmp_path / "nfs"
    root.mkdir()
    names = [f"f{i}.bin" for i in range(24)]
    for name in names:
        (root / name).write_bytes(b"x" * 1000)
    cluster: Cluster = start_cluster(workers=1, **allow(tmp_path))
    cluster.mount_bucket("/s", bucket)
    cluster.fs().client.mount("/f", f"file://{root}", pb.MountOptions(metadata_sync_interval=-1))
    fs = cluster.data_fs(host="elsewhere")
    for name in names:
        fs.info(f"/f/{name}")  # the metadata is known: reads go to the worker, which opens the file
        (root / name).unlink()
        os.mkfifo(root / name)
    cold = payload(BLOCK_SIZE + 10)
    cluster.s3.put_object(bucket, "cold.bin", cold)
    try:
        with ThreadPoolExecutor(len(names)) as pool:
            hung = list(pool.map(lambda name: failure_time(lambda: cluster.data_fs(host="elsewhere").cat_file(f"/f/{name}")),
                                 names))
        for error, after in hung:
            assert isinstance(error, errors.DeadlineExceeded) and "did not answer" in str(error), repr(error)
            assert after < 30, f"{after:.0f}s to {error!r}"
        data, after = timed(lambda: fs.cat_file("/s/cold.bin"))
        print(f"\nwith {len(names)} reads stuck in a hung file:// store, a cold S3 read took {after:.1f}s")
        assert data == cold
    finally:
        for name in names:  # a writer lets each stuck open through
            with contextlib.suppress(OSError):
                os.close(os.open(root / name, os.O_WRONLY | os.O_NONBLOCK))


def test_a_write_to_a_hung_file_store_fails_in_bounded_time_and_lands_nowhere_later(
        start_cluster: Any, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A THROUGH write (here a copy within the store) on a file:// mount whose file server
    # stops answering: the open of its source waits for ever (a FIFO nobody writes, as
    # above). The writer gets DeadlineExceeded naming the store once the write made no
    # progress for STRATA_STORE_STALL_TIMEOUT, not when its own call times out; the worker
    # goes on writing; and the write, once the store answers again, does not land after all.
    monkeypatch.setenv("STRATA_STORE_STALL_TIMEOUT", "3")  # the servers' environment
    root = tmp_path / "nfs"
    root.mkdir()
    (root / "hung.bin").write_bytes(b"x" * 1000)
    cluster: Cluster = start_cluster(workers=1, **allow(tmp_path))
    cluster.mount_bucket("/s", bucket)
    cluster.fs().client.mount("/f", f"file://{root}", pb.MountOptions(metadata_sync_interval=-1))
    fs = cluster.data_fs(host="elsewhere")
    fs.info("/f/hung.bin")  # the metadata is known: the copy goes to the worker, which opens the file
    (root / "hung.bin").unlink()
    os.mkfifo(root / "hung.bin")
    worker = fs.client.worker_stub(fs.client.writer_worker())
    request = pb.CopyFileRequest(src="/f/hung.bin", dst="/f/copy.bin", write_type=pb.THROUGH)
    try:
        error, after = failure_time(lambda: worker.CopyFile(request, timeout=90))
        assert isinstance(error, grpc.RpcError), repr(error)
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error
        assert f"file://{root}" in (error.details() or "") and "STRATA_STORE_STALL_TIMEOUT" in (error.details() or ""), \
            error.details()
        print(f"\na copy from a hung file:// store failed after {after:.1f}s")
        fs.pipe_file("/s/after.bin", b"to S3")
        fs.pipe_file("/f/after.bin", b"to the same store")
        assert cluster.s3.get_object(bucket, "after.bin") == b"to S3"
        assert (root / "after.bin").read_bytes() == b"to the same store"
    finally:
        os.close(os.open(root / "hung.bin", os.O_WRONLY | os.O_NONBLOCK))  # the store answers again
    uploads = root / ".strata-uploads"
    wait_until(lambda: not list(uploads.iterdir()), 30, "the given-up copy to clean up after itself")
    assert not (root / "copy.bin").exists(), "a write its writer was told failed landed in the store"


def test_a_refused_store_gives_a_cold_reader_a_clear_error_at_once(start_cluster: Any, bucket: str,
                                                                    proxy: StoreProxy) -> None:
    cluster: Cluster = start_cluster(workers=2)
    cluster.s3.put_object(bucket, "cold", payload(BLOCK_SIZE))
    mount_through(cluster, proxy, "/down", bucket)
    cluster.fs().ls("/down")
    with proxy.refusing():
        error, after = failure_time(lambda: cluster.fs().cat_file("/down/cold"))
    print(f"\nrefused store: cold read failed after {after:.1f}s")
    assert isinstance(error, errors.Unavailable) and "could not be reached" in str(error), repr(error)
    assert after < 15


def test_a_slow_store_costs_a_reader_its_own_latency(start_cluster: Any, bucket: str, proxy: StoreProxy) -> None:
    cluster: Cluster = start_cluster(workers=2)
    data = payload(3 * BLOCK_SIZE)
    cluster.s3.put_object(bucket, "slow", data)
    mount_through(cluster, proxy, "/slow", bucket)
    cluster.fs().ls("/slow")
    with proxy.slowed(3.0):
        (got, longest), whole = timed(lambda: read_by_block(cluster.fs(), "/slow/slow", 3))
    print(f"\nstore slowed by 3s per answer: the cold 3-block read took {whole:.1f}s (longest stall after "
          f"the first block {longest:.1f}s)")
    assert got == data
    # About the store's latency per block, at worst one after the other, and one answer more:
    # 11.3 s quiet or CPU-loaded (this code and the code before it alike), 14.2 s twice beside
    # the e2e suite (an extra store answer there, cause not found); a reader stalled on the
    # slow store (what this guards) waits its deadline a block, far past it.
    assert whole < 4 * 3.0 + 5


# -- stopped and killed workers (item 12) ----------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["SIGSTOP", "SIGKILL"])
def test_an_open_read_goes_on_past_a_stopped_or_killed_worker(start_cluster: Any, bucket: str, sig: int) -> None:
    cluster: Cluster = start_cluster(workers=2)
    blocks = 8
    data = payload(blocks * BLOCK_SIZE)
    cluster.s3.put_object(bucket, "big", data)
    cluster.mount_bucket("/data", bucket)
    fs = cluster.fs()
    assert fs.cat_file("/data/big") == data  # warm: both workers hold blocks of it
    victim = cluster.workers[0]
    assert victim.process is not None
    pid = victim.process.pid
    try:
        got, longest = read_by_block(fs, "/data/big", blocks, after_first=lambda: os.killpg(pid, sig))
        again, longest_again = read_by_block(cluster.fs(), "/data/big", blocks)  # a new reader
    finally:
        if sig == signal.SIGSTOP:
            os.killpg(pid, signal.SIGCONT)
    print(f"\nworker {signal.Signals(sig).name}: longest stall of an open read {longest:.1f}s, "
          f"of a new reader {longest_again:.1f}s")
    assert got == data and again == data
    assert longest < 10 and longest_again < 10


# -- master outages (item 13) ----------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["SIGSTOP", "SIGKILL"])
def test_reads_go_on_through_a_master_outage(start_cluster: Any, bucket: str, sig: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cluster: Cluster = start_cluster(workers=2)
    blocks = 6
    data = payload(blocks * BLOCK_SIZE)
    cluster.s3.put_object(bucket, "big", data)
    cluster.s3.put_object(bucket, "small", b"small file")
    cluster.mount_bucket("/data", bucket)
    # No readahead: the blocks after the first are asked for only once the master is away,
    # so a worker that never saw the file's status must take the store's word for it.
    # A stopped master lets a call about a file never seen wait out STRATA_CLIENT_MASTER_TIMEOUT
    # (30 s by default): this client's is shorter.
    monkeypatch.setenv("STRATA_CLIENT_MASTER_TIMEOUT", "10")
    fs = cluster.fs(readahead=0)
    assert fs.cat_file("/data/small") == b"small file"  # its metadata is now held by the client
    master = cluster.master
    assert master.process is not None
    outage_at: list[float] = []

    def stop_master() -> None:
        assert master.process is not None
        os.killpg(master.process.pid, sig)
        outage_at.append(time.monotonic())

    try:
        # cold blocks after the first: the workers fetch them from the store without the master
        got, longest = read_by_block(fs, "/data/big", blocks, after_first=stop_master, spacing=0.5)
        assert got == data
        assert time.monotonic() - outage_at[0] > 2.5  # past the client's 2 s worker list refresh
        reopened, reopen_took = timed(lambda: fs.cat_file("/data/small"))  # a file seen before
        assert reopened == b"small file"
        assert isinstance(failure_time(lambda: fs.cat_file("/data/never-seen"))[0], errors.Unavailable | errors.DeadlineExceeded)
    finally:
        if sig == signal.SIGSTOP:
            os.killpg(master.process.pid, signal.SIGCONT)
        else:
            master.process.wait(timeout=10)
            master.child = None
            if outage_at:
                # An outage of 8 s: long enough for gRPC's default reconnect back-off to
                # grow past a few seconds (what kept workers away ~12 s after a restart).
                time.sleep(max(0.0, outage_at[0] + 8 - time.monotonic()))
            master.start()
    restarted_at = time.monotonic()
    wait_until(lambda: http_ok(master), 60, "the master to answer again")
    answering_at = time.monotonic()
    cluster.s3.put_object(bucket, "after", b"after the outage")
    resumed = wait_until(lambda: reads(fs, "/data/after"), 30, "reads to resume", interval=0.05)
    resumed_after = time.monotonic() - restarted_at
    registered = wait_until(lambda: len(cluster.fs().client.workers(refresh=True)) == 2 and time.monotonic(), 30,
                            "both workers to register again", interval=0.05)
    print(f"\nmaster {signal.Signals(sig).name}: longest stall of an open read {longest:.1f}s, reopen {reopen_took:.1f}s, "
          f"reads resumed {resumed_after:.1f}s after the master was started again, workers registered "
          f"{registered - answering_at:.1f}s after it answered ({answering_at - restarted_at:.1f}s start-up)")
    assert resumed
    assert longest < 7 and reopen_took < 7  # two master_quick_timeouts at most
    assert registered - answering_at < 3.5


def http_ok(server: Any) -> bool:
    from .conftest import http_get

    return http_get(server.http_port, "/healthz")[0] == 200


def reads(fs: Any, path: str) -> bool:
    try:
        return bool(fs.cat_file(path))
    except (errors.StrataError, OSError):
        return False
