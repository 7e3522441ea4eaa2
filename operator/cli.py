"""The `strata-operator` command (also `python -m strata.operator`): `run` the operator
(kopf), and `uninstall`, the chart's pre-delete hook. The operator image's entry point."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from strata.contract.errors import InvalidArgument, StrataError


def cmd_run(args: argparse.Namespace) -> int:
    from strata.operator.main import run

    run(namespaces=args.namespace or [], all_namespaces=args.all_namespaces,
        liveness_endpoint=args.liveness, peering=args.peering, standalone=args.standalone)
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    from strata.operator.kube import Kube
    from strata.operator.uninstall import uninstall

    if bool(args.namespace) == args.all_namespaces:
        raise InvalidArgument("give --all-namespaces or one or more --namespace")

    async def run() -> list[str]:
        kube = await Kube.from_environment()
        try:
            return await uninstall(kube, args.namespace or [], args.timeout)
        finally:
            await kube.close()

    dropped = asyncio.run(run())
    print(f"every Mount and CacheCluster is gone{'; finalizer dropped from: ' + ', '.join(dropped) if dropped else ''}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="strata-operator", description="The Strata operator for Kubernetes.")
    parser.add_argument("--log-level", default=os.environ.get("STRATA_LOG_LEVEL", "info"),
                        help="of `uninstall` (`run` logs JSON through kopf)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=help)
        p.set_defaults(fn=fn)
        return p

    p = add("run", cmd_run, "run the Kubernetes operator")
    p.add_argument("--namespace", "-n", action="append", help="watch this namespace (repeatable)")
    p.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    p.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL")
    p.add_argument("--peering", default=None, help="peering object name for leader election")
    p.add_argument("--standalone", action="store_true", help="no leader election (one replica only)")

    p = add("uninstall", cmd_uninstall, "delete every Mount and CacheCluster and wait until they are gone "
            "(the chart's pre-delete hook; run it before removing the operator)")
    p.add_argument("--namespace", "-n", action="append", help="in this namespace (repeatable)")
    p.add_argument("--all-namespaces", "-A", action="store_true", help="in every namespace")
    p.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                   help="then drop the operator's finalizer from what is left (default 120)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args: Any = build_parser().parse_args(argv)
    if args.command != "run":  # kopf sets up the operator's (JSON) logging itself
        logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.fn(args))
    except StrataError as exc:
        print(f"strata-operator: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
