"""`python -P -m harness up [--nodes N] [--state DIR] [--ready-file F]`:
start the test cluster, print how to use it, and run until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from harness import chart
from harness.cluster import Cluster, default_state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness", description=__doc__)
    parser.add_argument("command", choices=["up"])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--state", type=Path, default=None, help="folder for certs, logs and pods (default: a temp dir)")
    parser.add_argument("--keep-state", action="store_true", help="leave the state folder (logs) behind")
    parser.add_argument("--ready-file", type=Path, default=None, help="write the cluster's description here when ready")
    args = parser.parse_args(argv)

    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: done.set())
    cluster = Cluster(state=args.state or default_state(), nodes=args.nodes, keep_state=args.keep_state)
    try:
        cluster.up()
    except Exception as exc:
        print(f"harness: could not start the cluster: {exc}", file=sys.stderr)
        if args.ready_file:
            args.ready_file.write_text(json.dumps({"error": str(exc)}))
        return 1
    try:
        info = cluster.describe()
        text = json.dumps(info, indent=2)
        if args.ready_file:
            tmp = args.ready_file.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(args.ready_file)
        print(text, flush=True)
        print(f"export KUBECONFIG={info['kubeconfig']}", flush=True)
        print(chart.install_note(), flush=True)
        while not done.wait(1.0):
            dead = cluster.check_alive()
            if dead:
                print(f"harness: component(s) exited: {', '.join(dead)}", file=sys.stderr)
                return 1
    finally:
        notes = cluster.down()
        if notes:
            print("harness: could not undo:\n  " + "\n  ".join(notes), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
