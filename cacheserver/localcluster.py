"""`strata local up/down/status`: a master and workers as processes on this machine."""

from __future__ import annotations

import functools
import hashlib
import os
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from strata.contract import constants
from strata.contract.errors import FailedPrecondition, StrataError, Unavailable
from strata.contract.units import parse_size
from . import launcher
from .auth import ROLE_ENV, generate_token, local_token_name
from .cache.tiers import written_blocks_in
from .client import localstate

# How long `local up` waits for the servers to answer /healthz.
STARTUP_TIMEOUT = 60.0
# Ports a local worker takes from --worker-port on: gRPC, HTTP, block data.
WORKER_PORTS = 3
# This machine's owner runs the cluster: file:// mounts may name any folder of it.
LOCAL_SOURCES = {"allowedRoots": ["/"]}


@dataclass(frozen=True)
class LocalClusterSpec:
    workers: int = 1
    mem: str = "1Gi"
    ssd: tuple[str, ...] = ()  # "DIR:SIZE"
    hdd: tuple[str, ...] = ()
    block_size: str = constants.DEFAULT_BLOCK_SIZE_QUANTITY
    master_port: int = constants.MASTER_RPC_PORT
    worker_port: int = constants.WORKER_RPC_PORT
    bind: str = "127.0.0.1"


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on the port now. Like the servers, the check reuses an
    address whose old connections linger in TIME_WAIT (right after `local down`)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _disk_tier(medium: str, values: tuple[str, ...], worker: int) -> dict[str, object] | None:
    if not values:
        return None
    dirs, quota = [], 0
    for value in values:
        folder, sep, size = value.rpartition(":")
        if not sep or not folder:
            raise StrataError(f"--{medium.lower()} {value!r}: write DIR:SIZE, e.g. /mnt/nvme/strata:100Gi")
        quota += parse_size(size, what=f"--{medium.lower()} size")
        dirs.append(str(Path(folder).resolve() / f"worker-{worker}"))
    return {"medium": medium, "quota": quota, "dirs": dirs}


def up(spec: LocalClusterSpec) -> localstate.LocalState:
    if (state := localstate.read_state()) is not None and launcher.http_ok(state.master_http):
        raise FailedPrecondition(f"a local cluster is already running (master {state.master}); stop it with `strata local down`")
    base = localstate.local_dir()
    base.mkdir(parents=True, exist_ok=True)
    ports = [spec.master_port, spec.master_port + 1] + [
        spec.worker_port + WORKER_PORTS * i + k for i in range(spec.workers) for k in range(WORKER_PORTS)
    ]
    busy = [p for p in ports if not port_free(spec.bind, p)]
    if busy:
        raise FailedPrecondition(
            f"ports {busy} on {spec.bind} are in use; stop what holds them (another cluster? `strata local down`) "
            "or choose others with --master-port / --worker-port"
        )
    env = dict(os.environ)
    for role, (value_env, file_env) in ROLE_ENV.items():
        token_file = base / local_token_name(role)
        _keep_or_make_token(token_file)
        env[file_env] = str(token_file)
        env.pop(value_env, None)
    tag = hashlib.sha256(str(base.resolve()).encode()).hexdigest()[:8]
    logs = base / "logs"
    procs: dict[str, launcher.Child] = {}
    master = f"{spec.bind}:{spec.master_port}"
    try:
        master_cfg = base / "master.yaml"
        master_cfg.write_text(yaml.safe_dump({"blockSize": spec.block_size, "masterAddress": master,
                                              "localSources": LOCAL_SOURCES}))
        procs["master"] = launcher.start("master", launcher.strata_argv(
            "master", "--config", str(master_cfg), "--journal-dir", str(base / "journal"),
            "--bind", spec.bind, "--port", str(spec.master_port), "--http-port", str(spec.master_port + 1)),
            logs / "master.log", env=env)
        _wait_healthy([(procs["master"], spec.master_port + 1)])
        worker_http: list[tuple[launcher.Child, int]] = []
        addresses = []
        for i in range(spec.workers):
            name = f"worker-{i}"
            tiers: list[dict[str, object]] = [{"medium": "MEM", "quota": spec.mem, "dirs": [f"/dev/shm/strata-{tag}-{name}"]}] if spec.mem not in ("", "0") else []
            tiers += [t for t in (_disk_tier("SSD", spec.ssd, i), _disk_tier("HDD", spec.hdd, i)) if t]
            cfg = base / f"{name}.yaml"
            cfg.write_text(yaml.safe_dump({"blockSize": spec.block_size, "masterAddress": master, "tiers": tiers,
                                           "localSources": LOCAL_SOURCES}))
            port = spec.worker_port + WORKER_PORTS * i
            worker_env = {**env, "STRATA_WORKER_ID": f"local-{name}", "STRATA_ADVERTISE_HOST": spec.bind}
            procs[name] = launcher.start(name, launcher.strata_argv(
                "worker", "--config", str(cfg), "--data-dir", str(base / name),
                "--bind", spec.bind, "--port", str(port), "--http-port", str(port + 1), "--data-port", str(port + 2)),
                logs / f"{name}.log", env=worker_env)
            worker_http.append((procs[name], port + 1))
            addresses.append(f"{spec.bind}:{port}")
        _wait_healthy(worker_http)
    except BaseException:
        for child in procs.values():
            child.send_signal(signal.SIGTERM)
        raise
    state = localstate.LocalState(
        master=master, master_http=spec.master_port + 1,
        pids={name: p.pid for name, p in procs.items()}, workers=addresses, logs=str(logs),
    )
    localstate.write_state(state)
    return state


