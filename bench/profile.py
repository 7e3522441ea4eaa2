"""Profile one contestant on one workload with py-spy: the reading process and the Strata
servers, sampled at once, summarized as the functions that take the time.

    .venv/bin/python -P bench/profile.py --contestant strata-remote --workload aggregate \
        --size 256Mi --phase warm --repeat 5

It starts the same stack as run.py, makes the data, warms the cache if asked, then runs the
operation `--repeat` times in a reader process under `py-spy record` while py-spy also
samples the worker (and the master, and the FUSE process when they are involved). Writes
results/profiles/<tag>-<process>.txt (top functions by own and by total time); the raw
collapsed stacks (for flamegraph tools) go to <workdir>/profiles/<tag>-<process>.raw.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import datasets  # noqa: E402
from contestants import build  # noqa: E402
from ops import run_op  # noqa: E402
from stack import BUCKET, MOUNT, NODE, OTHER_HOST, TOKEN, Stack, StackSettings  # noqa: E402

META_MOUNT = "/bench-meta"
_FRAME = re.compile(r"^(.*) \((.*?)(?::\d+)?\)$")


def summarize(raw: Path, top: int = 25) -> str:
    """Top functions by own samples and by total samples from py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        samples += count
        frames = []
        for frame in stack.split(";"):
            m = _FRAME.match(frame)
            name = f"{m.group(1)} ({_short(m.group(2))})" if m else frame
            frames.append(name)
        own[frames[-1]] += count
        for name in set(frames):
            total[name] += count
    if not samples:
        return f"{raw.name}: no samples\n"
    lines = [f"{raw.name}: {samples} samples", "", "own time (self):"]
    lines += [f"  {100 * n / samples:5.1f}%  {name}" for name, n in own.most_common(top)]
    lines += ["", "total time (inclusive):"]
    lines += [f"  {100 * n / samples:5.1f}%  {name}" for name, n in total.most_common(top)]
    return "\n".join(lines) + "\n"


def _short(path: str) -> str:
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def spy(pid: int, out: Path, rate: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--nonblocking",
                             "--threads", "-r", str(rate), "-f", "raw", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    p = argparse.ArgumentParser(description="py-spy profiles of one contestant on one workload")
    p.add_argument("--contestant", default="strata-remote")
    p.add_argument("--workload", choices=("aggregate", "linecount", "metadata", "training"), default="aggregate")
    p.add_argument("--size", default="256Mi", help="dataset size (aggregate, linecount) or file count (metadata, training)")
    p.add_argument("--phase", choices=("cold", "warm"), default="warm")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--rate", type=int, default=200, help="samples per second")
    p.add_argument("--tag", help="output name (default contestant-workload-phase)")
    p.add_argument("--workdir", type=Path, default=BENCH / ".scratch")
    p.add_argument("--out", type=Path, default=BENCH / "results" / "profiles")
    args = p.parse_args()
    from strata.contract.units import parse_size

    tag = args.tag or f"{args.contestant}-{args.workload}-{args.phase}"
    local = args.workdir / "data"
    if args.workload == "aggregate":
        size = parse_size(args.size)
        ds = datasets.parquet_dataset(local, f"agg-{datasets.size_label(size)}", size)
        op = "aggregate"
    elif args.workload == "linecount":
        size = parse_size(args.size)
        ds = datasets.text_dataset(local, f"text-{datasets.size_label(size)}", size)
        op = "count_lines"
    elif args.workload == "training":
        ds = datasets.training_dataset(local, f"train-{int(args.size)}", int(args.size))
        op = "read_files"
    else:
        ds = datasets.small_files_dataset(local, f"meta-{int(args.size)}", int(args.size))
        op = "list_and_stat"
    args.out.mkdir(parents=True, exist_ok=True)
    raws = args.workdir / "profiles"
    raws.mkdir(parents=True, exist_ok=True)
    with Stack(StackSettings(), args.workdir / "profile") as stack:
        datasets.upload(ds, local, stack.s3fs(), BUCKET)
        stack.mount(MOUNT, f"s3://{BUCKET}")
        stack.mount(META_MOUNT, f"s3://{BUCKET}/{ds.name}")
        contestants = {c.id: c for c in build(stack, local, args.workdir / "profile", bucket=BUCKET, mount=MOUNT,
                                              node=NODE, other_host=OTHER_HOST, token=TOKEN)}
        c = contestants[args.contestant]
        if c.unavailable:
            raise SystemExit(f"{c.id}: {c.unavailable}")
        c.cold([ds.name])
        access = c.access  # after cold(): a cold read may give the contestant a new cache folder
        if args.workload == "training":
            access = c.small_files or access
        if args.workload == "metadata":
            root = {"s3fs": f"{BUCKET}/{ds.name}", "local": str(local / ds.name)}.get(c.id)
            if root is None:
                root = META_MOUNT if access.kind == "strata" else f"{stack.fuse_mountpoint}{META_MOUNT}"
            paths = [root]
        else:
            paths = [access.path(f) for f in ds.files]
        if args.phase == "warm":
            with c.filesystem() as fs:
                run_op(op, fs, paths)
        spies: list[tuple[str, Path, subprocess.Popen[bytes]]] = []
        servers = {child.name: child for child in stack.children}
        watched = ["worker"] + (["master"] if args.workload in ("metadata", "training") else []) + ([("fuse-dataset" if args.workload == "training" else "fuse-large")] if c.id == "strata-fuse" else [])
        for name in watched:
            if name in servers:
                raw = raws / f"{tag}-{name}.raw"
                spies.append((name, raw, spy(servers[name].process.pid, raw, args.rate)))
        time.sleep(0.5)  # let py-spy attach
        job = {"access": access.to_json(), "op": op, "full_paths": paths, "repeat": args.repeat}
        job_file = raws / f"{tag}-job.json"
        job_file.write_text(json.dumps(job))
        client_raw = raws / f"{tag}-client.raw"
        reader = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--threads", "-r", str(args.rate),
                                   "-f", "raw", "-o", str(client_raw), "--", sys.executable, "-P", str(BENCH / "reader.py"),
                                   f"@{job_file}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert reader.stdin is not None and reader.stdout is not None
        while not reader.stdout.readline().startswith("READY"):  # py-spy prints to stdout too
            pass
        reader.stdin.write("go\n")
        reader.stdin.flush()
        times = [json.loads(line)["seconds"] for line in reader.stdout if line.startswith("{")]
        reader.wait(timeout=120)
        for _, _, proc in spies:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        print(f"{tag}: {args.repeat} x {op}: " + ", ".join(f"{t:.3f}" for t in times) + " s", flush=True)
        for name, raw in [("client", client_raw), *((n, r) for n, r, _ in spies)]:
            text = summarize(raw) if raw.exists() else f"{raw.name}: no output\n"
            (args.out / f"{tag}-{name}.txt").write_text(f"{tag}: {' '.join(sys.argv[1:])}\n\n{text}")
            print(text)
        for c2 in contestants.values():
            c2.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
