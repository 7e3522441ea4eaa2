"""Real processes for the integration tests: a moto S3 server, `strata master`, `strata worker`s.

Every server is a child process started the way a user starts it (`strata master ...`), on
127.0.0.1 with free ports, and stopped when the test ends, also when it fails.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import s3server
import yaml
from waiting import wait_until as wait_until  # the suites take it from here

from strata.cacheserver import launcher
from strata.cacheserver.common.blockrefs import block_count
from strata.cacheserver.client.core import StrataClient
from strata.cacheserver.client.fs import StrataFileSystem

REPO = Path(__file__).resolve().parents[2]
# The admin credential (what the fixture's env and `Cluster.fs` carry), the data credential
# (`Cluster.data_fs`) and the one master and workers use among themselves.
TOKEN = "integration-test-token"
DATA_TOKEN = "integration-data-token"
INTERNAL_TOKEN = "integration-internal-token"
BLOCK_SIZE = 4 * 1024 * 1024
STARTUP_TIMEOUT = 60.0




_handed_out: set[int] = set()


def _port_pool() -> range | None:
    """Ports above the kernel's ephemeral range (from which every outgoing connection on the
    machine takes its local port, so one picked there may be taken before a server binds it),
    when there are enough of them; None: ask the kernel for any free port."""
    try:
        _, last = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return None
    return range(last + 1, 65536) if 65535 - last >= 1000 else None


_POOL = _port_pool()


def free_port() -> int:
    """A port nothing listens on now and that this test session has not handed out before
    (a stopped server's port may still be in use by a process that is shutting down)."""
    while True:
        if _POOL is not None:
            port = random.choice(_POOL[:-16])  # room for the ranges free_port_range hands out
            if not _bindable(port):
                continue
        else:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
        if port not in _handed_out and port + 1 not in _handed_out:
            _handed_out.add(port)
            return port


def free_port_range(count: int) -> int:
    """The first of `count` consecutive free ports (servers that take port, port+1, ...)."""
    while True:
        first = free_port()
        candidates = range(first, first + count)
        if all(p not in _handed_out or p == first for p in candidates) and all(_bindable(p) for p in candidates):
            _handed_out.update(candidates)
            return first


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def read_by_blocks(client: StrataClient, path: str) -> bytes:
    """A whole file read block by block with `read_block` (the client's block read path:
    short-circuit, data port or gRPC, with failover), not through the fsspec file."""
    info = client.stat(path)
    assert not info.is_dir, f"{path} is a directory"
    return b"".join(client.read_block(client.block_ref(info, i))
                    for i in range(block_count(info.length, info.block_size)))


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def metric(text: str, name: str, labels: str = "") -> float:
    pattern = re.compile(rf"^{re.escape(name)}(?:_total)?{re.escape(labels)}\s+([0-9.e+-]+)$", re.M)
    values = [float(m.group(1)) for m in pattern.finditer(text)]
    if not values:
        raise AssertionError(f"metric {name}{labels} not found")
    return sum(values)


@dataclass
class Server:
    name: str
    args: list[str]
    env: dict[str, str]
    log: Path
    http_port: int
    port: int
    child: launcher.Child | None = None

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        return self.child.process if self.child is not None else None

    def start(self) -> None:
        self.child = launcher.start(self.name, launcher.strata_argv(*self.args), self.log, env=self.env)

    def ready(self) -> tuple[launcher.Child, Any, str]:
        """The wait for this server to answer /healthz (for `launcher.wait_ready`)."""
        assert self.child is not None, f"{self.name} was not started"
        return self.child, lambda: http_get(self.http_port, "/healthz")[0] == 200, \
            f"it answers /healthz on port {self.http_port}"

    def wait_healthy(self) -> None:
        launcher.wait_ready([self.ready()], STARTUP_TIMEOUT)

    def metrics(self) -> str:
        status, text = http_get(self.http_port, "/metrics")
        assert status == 200, f"{self.name} /metrics answered {status}"
        return text

    def stop(self, sig: int = signal.SIGTERM, grace: float = 15) -> None:
        if self.child is not None:
            self.child.stop(grace=grace, sig=sig)
        self.child = None


@dataclass
class Cluster:
    root: Path
    master: Server
    workers: list[Server]
    s3: Any
    env: dict[str, str]
    filesystems: list[StrataFileSystem] = field(default_factory=list)

    @property
    def master_address(self) -> str:
        return f"127.0.0.1:{self.master.port}"

    def fs(self, host: str = "test-client", **kwargs: Any) -> StrataFileSystem:
        kwargs.setdefault("token", TOKEN)
        fs = StrataFileSystem(master=self.master_address, host=host, skip_instance_cache=True, **kwargs)
        self.filesystems.append(fs)
        return fs

    def data_fs(self, host: str = "test-client", **kwargs: Any) -> StrataFileSystem:
        """A client with the data credential only, as pods and CSI volumes have."""
        return self.fs(host=host, token=DATA_TOKEN, **kwargs)

    def worker_metric(self, index: int, name: str) -> float:
        return metric(self.workers[index].metrics(), name)

    def total_metric(self, name: str, labels: str = "") -> float:
        return sum(metric(w.metrics(), name, labels) for w in self.workers if w.process is not None)

    def wait_workers(self, count: int) -> None:
        fs = self.fs()
        wait_until(lambda: len(fs.client.workers(refresh=True)) == count, 30, f"{count} live workers")

    def mount_bucket(self, path: str, bucket: str, **options: Any) -> None:
        from strata.contract.proto import strata_pb2 as pb

        self.fs().client.mount(path, f"s3://{bucket}", pb.MountOptions(options=self.s3.storage_options(), **options))

    def stop(self) -> None:
        for fs in self.filesystems:
            fs.client.close()
        stop_servers([*self.workers, self.master])


def start_servers(servers: list[Server]) -> None:
    """Start the servers side by side and wait until each answers /healthz."""
    for server in servers:
        server.start()
    launcher.wait_ready([server.ready() for server in servers], STARTUP_TIMEOUT)


def stop_servers(servers: list[Server], grace: float = 15) -> None:
    """SIGTERM to every running server at once, then each waited for within one grace
    period (SIGKILL to what is left): as fast as the slowest, where one by one took the sum."""
    running = [s for s in servers if s.child is not None]
    for server in running:
        assert server.child is not None
        if server.child.alive():
            server.child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for server in running:
        assert server.child is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        server.stop(grace=0)  # SIGKILL to whatever of its group is left; reaped


def make_worker(root: Path, index: int, master_port: int, env: dict[str, str], *, tiers: list[dict[str, Any]] | None = None,
                host: str | None = None, extra: dict[str, Any] | None = None) -> Server:
    name = f"worker-{index}"
    config = {
        "blockSize": BLOCK_SIZE,
        "masterAddress": f"127.0.0.1:{master_port}",
        "heartbeatInterval": 0.2, "heartbeatMisses": 10,
        "tiers": tiers or [{"medium": "MEM", "quota": "64Mi", "dirs": [f"/dev/shm/strata-it-{os.getpid()}-{root.name}-{name}"]},
                           {"medium": "SSD", "quota": "256Mi", "dirs": [str(root / name / "ssd")]}],
        **(extra or {}),
    }
    cfg = root / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(config))
    port, http_port, data_port = free_port(), free_port(), free_port()
    worker_env = {**env, "STRATA_WORKER_ID": name, "STRATA_HOSTNAME": host or f"node-{index}",
                  "STRATA_ADVERTISE_HOST": "127.0.0.1"}
    return Server(
        name=name,
        args=["worker", "--config", str(cfg), "--data-dir", str(root / name), "--bind", "127.0.0.1",
              "--port", str(port), "--http-port", str(http_port), "--data-port", str(data_port)],
        env=worker_env, log=root / "logs" / f"{name}.log", http_port=http_port, port=port,
    )


