"""Run the Strata benchmarks (issue 6): `.venv/bin/python -P bench/run.py [--quick]`.

Starts the slow store (moto behind a shaped veth pair and a delaying proxy), a Strata master
and worker, and FUSE where available; makes the data (kept between runs in --workdir);
runs the workloads; writes bench/results/<name>.{json,md,png} and, for a full run, the
results section of bench/README.md. Everything started is stopped on exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
# Every contestant reads in this one process: the memory pyarrow frees stays with it (set
# before pyarrow loads). Left to itself, pyarrow's allocator (mimalloc) hands freed pages back
# within milliseconds, and whichever contestant reads after one that freed them pays for fresh
# ones (huge pages zeroed, 0.2-0.4 s a GiB): an effect of the order of the contestants, not of a
# read path.
os.environ.setdefault("MIMALLOC_PURGE_DELAY", "-1")

import datasets  # noqa: E402
import manyfiles  # noqa: E402
import report  # noqa: E402
from contestants import build  # noqa: E402
from stack import BUCKET, MOUNT, NODE, OTHER_HOST, TOKEN, WRITE_MOUNT, Stack, StackSettings  # noqa: E402
from results import Workload  # noqa: E402
from workloads import Runner  # noqa: E402

META_MOUNT = "/bench-meta"
WORKLOADS = ("aggregate", "linecount", "write", "sharing", "metadata", "training", "spill", "readers", "manyfiles")

QUICK: dict[str, str | int] = {"agg": "64Mi,128Mi", "text": "128Mi", "write": "64Mi", "share": "64Mi", "files": 1000,
                               "train": 2000, "spill_mem": "128Mi", "readers": "32Mi", "many": 2000, "many_stats": 1000,
                               "reps": 3}
FULL: dict[str, str | int] = {"agg": "256Mi,1Gi", "text": "1Gi", "write": "256Mi", "share": "256Mi", "files": 10000,
                              "train": 100000, "spill_mem": "1Gi", "readers": "256Mi", "many": 100000,
                              "many_stats": 20000, "reps": 7}
# The spill workload's own stack: MEM as given, an SSD tier this many times larger, and a
# dataset twice the MEM tier.
SPILL_SSD_FACTOR = 4
# The sharing workload's multi-node case: workers on as many (named) nodes, the dataset
# preloaded across them, readers on every one of those nodes.
SHARING_WORKERS = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Strata benchmarks against s3fs, fsspec caches and the machine's limits")
    p.add_argument("--quick", action="store_true", help="small sizes, 3 repetitions (a few minutes)")
    p.add_argument("--name", help="results name (default: quick or full)")
    p.add_argument("--reps", type=int, help="repetitions (default 7, quick 3)")
    p.add_argument("--only", default=",".join(WORKLOADS), help=f"comma-separated subset of {','.join(WORKLOADS)}")
    p.add_argument("--contestants", help="comma-separated contestant ids to run (default: all), e.g. s3fs,strata-fuse")
    p.add_argument("--agg-sizes", help="aggregation dataset sizes, e.g. 256Mi,1Gi,4Gi")
    p.add_argument("--text-size", help="line-count file size")
    p.add_argument("--write-size", help="size of the dataset written per write type")
    p.add_argument("--share-size", help="dataset the sharing workload reads")
    p.add_argument("--big-cold-reps", type=int, default=3,
                   help="cold repetitions for datasets of 1 GiB or more (default 3; warm keeps --reps)")
    p.add_argument("--files", type=int, help="small files for the metadata workload")
    p.add_argument("--train-files", type=int, help="files of ~100 KiB for the training workload (default 100000, quick 2000)")
    p.add_argument("--spill-mem", help="MEM tier of the spill workload's own worker; its dataset is twice that "
                                       "(default 1Gi, quick 128Mi)")
    p.add_argument("--readers-size", help="file the many-readers workload reads (default 256Mi, quick 32Mi)")
    p.add_argument("--many-files", type=int, help="files of 1 KiB in the many-files workload's file:// store (default "
                                                   "100000, quick 2000; issue 27's targets are set at 1000000)")
    p.add_argument("--many-stat-files", type=int, help="of them, files stat'ed by the many-files workload's 4 processes "
                                                        "(default 20000, quick 1000)")
    p.add_argument("--rate-mbit", type=float, default=1000.0, help="store link bandwidth, Mbit/s (default 1000)")
    p.add_argument("--ttfb-ms", type=float, default=20.0, help="time to first byte added per store request (default 20)")
    p.add_argument("--mem", default="4Gi", help="the Strata worker's MEM tier quota (default 4Gi)")
    p.add_argument("--workdir", type=Path, default=BENCH / ".scratch", help="data, caches and logs (default bench/.scratch)")
    p.add_argument("--out", type=Path, default=BENCH / "results")
    p.add_argument("--no-readme", action="store_true", help="do not update bench/README.md's results section")
    return p.parse_args(argv)


def parse_sizes(text: str) -> list[int]:
    from strata.contract.units import parse_size

    return [parse_size(part, what="benchmark size") for part in text.split(",") if part.strip()]


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def link_check(stack: Stack, dataset: datasets.Dataset) -> str:
    """Time to first byte of a 1-byte GET and the speed of one plain GET of a dataset file."""
    client = stack.s3_client()
    key = dataset.files[0]
    ttfb = []
    for _ in range(5):
        start = time.perf_counter()
        client.get_object(Bucket=BUCKET, Key=key, Range="bytes=0-0")["Body"].read()
        ttfb.append(time.perf_counter() - start)
    start = time.perf_counter()
    size = len(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    seconds = time.perf_counter() - start
    return (f"1-byte GET median {statistics.median(ttfb) * 1000:.1f} ms; one GET of {size / 2**20:.0f} MiB "
            f"{size / seconds / 1e6:.0f} MB/s (boto3)")


def on_stack(settings: StackSettings, args: argparse.Namespace, local: Path, reps: int,
             needed: list[datasets.Dataset], meta: datasets.Dataset | None,
             workloads: Callable[[Runner], list[Workload]]) -> tuple[str, dict[str, Any], list[Workload]]:
    """Start a stack with these settings, put the datasets in its store, mount the bucket and
    run `workloads`; returns the link check, the link's description and what was measured."""
    with Stack(settings, args.workdir / "run") as stack:
        log(f"store at {stack.endpoint_url} ({stack.link.describe()['mode']}); Strata master {stack.master_address}; "
            f"MEM {settings.mem_quota}{f', SSD {settings.ssd_quota}' if settings.ssd_quota else ''}")
        s3 = stack.s3fs()
        for d in needed:
            log(f"uploading {d.name} ({d.bytes / 2**20:.0f} MiB, {len(d.files)} files)")
            datasets.upload(d, local, s3, BUCKET)
        checked = link_check(stack, needed[0])
        log(f"link check: {checked}")
        stack.mount(MOUNT, f"s3://{BUCKET}")
        stack.mount(WRITE_MOUNT, f"s3://{BUCKET}/writes", read_only=False)
        if meta is not None:
            stack.mount(META_MOUNT, f"s3://{BUCKET}/{meta.name}")
        contestants = build(stack, local, args.workdir / "run", bucket=BUCKET, mount=MOUNT, node=NODE,
                            other_host=OTHER_HOST, token=TOKEN)
        if args.contestants:
            chosen = {c.strip() for c in args.contestants.split(",") if c.strip()}
            unknown_ids = chosen - {c.id for c in contestants}
            if unknown_ids:
                raise SystemExit(f"--contestants: unknown {sorted(unknown_ids)}; choose from "
                                 f"{','.join(c.id for c in contestants)}")
            contestants = [c for c in contestants if c.id in chosen]
        for c in contestants:
            if c.unavailable:
                log(f"{c.id}: {c.unavailable}")
        runner = Runner(stack, contestants, local, reps, BUCKET, MOUNT, log=log, big_cold_reps=args.big_cold_reps,
                        scratch=args.workdir / "run")
        try:
            return checked, stack.link.describe(), workloads(runner)
        finally:
            for c in contestants:
                c.close()
            runner.between_workloads()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    preset = QUICK if args.quick else FULL
    name = args.name or ("quick" if args.quick else "full")
    reps = args.reps or int(preset["reps"])
    only = {w.strip() for w in args.only.split(",") if w.strip()}
    unknown = only - set(WORKLOADS)
    if unknown:
        raise SystemExit(f"--only: unknown workloads {sorted(unknown)}; choose from {','.join(WORKLOADS)}")
    agg_sizes = parse_sizes(args.agg_sizes or str(preset["agg"]))
    text_size, = parse_sizes(args.text_size or str(preset["text"]))
    write_size, = parse_sizes(args.write_size or str(preset["write"]))
    share_size, = parse_sizes(args.share_size or str(preset["share"]))
    files = args.files or int(preset["files"])
    train_files = args.train_files or int(preset["train"])
    spill_mem, = parse_sizes(args.spill_mem or str(preset["spill_mem"]))
    readers_size, = parse_sizes(args.readers_size or str(preset["readers"]))
    many_files = args.many_files or int(preset["many"])
    many_stat_files = min(many_files, args.many_stat_files or int(preset["many_stats"]))
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)

    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.monotonic()
    load_start = os.getloadavg()[0]
    local = args.workdir / "data"
    settings = StackSettings(rate_mbit=args.rate_mbit, ttfb_ms=args.ttfb_ms, mem_quota=args.mem)
    checked, network = "", {}
    workloads: list[Workload] = []
    if only - {"manyfiles"}:  # the many-files workload makes its own tree: none of these
        log("making the data (reused from earlier runs when the sizes match)")
        agg = [datasets.parquet_dataset(local, f"agg-{datasets.size_label(s)}", s) for s in agg_sizes]
        text = datasets.text_dataset(local, f"text-{datasets.size_label(text_size)}", text_size)
        write = datasets.parquet_dataset(local, f"write-{datasets.size_label(write_size)}", write_size, seed=3)
        share = next((d for d in agg if d.bytes == share_size), None) or datasets.parquet_dataset(
            local, f"agg-{datasets.size_label(share_size)}", share_size)
        meta = datasets.small_files_dataset(local, f"meta-{files}", files)

        train = datasets.training_dataset(local, f"train-{train_files}", train_files) if "training" in only else None
        spill = (datasets.parquet_dataset(local, f"agg-{datasets.size_label(2 * spill_mem)}", 2 * spill_mem)
                 if "spill" in only else None)
        readers = (datasets.text_dataset(local, f"text-{datasets.size_label(readers_size)}", readers_size)
                   if "readers" in only else None)

        wanted = {"aggregate": agg, "linecount": [text], "sharing": [share], "metadata": [meta],
                  "training": [train], "readers": [readers]}
        needed = {agg[0].name: agg[0]}  # the link check reads it
        needed.update({d.name: d for w, ds in wanted.items() if w in only for d in ds if d is not None})

        def main_workloads(runner: Runner) -> list[Workload]:
            steps: list[Callable[[], Workload]] = []
            if "aggregate" in only:
                steps += [functools.partial(runner.aggregation, d) for d in agg]
            if "linecount" in only:
                steps.append(lambda: runner.line_count(text))
            if "write" in only:
                steps.append(lambda: runner.writes(write))
            if "sharing" in only:
                steps.append(lambda: runner.sharing(share))
            if "metadata" in only:
                steps.append(lambda: runner.metadata(meta, META_MOUNT))
            if train is not None:
                steps.append(lambda: runner.training(train))
            if readers is not None:
                steps.append(lambda: runner.many_readers(readers))
            found = []
            for step in steps:
                found.append(step())
                runner.between_workloads()
            return found

        if only - {"spill", "manyfiles"}:
            checked, network, found = on_stack(settings, args, local, reps, list(needed.values()), meta, main_workloads)
            workloads += found
        if "sharing" in only:  # its multi-node case: a stack of SHARING_WORKERS workers
            nodes_settings = replace(settings, workers=SHARING_WORKERS)
            checked_nodes, network, found = on_stack(nodes_settings, args, local, reps, [share], None,
                                                     lambda runner: [runner.sharing_nodes(share)])
            checked = checked or checked_nodes
            workloads += found
        if spill is not None:
            spill_settings = replace(settings, mem_quota=str(spill_mem), ssd_quota=str(SPILL_SSD_FACTOR * spill_mem))
            checked_spill, network, found = on_stack(spill_settings, args, local, reps, [spill], None,
                                                     lambda runner: [runner.spill(spill, spill_mem)])
            checked = checked or checked_spill
            workloads += found

    if "manyfiles" in only:  # a file:// store on a stack of its own: the master's memory is the tree's alone
        base = local / f"manyfiles-{many_files}"
        base.mkdir(parents=True, exist_ok=True)
        with Stack(replace(settings, local_roots=(str(base),)), args.workdir / "run-manyfiles") as stack:
            network = network or stack.link.describe()
            servers = manyfiles.Servers(stack.master_address, stack.master_pid, stack.master_http, TOKEN, NODE,
                                        OTHER_HOST, fuse=stack.start_dataset_fuse,
                                        fuse_unavailable=lambda: stack.fuse_unavailable)
            try:
                workloads.append(manyfiles.measure(servers, base, many_files, many_stat_files, log))
            except Exception as exc:  # noqa: BLE001 - a failed workload is a result; the others stand
                log(f"FAILED manyfiles: {type(exc).__name__}: {exc}")
                workloads.append(manyfiles.failed(many_files, f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:400]))

    run = {
        "name": name, "started": started.isoformat(timespec="seconds"), "duration_s": time.monotonic() - t0,
        "quick": args.quick, "partial": only != set(WORKLOADS) or bool(args.contestants), "reps": reps, "big_cold_reps": min(reps, args.big_cold_reps), "network": network, "link_check": checked,
        "settings": {"rate_mbit": args.rate_mbit, "ttfb_ms": args.ttfb_ms, "mem_quota": args.mem,
                     "block_size": settings.block_size, "readahead_blocks": settings.readahead_blocks},
        "machine": {"cpus": os.cpu_count(), "memory_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
                    "load_start": load_start, "load_end": os.getloadavg()[0], "python": sys.version.split()[0]},
        "sizes": {"aggregate": agg_sizes, "text": text_size, "write": write_size, "share": share_size, "files": files,
                  "train_files": train_files, "spill_mem": spill_mem, "readers": readers_size,
                  "many_files": many_files, "many_stat_files": many_stat_files},
    }
    targets = report.judge(workloads, rate_mbit=args.rate_mbit)
    paths = report.write(args.out, name, run, workloads, targets)
    if not args.quick and not args.no_readme and only == set(WORKLOADS) and not args.contestants:
        report.update_readme(BENCH / "README.md", name, run, targets, workloads)
    for t in targets:
        log(f"{t.verdict:4s} {t.text}  {'' if t.value is None else f'{t.value:.2f}'} {t.detail}")
    log("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; everything started was stopped", file=sys.stderr)
        sys.exit(130)
