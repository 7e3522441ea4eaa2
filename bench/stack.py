"""Everything the benchmark runs against, started and stopped as one:

- the store: moto (bench/s3store.py) and the delaying proxy (bench/delayproxy.py), both
  inside the link's network namespace; the proxy listens on the namespace's veth address and
  forwards to moto on the namespace's loopback, so every byte between a reader and the store
  crosses the shaped veth pair and every request waits the proxy's time to first byte;
- Strata: one master and one worker (`workers` of them for the multi-node sharing case, each
  named as on a node of its own) as processes on this host (`python -P -m
  strata.cacheserver master|worker`, as tests/integration/conftest.py starts them), each
  worker's MEM tier in /dev/shm, the bucket mounted at /bench;
- `strata fuse` at a mount point, when this checkout has it: the dataset's mount read-only
  (kernel opens: small files), and again passing large files through to local copies
  (`--passthrough`), as a Mount of small files and one of large files would each be mounted.

Children are started, awaited and stopped by strata.cacheserver.launcher (each in a session of
its own, stopped by process group on close).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from netlab import Link, LinkSettings

from strata.cacheserver import launcher
from strata.cacheserver.launcher import Child, free_port

BENCH = Path(__file__).resolve().parent
TOKEN = "strata-bench-token"
BUCKET = "bench"
MOUNT = "/bench"
# Where the write workload writes through Strata (the datasets' mount is read-only): the
# store's `writes/` folder, writable.
WRITE_MOUNT = "/bench-writes"
NODE = "bench-node"          # the worker's host name: a client that says it is here reads short-circuit
OTHER_HOST = "bench-client"  # a client elsewhere: it reads from the worker's data port (TCP)
DATA_TABLE_BYTES = 2 << 30  # the worker's data table: see Stack._start_worker
STARTUP_TIMEOUT = 90.0
# Bytes of local copies the large-files FUSE mount keeps (`strata fuse --passthrough`): the
# largest workload's files (2 GiB of Parquet) fit.
PASSTHROUGH_ROOM = "3Gi"
# Seconds a server has to end after SIGTERM before SIGKILL (a worker drains its uploads).
STOP_GRACE = 15.0
REGION = "us-east-1"
KEY, SECRET = "bench", "bench-secret"


@dataclass(frozen=True)
class StackSettings:
    rate_mbit: float = 1000.0
    ttfb_ms: float = 20.0
    mem_quota: str = "4Gi"
    ssd_quota: str = ""          # an SSD tier under the run's folder, below MEM ("" = none)
    block_size: str = "16Mi"
    readahead_blocks: int = 2
    workers: int = 1             # more: worker i > 0 on host `{NODE}-{i}` (`Stack.nodes`)
    local_roots: tuple[str, ...] = ()  # folders file:// mounts may read (localSources.allowedRoots)


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
    return result


def spawn(name: str, argv: list[str], log: Path, env: dict[str, str], *, port_line: bool = False) -> tuple[Child, int]:
    """Start argv; with `port_line`, wait for it to print `PORT <n>` and return n."""
    child = launcher.start(name, argv, log, env=env, stdout_pipe=port_line)
    return child, child.read_port(STARTUP_TIMEOUT) if port_line else 0


def wait_healthy(child: Child, http_port: int) -> None:
    launcher.wait_ready([(child, lambda: launcher.http_ok(http_port, timeout=2),
                          f"it answers /healthz on port {http_port}")], STARTUP_TIMEOUT)


@dataclass
class Stack:
    settings: StackSettings
    workdir: Path
    link: Link = field(init=False)
    children: list[Child] = field(default_factory=list)
    endpoint_url: str = ""
    master_address: str = ""
    master_http: int = 0
    master_pid: int = 0
    worker_http: int = 0
    worker_https: list[int] = field(default_factory=list)
    fuse_mountpoint: Path | None = None
    dataset_fuse_mountpoint: Path | None = None  # the dataset's Strata mount alone, read-only
    large_files_fuse_mountpoint: Path | None = None  # the same, passing large files through
    fuse_unavailable: str = ""
    env: dict[str, str] = field(default_factory=dict)

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Stack:
        self.link = Link(LinkSettings(rate_mbit=self.settings.rate_mbit))
        self.link.__enter__()
        try:
            self._start_store()
            self._start_strata()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop_fuse()
        for child in reversed(self.children):
            child.stop(grace=STOP_GRACE)
        self.children.clear()
        self.link.close()
        for shm in Path("/dev/shm").glob(f"strata-bench-{os.getpid()}*"):
            shutil.rmtree(shm, ignore_errors=True)

    @property
    def nodes(self) -> list[str]:
        """The host of each worker: a client that says it is on one reads short-circuit there."""
        return [NODE] + [f"{NODE}-{i}" for i in range(1, self.settings.workers)]

    def _python(self) -> list[str]:
        return [sys.executable, "-P"]

    def _start_store(self) -> None:
        env = {**os.environ, "PYTHONSAFEPATH": "1", "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(8 * 1024 * 1024)}
        logs = self.workdir / "logs"
        moto, moto_port = spawn("moto", [*self.link.exec_prefix, *self._python(), str(BENCH / "s3store.py")],
                                logs / "moto.log", env, port_line=True)
        self.children.append(moto)
        proxy_argv = [*self.link.exec_prefix, *self._python(), str(BENCH / "delayproxy.py"),
                      "--listen", self.link.remote_address, "--target", f"127.0.0.1:{moto_port}",
                      "--ttfb-ms", str(self.settings.ttfb_ms)]
        if self.link.fallback:
            proxy_argv += ["--rate-mbit", str(self.settings.rate_mbit)]
        proxy, proxy_port = spawn("proxy", proxy_argv, logs / "proxy.log", env, port_line=True)
        self.children.append(proxy)
        self.endpoint_url = f"http://{self.link.remote_address}:{proxy_port}"
        self.s3_client().create_bucket(Bucket=BUCKET)

    def _start_strata(self) -> None:
        root = self.workdir / "strata"
        root.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "STRATA_TOKEN": TOKEN, "PYTHONSAFEPATH": "1", "STRATA_LOG_LEVEL": "warning"}
        env.pop("STRATA_MASTER", None)
        self.env = env
        port, http = free_port(), free_port()
        # The master hands the readahead policy to the readers with each file's status.
        (root / "master.yaml").write_text(yaml.safe_dump({"blockSize": self.settings.block_size,
                                                          "cachePolicy": {"readaheadBlocks": self.settings.readahead_blocks},
                                                          **self._local_sources()}))
        master, _ = spawn("master", [*self._python(), "-m", "strata.cacheserver", "master",
                                     "--config", str(root / "master.yaml"), "--journal-dir", str(root / "journal"),
                                     "--bind", "127.0.0.1", "--port", str(port), "--http-port", str(http)],
                          self.workdir / "logs" / "master.log", env)
        self.children.append(master)
        self.master_address = f"127.0.0.1:{port}"
        self.master_http, self.master_pid = http, master.pid
        wait_healthy(master, http)
        for index, node in enumerate(self.nodes):
            self.worker_https.append(self._start_worker(root, env, index, node))
        self.worker_http = self.worker_https[0]
        fs = self.strata_fs()
        wait_until(lambda: len(fs.client.workers(refresh=True)) == self.settings.workers, STARTUP_TIMEOUT,
                   "the workers to register")
        fs.client.close()

    def _local_sources(self) -> dict[str, Any]:
        return {"localSources": {"allowedRoots": list(self.settings.local_roots)}} if self.settings.local_roots else {}

    def _start_worker(self, root: Path, env: dict[str, str], index: int, node: str) -> int:
        """Start worker `index` on host `node`; its HTTP port."""
        suffix = f"-{index}" if index else ""
        wport, http, wdata = free_port(), free_port(), free_port()
        shm = Path(f"/dev/shm/strata-bench-{os.getpid()}{suffix}")
        config = {
            "blockSize": self.settings.block_size,
            "masterAddress": self.master_address,
            "tiers": [{"medium": "MEM", "quota": self.settings.mem_quota, "dirs": [str(shm)]}]
            + ([{"medium": "SSD", "quota": self.settings.ssd_quota, "dirs": [str(root / f"ssd{suffix}")]}]
               if self.settings.ssd_quota else []),
            "cachePolicy": {"readaheadBlocks": self.settings.readahead_blocks},
            **self._local_sources(),
        }
        (root / f"worker{suffix}.yaml").write_text(yaml.safe_dump(config))
        # The node's data table (worker/published.py): room for the training workload's 10,000
        # files of ~100 KiB (node RAM; STRATA_WORKER_DATA_TABLE_BYTES in the bench's environment
        # overrides, 0 turns it off).
        worker_env = {"STRATA_WORKER_DATA_TABLE_BYTES": str(DATA_TABLE_BYTES), **env,
                      "STRATA_WORKER_ID": f"bench-worker{suffix}", "STRATA_HOSTNAME": node,
                      "STRATA_ADVERTISE_HOST": "127.0.0.1"}
        worker, _ = spawn(f"worker{suffix}", [*self._python(), "-m", "strata.cacheserver", "worker",
                                              "--config", str(root / f"worker{suffix}.yaml"),
                                              "--data-dir", str(root / f"worker{suffix}"), "--bind", "127.0.0.1",
                                              "--port", str(wport), "--http-port", str(http), "--data-port", str(wdata)],
                          self.workdir / "logs" / f"worker{suffix}.log", worker_env)
        self.children.append(worker)
        wait_healthy(worker, http)
        return http

    # -- the store ---------------------------------------------------------------------------

    def storage_options(self) -> dict[str, Any]:
        """s3fs options that reach the store through the link."""
        return {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": REGION}}

    def s3_client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name=REGION,
                            aws_access_key_id=KEY, aws_secret_access_key=SECRET)

    def s3fs(self, **kwargs: Any) -> Any:
        """A fresh s3fs instance (no listing or block caches carried over)."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options(), **kwargs)

    # -- Strata ------------------------------------------------------------------------------

    def strata_fs(self, host: str = OTHER_HOST, **kwargs: Any) -> Any:
        from strata.cacheserver.client.fs import StrataFileSystem

        return StrataFileSystem(master=self.master_address, token=TOKEN, host=host, skip_instance_cache=True, **kwargs)

    def mount(self, path: str, source: str, *, sync_interval: float = 300.0, read_only: bool = True) -> None:
        """Mount `source` at `path`: read-only by default, as datasets are mounted (nothing
        writes through it; clients reuse its metadata while the master's answer holds)."""
        from strata.contract.proto import strata_pb2 as pb

        options = pb.MountOptions(options={"endpoint_url": self.endpoint_url, "region": REGION,
                                           "key": KEY, "secret": SECRET},
                                  metadata_sync_interval=sync_interval, read_only=read_only)
        fs = self.strata_fs()
        try:
            fs.client.mount(path, source, options, replace=True)
        finally:
            fs.client.close()

    def unmount(self, path: str) -> None:
        """Unmount `path` if it is mounted (its cached blocks and metadata go with it)."""
        fs = self.strata_fs()
        try:
            if any(m.path == path for m in fs.client.mounts()):
                fs.client.unmount(path)
        finally:
            fs.client.close()

    def worker_counters(self) -> dict[str, float]:
        """The workers' counters from /metrics (hits, misses, ufs_bytes_read, ...), summed."""
        found: dict[str, float] = {}
        for http in self.worker_https:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10) as r:
                text = r.read().decode()
            for m in re.finditer(r"^strata_worker_(\w+?)(?:_total)?\s+([0-9.e+-]+)$", text, re.M):
                found[m.group(1)] = found.get(m.group(1), 0.0) + float(m.group(2))
        return found

    # -- FUSE --------------------------------------------------------------------------------

    def start_fuse(self) -> Path | None:
        """Mount the namespace with `strata fuse`; None (and `fuse_unavailable` says why)
        when this checkout has no FUSE command or it cannot mount."""
        if self.fuse_mountpoint is None:
            self.fuse_mountpoint = self._start_fuse("fuse", [])
        return self.fuse_mountpoint

    def start_dataset_fuse(self, mount: str) -> Path | None:
        """Mount the Strata mount `mount` alone, read-only, as a pod's read-only CSI volume of
        it is mounted; None as start_fuse."""
        if self.dataset_fuse_mountpoint is None:
            self.dataset_fuse_mountpoint = self._start_fuse("fuse-dataset", ["--read-only", "--root", mount])
        return self.dataset_fuse_mountpoint

    def start_large_files_fuse(self, mount: str) -> Path | None:
        """Mount the Strata mount `mount` alone, read-only, passing files of 1 MiB or more through
        to local copies (`--passthrough`, as a Mount of large files would be); None as start_fuse."""
        if self.large_files_fuse_mountpoint is None:
            copies = self.workdir / "fuse-copies"
            self.large_files_fuse_mountpoint = self._start_fuse(
                "fuse-large", ["--read-only", "--root", mount, "--passthrough", f"{copies}:{PASSTHROUGH_ROOM}"])
        return self.large_files_fuse_mountpoint

    def restart_large_files_fuse(self, mount: str) -> Path | None:
        """Mount it anew: no local copy is left (a cold read)."""
        self._stop_fuse("fuse-large", self.large_files_fuse_mountpoint)
        self.large_files_fuse_mountpoint = None
        return self.start_large_files_fuse(mount)

    def _start_fuse(self, name: str, options: list[str]) -> Path | None:
        if self.fuse_unavailable:
            return None
        strata = [*self._python(), "-m", "strata.cacheserver"]
        help_text = subprocess.run([*strata, "fuse", "--help"], capture_output=True, text=True, env=self.env)
        if help_text.returncode != 0:
            self.fuse_unavailable = "not available: `strata fuse` is not in this checkout"
            return None
        if not os.path.exists("/dev/fuse"):
            self.fuse_unavailable = "not available: /dev/fuse is missing"
            return None
        mountpoint = self.workdir / name
        mountpoint.mkdir(parents=True, exist_ok=True)
        # The FUSE process runs on the worker's node, as the CSI node plugin would.
        env = {**self.env, "STRATA_HOSTNAME": NODE}
        child, _ = spawn(name, [*strata, "--master", self.master_address, "--token", TOKEN, "fuse", str(mountpoint),
                                *options], self.workdir / "logs" / f"{name}.log", env)
        try:
            child.wait_ready(lambda: _is_mounted(mountpoint), f"{mountpoint} is mounted", 60)
        except launcher.LaunchError as exc:
            self.fuse_unavailable = f"not available: `strata fuse` did not mount: {exc}"
            return None
        self.children.append(child)
        return mountpoint

    def stop_fuse(self) -> None:
        for name, mountpoint in (("fuse", self.fuse_mountpoint), ("fuse-dataset", self.dataset_fuse_mountpoint),
                                 ("fuse-large", self.large_files_fuse_mountpoint)):
            self._stop_fuse(name, mountpoint)
        self.fuse_mountpoint = self.dataset_fuse_mountpoint = self.large_files_fuse_mountpoint = None

    def _stop_fuse(self, name: str, mountpoint: Path | None) -> None:
        if mountpoint is None:
            return
        for child in [c for c in self.children if c.name == name]:
            child.stop(grace=STOP_GRACE)
            self.children.remove(child)
        if _is_mounted(mountpoint):
            subprocess.run(["fusermount3", "-uz", str(mountpoint)], capture_output=True)


def _is_mounted(path: Path) -> bool:
    target = str(path.resolve())
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f if len(line.split()) > 1)
