"""The `strata` command: servers, a local cluster, mounts, files, reports."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from strata.contract import constants
from strata.contract.errors import InvalidArgument, StrataError
from strata.contract.modes import ReadType, WriteType
from strata.contract.proto import strata_pb2 as pb
from strata.contract.units import format_size, parse_duration, parse_size
from . import localcluster
from .auth import load_credentials
from .client import localstate
from .pendinguploads import oldest_age_seconds, sum_pending

if TYPE_CHECKING:
    from strata.contract.master import MasterClient

log = logging.getLogger("strata")

_T = TypeVar("_T")
# Seconds a `strata fs load` follows its load.
LOAD_TIMEOUT = 24 * 3600


def _setup_logging(level: str, json_logs: bool = False) -> None:
    if json_logs:
        handler = logging.StreamHandler()
        handler.setFormatter(_JsonFormatter())
        logging.basicConfig(level=level.upper(), handlers=[handler])
    else:
        logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
                 "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def _client(args: argparse.Namespace) -> Any:
    from .client.core import StrataClient

    return StrataClient(master=args.master, token=args.token)


def _ask_master(args: argparse.Namespace, ask: Callable[[MasterClient], Awaitable[_T]]) -> _T:
    """What `ask` gets from the master (the shared asyncio client, each call within
    STRATA_CLIENT_MASTER_TIMEOUT): the commands that manage mounts and the cache."""
    from strata.contract.master import MasterClient

    from .client.links import resolve_master, resolve_token
    from .client.settings import ClientSettings

    async def run() -> _T:
        async with MasterClient(resolve_master(args.master), resolve_token(args.token),
                                timeout=ClientSettings().master_timeout) as master:
            return await ask(master)

    return asyncio.run(run())


def _about(master: MasterClient, what: str) -> str:
    """`what` as an error names it: the call and the master."""
    return f"{what} (master {master.address})"


# -- servers -------------------------------------------------------------------------------

def cmd_master(args: argparse.Namespace) -> int:
    from .settings import load_server_config
    from .master.server import run_master

    config = load_server_config(args.config)
    credentials = load_credentials()
    journal = args.journal_dir
    asyncio.run(run_master(config, journal_dir=journal, credentials=credentials, bind=args.bind, port=args.port, http_port=args.http_port))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from .settings import load_server_config
    from .worker.server import run_worker

    config = load_server_config(args.config)
    if args.master_address:
        config = config.model_copy(update={"master_address": args.master_address})
    credentials = load_credentials()
    asyncio.run(run_worker(config, data_dir=args.data_dir, credentials=credentials, bind=args.bind, port=args.port, http_port=args.http_port,
                           data_port=args.data_port))
    return 0


def cmd_fuse(args: argparse.Namespace) -> int:
    from .fuse.daemon import FuseOptions, run_fuse
    from .fuse.settings import fuse_environment

    options = FuseOptions(
        mountpoint=Path(args.mountpoint), root=args.root, read_only=args.read_only, allow_other=args.allow_other,
        write_type=args.write_type or "", attr_timeout=args.attr_timeout, readahead=args.readahead,
        spool_dir=args.spool_dir, readers=args.readers, max_nodes=args.max_nodes, resume_timeout=fuse_environment().resume_timeout if args.resume_timeout is None else args.resume_timeout,
        passthrough=args.passthrough or "",
    )
    return run_fuse(options, master=args.master, token=args.token)


def cmd_fuse_holder(args: argparse.Namespace) -> int:
    from .fuse.keeperhost import run_holder

    return run_holder(args.socket)


def cmd_csi(args: argparse.Namespace) -> int:
    from .csi.server import run_csi

    return run_csi(endpoint=args.endpoint, node_id=args.node_id, state_dir=args.state_dir, kubeconfig=args.kubeconfig,
                   passthrough=args.passthrough or "",
                   tokens_secret=args.tokens_secret)


# -- local cluster -------------------------------------------------------------------------

def cmd_local_up(args: argparse.Namespace) -> int:
    spec = localcluster.LocalClusterSpec(
        workers=args.workers, mem=args.mem, ssd=tuple(args.ssd or ()), hdd=tuple(args.hdd or ()),
        block_size=args.block_size, master_port=args.master_port, worker_port=args.worker_port,
    )
    state = localcluster.up(spec)
    print(f"Strata is up: master {state.master}, {len(state.workers)} worker(s) {' '.join(state.workers)}")
    print(f"logs: {state.logs}")
    print("next: strata mount add /data s3://bucket/prefix --option endpoint_url=...; strata fs ls /")
    return 0


def cmd_local_down(args: argparse.Namespace) -> int:
    stopped = localcluster.down()
    print(f"stopped {', '.join(stopped.names)}" if stopped.names else "no local cluster is running")
    for folder in stopped.kept:
        print(f"kept {folder}: it holds files written into the cache and not in the store yet (their only copy); "
              "`strata local up` serves them again")
    return 0


def cmd_local_status(args: argparse.Namespace) -> int:
    status = localcluster.status()
    if status is None:
        print("no local cluster (start one with `strata local up`)")
        return 1
    state = localstate.read_state()
    assert state is not None
    print(f"master {state.master}")
    for name, alive in status.items():
        print(f"  {name:<10} {'running' if alive else 'STOPPED'}")
    return 0 if all(status.values()) else 1


# -- mounts --------------------------------------------------------------------------------

def _pairs(values: Sequence[str] | None, what: str, *, secret: bool = False) -> dict[str, str]:
    """KEY=VALUE arguments as a dict; a malformed one is named, unless `secret` (it may be a
    credential given without its key)."""
    result = {}
    for number, value in enumerate(values or (), 1):
        key, sep, val = value.partition("=")
        if not sep or not key:
            shown = f"number {number} (not shown: it may be secret)" if secret else repr(value)
            raise InvalidArgument(f"{what} {shown}: write KEY=VALUE")
        result[key] = val
    return result


def cmd_mount_add(args: argparse.Namespace) -> int:
    options = pb.MountOptions(
        options=_pairs(args.option, "--option"),
        credentials=_pairs(args.credential, "--credential", secret=True),
        read_only=args.read_only,
        metadata_sync_interval=parse_duration(args.sync_interval, what="--sync-interval"),
        read_type=ReadType.proto_of(args.read_type),
        write_type=WriteType.proto_of(args.write_type),
        pin=args.pin,
        ttl_seconds=parse_duration(args.ttl, what="--ttl") if args.ttl else 0,
        stale_if_error=args.stale_if_error,
    )
    request = pb.MountRequest(path=args.path, source=args.source, options=options, replace=args.replace, check=True)
    answer = _ask_master(args, lambda m: m.mount(request, what=_about(m, f"mount {args.path}")))
    print(f"mounted {answer.mount.path} -> {answer.mount.source}")
    return 0


def cmd_mount_rm(args: argparse.Namespace) -> int:
    _ask_master(args, lambda m: m.unmount(args.path, free=not args.keep_cache, what=_about(m, f"unmount {args.path}")))
    print(f"unmounted {args.path}")
    return 0


def cmd_mount_ls(args: argparse.Namespace) -> int:
    mounts = _ask_master(args, lambda m: m.list_mounts(what=_about(m, "listing mounts")))
    if args.json:
        print(json.dumps([{"path": m.path, "source": m.source, "readOnly": m.options.read_only,
                           **({"unusable": m.unusable} if m.unusable else {})} for m in mounts], indent=2))
        return 0
    rows = [("PATH", "SOURCE", "MODE")] + [
        (m.path, m.source, "UNUSABLE" if m.unusable else "ro" if m.options.read_only else "rw") for m in mounts]
    _table(rows)
    _unusable(mounts)
    return 0


def _unusable(mounts: Sequence[pb.MountInfo]) -> None:
    """Why each unusable mount cannot be used, after a table that lists it."""
    for m in mounts:
        if m.unusable:
            print(f"\n{m.path}: {m.unusable}")


# -- files ---------------------------------------------------------------------------------

def _table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())


def _file_row(f: pb.FileInfo) -> tuple[str, ...]:
    if f.is_dir:
        return ("d", "-", "-", f.path)
    cached = f"{100 * f.cached_bytes // f.length if f.length else 100}%"
    return ("-", format_size(f.length), cached, f.path + ("" if f.persisted else "  (not persisted)"))


def cmd_fs_ls(args: argparse.Namespace) -> int:
    client = _client(args)
    info = client.stat(args.path)
    files = [info] if not info.is_dir else client.ls(args.path, recursive=args.recursive)
    if args.json:
        print(json.dumps([_file_json(f) for f in files], indent=2))
        return 0
    _table([("T", "SIZE", "CACHED", "PATH")] + [_file_row(f) for f in files])
    return 0


def _file_json(f: pb.FileInfo) -> dict[str, Any]:
    return {"path": f.path, "type": "directory" if f.is_dir else "file", "size": f.length,
            "mtime": f.mtime_unix_ms, "version": f.version, "persisted": f.persisted,
            "cachedBytes": f.cached_bytes, "pinned": f.pinned, "blockSize": f.block_size}


def cmd_fs_stat(args: argparse.Namespace) -> int:
    client = _client(args)
    info = client.stat(args.path)
    data = _file_json(info)
    if not info.is_dir:
        locations = client.block_locations(args.path)
        data["blocks"] = [{"index": b.index, "offset": b.offset, "length": b.length, "hosts": list(b.hosts)} for b in locations.blocks]
    print(json.dumps(data, indent=2))
    return 0


def cmd_fs_cat(args: argparse.Namespace) -> int:
    from .client.fs import StrataFileSystem

    fs = StrataFileSystem(master=args.master, token=args.token, skip_instance_cache=True)
    out = sys.stdout.buffer
    with fs.open(args.path, "rb") as f:
        while chunk := f.read(4 * 1024 * 1024):
            out.write(chunk)
    out.flush()
    return 0


def cmd_fs_put(args: argparse.Namespace) -> int:
    client = _client(args)
    source = sys.stdin.buffer if args.local == "-" else open(args.local, "rb")  # noqa: SIM115
    with source:
        chunks = iter(lambda: source.read(constants.STREAM_CHUNK_SIZE), b"")
        info = client.write_file(args.path, chunks, write_type=WriteType.proto_of(args.write_type),
                                 overwrite=not args.no_overwrite)
    print(f"wrote {info.path} ({format_size(info.length)}, {'persisted' if info.persisted else 'cached, not persisted yet'})")
    return 0


def cmd_fs_rm(args: argparse.Namespace) -> int:
    _client(args).rm(args.path, recursive=args.recursive)
    return 0


def cmd_fs_load(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    bar: Any = None

    async def follow(master: MasterClient) -> pb.LoadProgress | None:
        nonlocal bar
        last = None
        bandwidth = parse_size(args.bandwidth, what="--bandwidth") if args.bandwidth else 0
        async for progress in master.load(args.path, bandwidth=bandwidth, refresh=args.refresh, timeout=LOAD_TIMEOUT,
                                          what=f"load {args.path}"):
            last = progress
            if bar is None and progress.bytes_total:
                bar = tqdm(total=progress.bytes_total, unit="B", unit_scale=True, unit_divisor=1024,
                           desc=f"load {args.path}", disable=args.quiet)
            if bar is not None:
                bar.update(progress.bytes_loaded - bar.n)
        return last

    last = _ask_master(args, follow)
    if bar is not None:
        bar.close()
    if last is not None:
        print(f"loaded {last.files_loaded}/{last.files_total} files, {format_size(last.bytes_loaded)}")
    return 0


def cmd_fs_free(args: argparse.Namespace) -> int:
    freed = _ask_master(args, lambda m: m.free(args.path, what=_about(m, f"free {args.path}")))
    print(f"freed {format_size(freed)}")
    return 0


def cmd_fs_pin(args: argparse.Namespace) -> int:
    _ask_master(args, lambda m: m.set_pinned(args.path, True, what=_about(m, f"pin {args.path}")))
    print(f"pinned {args.path}")
    return 0


def cmd_fs_unpin(args: argparse.Namespace) -> int:
    _ask_master(args, lambda m: m.set_pinned(args.path, False, what=_about(m, f"pin {args.path}")))
    print(f"unpinned {args.path}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    report = _ask_master(args, lambda m: m.report(what=_about(m, "report")))
    total = report.hits + report.misses
    ratio = report.hits / total if total else 0.0
    if args.json:
        from google.protobuf.json_format import MessageToDict

        print(json.dumps(MessageToDict(report), indent=2))
        return 0
    print(f"capacity {format_size(report.capacity)}  used {format_size(report.used)}  "
          f"hit ratio {ratio:.2%} ({report.hits} hits, {report.misses} misses)")
    print(f"pending uploads {_pending(report.pending_uploads)}")
    rows: list[tuple[str, ...]] = [("WORKER", "HOST", "STATE", "TIER", "USED", "CAPACITY", "BLOCKS", "HITS", "MISSES",
                                    "PENDING UPLOADS")]
    for w in report.workers:
        state = "live" if w.live else "lost"
        if w.worker.decommissioning:
            state += ",leaving"
        for i, t in enumerate(w.stats.tiers or [pb.TierStats()]):
            rows.append((w.worker.worker_id if i == 0 else "", w.worker.host if i == 0 else "", state if i == 0 else "",
                         t.medium, format_size(t.used), format_size(t.capacity), str(t.blocks),
                         str(w.stats.hits) if i == 0 else "", str(w.stats.misses) if i == 0 else "",
                         _pending(sum_pending(w.stats.pending_uploads)) if i == 0 else ""))
    _table(rows)
    if report.mounts:
        print()
        mrows = [("MOUNT", "SOURCE", "CACHED", "STORE", "PENDING UPLOADS")]
        for m in report.mounts:
            unknown = m.ufs_totals_age_ms < 0 or not (m.ufs_files or m.ufs_totals_age_ms)  # or from an older master
            store = "-" if unknown else (
                f"{format_size(m.ufs_total_bytes)} in {m.ufs_files} files, {m.ufs_totals_age_ms // 1000}s ago")
            mrows.append((m.mount.path, m.mount.source, format_size(m.cached_bytes), store, _pending(m.pending_uploads)))
        _table(mrows)
        _unusable([m.mount for m in report.mounts])
    return 0


def _pending(pending: pb.PendingUploads) -> str:
    """Pending ASYNC_THROUGH uploads as `strata report` shows them."""
    if not pending.count:
        return "0"
    return (f"{pending.count} ({format_size(pending.bytes)}, oldest {oldest_age_seconds(pending):.0f}s)")


# -- parser --------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="strata", description="Strata: a tiered data cache for Kubernetes.")
    parser.add_argument("--master", default=None, help="master HOST:PORT (default: STRATA_MASTER, else the local cluster)")
    parser.add_argument("--token", default=None, help="cluster token (default: STRATA_TOKEN / STRATA_TOKEN_FILE (admin), then "
                        "STRATA_DATA_TOKEN / STRATA_DATA_TOKEN_FILE (data), then the local cluster's)")
    parser.add_argument("--log-level", default=os.environ.get("STRATA_LOG_LEVEL", "info"))
    parser.add_argument("--log-json", action="store_true", default=os.environ.get("STRATA_LOG_JSON") == "1",
                        help="log one JSON object per line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(parent: Any, name: str, fn: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = parent.add_parser(name, help=help, description=help)
        p.set_defaults(fn=fn)
        return p

    p = add(sub, "master", cmd_master, "run the master")
    p.add_argument("--config", type=Path, default=None, help="strata.yaml")
    p.add_argument("--journal-dir", type=Path, default=None, help="where the mount table is kept across restarts")
    p.add_argument("--bind", default="0.0.0.0")
    p.add_argument("--port", type=int, default=constants.MASTER_RPC_PORT)
    p.add_argument("--http-port", type=int, default=constants.MASTER_HTTP_PORT)

    p = add(sub, "worker", cmd_worker, "run a worker")
    p.add_argument("--config", type=Path, default=None, help="strata.yaml")
    p.add_argument("--data-dir", type=Path, default=Path("/var/lib/strata"))
    p.add_argument("--master-address", default=None, help="override masterAddress of the config")
    p.add_argument("--bind", default="0.0.0.0")
    p.add_argument("--port", type=int, default=constants.WORKER_RPC_PORT)
    p.add_argument("--http-port", type=int, default=constants.WORKER_HTTP_PORT)
    p.add_argument("--data-port", type=int, default=constants.WORKER_DATA_PORT, help="block bytes over TCP")

    p = add(sub, "fuse", cmd_fuse, "mount the namespace (or a subtree) as POSIX files; runs until unmounted or SIGTERM")
    p.add_argument("mountpoint", help="an existing directory")
    p.add_argument("--root", default="/", help="namespace path to show at the mount point (default /)")
    p.add_argument("--read-only", action="store_true", help="refuse every change (EROFS)")
    p.add_argument("--allow-other", action="store_true", help="let other users in (needs user_allow_other in "
                   "/etc/fuse.conf unless root)")
    p.add_argument("--write-type", choices=list(WriteType),
                   help="write type of files written (default: the Strata mount's)")
    p.add_argument("--attr-timeout", type=float, default=None, metavar="SECONDS",
                   help="how long metadata is reused (default: the mounts' metadata sync interval, at most 60)")
    p.add_argument("--readahead", type=int, default=None, metavar="BLOCKS",
                   help="blocks fetched ahead of sequential readers (default: the cluster's cachePolicy.readaheadBlocks)")
    p.add_argument("--spool-dir", default=None, help="where files being written are buffered (default: the temp dir)")
    p.add_argument("--readers", type=int, default=None, metavar="N",
                   help="files of a read-only mount kept ready to read, at most (bounds this process's memory "
                   "however many files are open; default 256)")
    p.add_argument("--max-nodes", type=int, default=None, metavar="N",
                   help="files and folders the kernel is let hold, and file statuses remembered, at most: past "
                   "it the kernel is asked to drop the least recently looked-up ones (bounds this process's "
                   "memory however many files are seen, ~2 KiB each; default 100,000)")
    p.add_argument("--resume-timeout", type=float, default=None, metavar="SECONDS",
                   help="if this process dies, how long readers wait for `strata fuse` to be run again on the "
                   "mount point before they get an error and the mount ends (default: STRATA_FUSE_RESUME_TIMEOUT "
                   "or 60)")
    p.add_argument("--passthrough", default=None, metavar="DIR:SIZE",
                   help="with --read-only: the kernel reads files of 1 MiB or more itself (FUSE passthrough, "
                   "Linux 6.9+, as root) from whole local copies kept in DIR, SIZE bytes at most, made from "
                   "the checked bytes of a file's first read: large files read at a local file's speed. "
                   "Opens are answered, so small files open slower than without it")

    p = add(sub, "fuse-holder", cmd_fuse_holder, "start and reap the keepers of the FUSE mounts of `strata fuse` "
            "processes run with STRATA_FUSE_HOLDER (a node's CSI volumes); runs until SIGTERM")
    p.add_argument("--socket", type=Path, default=None,
                   help="where to listen (default: holder.sock in STRATA_FUSE_STATE_DIR, /run/strata/fuse as root)")

    p = add(sub, "csi", cmd_csi, "run the CSI plugin (identity, node and controller services) of driver csi.strata.dev")
    p.add_argument("--endpoint", default=os.environ.get("CSI_ENDPOINT", "unix:///csi/csi.sock"),
                   help="unix:///path/to/csi.sock (default: CSI_ENDPOINT)")
    p.add_argument("--node-id", default=os.environ.get("STRATA_NODE_NAME") or os.environ.get("NODE_NAME"),
                   help="this node's name (default: STRATA_NODE_NAME)")
    p.add_argument("--state-dir", type=Path, default=None,
                   help="where published volumes are recorded (default: volumes/ next to the socket)")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig for reading Mounts (default: in-cluster, "
                   "else KUBECONFIG / ~/.kube/config)")
    p.add_argument("--tokens-secret", default="", metavar="NAMESPACE/NAME",
                   help="the Secret where the operator keeps every cluster's data token for volumes")
    p.add_argument("--passthrough", default=None, metavar="DIR:SIZE",
                   help="read-only volumes with the attribute passthrough: \"true\" keep whole local copies of "
                   "their files of 1 MiB or more in DIR, SIZE bytes at most each, which the kernel reads itself "
                   "(`strata fuse --passthrough`); without it they read through the page cache")

    local = sub.add_parser("local", help="a Strata cluster on this machine").add_subparsers(dest="local", required=True, metavar="ACTION")
    p = add(local, "up", cmd_local_up, "start a master and workers on this machine")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--mem", default="1Gi", help="MEM tier quota per worker (0: none)")
    p.add_argument("--ssd", action="append", metavar="DIR:SIZE", help="SSD tier directory and quota")
    p.add_argument("--hdd", action="append", metavar="DIR:SIZE", help="HDD tier directory and quota")
    p.add_argument("--block-size", default=constants.DEFAULT_BLOCK_SIZE_QUANTITY)
    p.add_argument("--master-port", type=int, default=constants.MASTER_RPC_PORT)
    p.add_argument("--worker-port", type=int, default=constants.WORKER_RPC_PORT)
    add(local, "down", cmd_local_down, "stop the local cluster")
    add(local, "status", cmd_local_status, "show the local cluster's processes")

    mount = sub.add_parser("mount", help="the mount table").add_subparsers(dest="mount", required=True, metavar="ACTION")
    p = add(mount, "add", cmd_mount_add, "mount a store URL at a namespace path")
    p.add_argument("path")
    p.add_argument("source", help="fsspec URL: s3://bucket/prefix, file:///dir, gcs://..., memory://...")
    p.add_argument("--option", "-o", action="append", metavar="KEY=VALUE", help="storage option (endpoint_url, region, ...)")
    p.add_argument("--credential", "-c", action="append", metavar="KEY=VALUE", help="secret storage option (key, secret)")
    p.add_argument("--read-only", action="store_true")
    p.add_argument("--sync-interval", default="30s", help="metadata sync interval: 0s = every access, -1 = never")
    p.add_argument("--stale-if-error", action=argparse.BooleanOptionalAction, default=True,
                   help="when the store cannot be reached, answer from older metadata (default: on)")
    p.add_argument("--read-type", choices=list(ReadType))
    p.add_argument("--write-type", choices=list(WriteType))
    p.add_argument("--pin", action="store_true")
    p.add_argument("--ttl", default="", help="free cached blocks unused this long, e.g. 24h")
    p.add_argument("--replace", action="store_true", help="replace an existing mount at PATH")
    p = add(mount, "rm", cmd_mount_rm, "unmount a path (frees its cached blocks)")
    p.add_argument("path")
    p.add_argument("--keep-cache", action="store_true")
    p = add(mount, "ls", cmd_mount_ls, "list mounts")
    p.add_argument("--json", action="store_true")

    fs = sub.add_parser("fs", help="files in the namespace").add_subparsers(dest="fs", required=True, metavar="ACTION")
    p = add(fs, "ls", cmd_fs_ls, "list a directory")
    p.add_argument("path", nargs="?", default="/")
    p.add_argument("-R", "--recursive", action="store_true")
    p.add_argument("--json", action="store_true")
    add(fs, "stat", cmd_fs_stat, "show a file's metadata and block locations").add_argument("path")
    add(fs, "cat", cmd_fs_cat, "write a file to stdout").add_argument("path")
    p = add(fs, "put", cmd_fs_put, "write a local file (or - for stdin) to PATH")
    p.add_argument("local")
    p.add_argument("path")
    p.add_argument("--write-type", choices=list(WriteType))
    p.add_argument("--no-overwrite", action="store_true")
    p = add(fs, "rm", cmd_fs_rm, "remove a file (or a directory with -r)")
    p.add_argument("path")
    p.add_argument("-r", "--recursive", action="store_true")
    p = add(fs, "load", cmd_fs_load, "load a file or directory into the cache")
    p.add_argument("path")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("--bandwidth", help="bytes a second the load may fetch, all workers together (e.g. 50Mi)")
    p.add_argument("--refresh", action="store_true", help="ask the store again first: changed objects load anew")
    add(fs, "free", cmd_fs_free, "free a path's cached blocks").add_argument("path")
    add(fs, "pin", cmd_fs_pin, "never evict a path's blocks").add_argument("path")
    add(fs, "unpin", cmd_fs_unpin, "let a path's blocks be evicted again").add_argument("path")

    p = add(sub, "report", cmd_report, "capacity, use and hit ratio per worker and tier")
    p.add_argument("--json", action="store_true")

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.log_level, args.log_json)
    try:
        return int(args.fn(args))
    except StrataError as exc:
        print(f"strata: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