@pytest.fixture(scope="session")
def s3() -> Iterator[Any]:
    server = s3server.start_moto_server()
    yield server
    server.stop()


@pytest.fixture
def bucket(s3: Any, request: pytest.FixtureRequest) -> str:
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-")
    s3.create_bucket(name)
    return name


def launch_cluster(root: Path, s3: Any, workers: int = 2, tiers: list[dict[str, Any]] | None = None,
                   extra: dict[str, Any] | None = None, clusters: list[Cluster] | None = None) -> Cluster:
    """Start a master and `workers` workers under `root` (added to `clusters` before they
    start, so a failed start is still stopped by whoever owns the list)."""
    env = {**os.environ, "STRATA_TOKEN": TOKEN, "STRATA_DATA_TOKEN": DATA_TOKEN,
           "STRATA_INTERNAL_TOKEN": INTERNAL_TOKEN, "PYTHONSAFEPATH": "1", "STRATA_LOG_LEVEL": "info",
           # Tests stop workers to restart them, often with the store cut: a short drain.
           "STRATA_UPLOAD_DRAIN_TIMEOUT": "2"}
    env.pop("STRATA_MASTER", None)
    port, http_port = free_port(), free_port()
    master_cfg = root / "master.yaml"
    root.mkdir(parents=True)
    master_cfg.write_text(yaml.safe_dump({"blockSize": BLOCK_SIZE, "heartbeatInterval": 0.2, "heartbeatMisses": 10,
                                          **(extra or {})}))
    master = Server(
        name="master",
        args=["master", "--config", str(master_cfg), "--journal-dir", str(root / "journal"),
              "--bind", "127.0.0.1", "--port", str(port), "--http-port", str(http_port)],
        env=env, log=root / "logs" / "master.log", http_port=http_port, port=port,
    )
    cluster = Cluster(root=root, master=master, s3=s3, env=env,
                      workers=[make_worker(root, i, port, env, tiers=tiers, extra=extra) for i in range(workers)])
    if clusters is not None:
        clusters.append(cluster)
    # The workers start beside the master, as in Kubernetes: each registers once the master
    # answers (their channels try again within a second).
    start_servers([master, *cluster.workers])
    cluster.wait_workers(workers)
    return cluster


def allow(*roots: Path) -> dict[str, Any]:
    """start_cluster arguments that allow file:// sources under `roots` (master and workers)."""
    return {"extra": {"localSources": {"allowedRoots": [str(r) for r in roots]}}}


def remove_shm_tiers() -> None:
    for shm in Path("/dev/shm").glob(f"strata-it-{os.getpid()}-*"):
        subprocess.run(["rm", "-rf", str(shm)], check=False)


@pytest.fixture
def start_cluster(tmp_path: Path, s3: Any) -> Iterator[Any]:
    """Start a master and N workers; `start_cluster(workers=2, tiers=...)`."""
    clusters: list[Cluster] = []

    def start(workers: int = 2, tiers: list[dict[str, Any]] | None = None, extra: dict[str, Any] | None = None) -> Cluster:
        return launch_cluster(tmp_path / f"cluster-{len(clusters)}", s3, workers, tiers, extra, clusters)

    yield start
    for cluster in clusters:
        cluster.stop()
    remove_shm_tiers()