def _keep_or_make_token(token_file: Path) -> None:
    """The token in `token_file`: the one an earlier `local up` made, kept (the journal keeps
    the mounts, whose store credentials are sealed with the cluster's token: a new token
    would leave every mount unusable), else a new one."""
    try:
        fd = os.open(token_file, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        pass
    else:
        with os.fdopen(fd) as kept:
            os.fchmod(kept.fileno(), 0o600)
            if kept.read().strip():
                return
    # Created owner-only before the token is written: no moment where others may read it.
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(generate_token())


def _wait_healthy(servers: list[tuple[launcher.Child, int]]) -> None:
    """Until each server answers /healthz on its HTTP port (the servers listen on all the
    cluster's ports by then)."""
    try:
        launcher.wait_ready([(child, functools.partial(launcher.http_ok, port),
                              f"it answers /healthz on port {port}") for child, port in servers], STARTUP_TIMEOUT)
    except launcher.LaunchError as exc:
        raise Unavailable(str(exc)) from None


@dataclass(frozen=True)
class Stopped:
    """What `down` did: the processes it stopped, and the MEM tier folders it left in place
    because they hold written files' only copies (the next `local up` serves them again)."""

    names: list[str]
    kept: list[Path]


def down() -> Stopped:
    """Stop the local cluster and delete its MEM tier folders, except those holding blocks of
    files written into the cache and not in the store yet (MUST_CACHE, pending ASYNC_THROUGH):
    their only copy."""
    state = localstate.read_state()
    if state is None:
        return Stopped([], [])
    signalled = launcher.stop_groups(state.pids.values())
    stopped = [name for name, pid in state.pids.items() if pid in signalled]
    tag = hashlib.sha256(str(localstate.local_dir().resolve()).encode()).hexdigest()[:8]
    kept = []
    for shm in sorted(Path("/dev/shm").glob(f"strata-{tag}-*")):
        if written_blocks_in(shm):
            kept.append(shm)
        else:
            subprocess.run(["rm", "-rf", str(shm)], check=False)
    localstate.clear_state()
    return Stopped(stopped, kept)


def status() -> dict[str, bool] | None:
    state = localstate.read_state()
    if state is None:
        return None
    return {name: launcher.pid_alive(pid) for name, pid in state.pids.items()}
