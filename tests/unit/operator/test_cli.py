"""The `strata-operator` command: its own entry point, apart from the servers' `strata`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from strata.cacheserver.cli import build_parser as server_parser
from strata.operator.cli import build_parser, main


def test_run_takes_what_the_chart_passes() -> None:
    args = build_parser().parse_args(["run", "--all-namespaces", "--peering=strata",
                                      "--liveness=http://0.0.0.0:8080/healthz"])
    assert args.command == "run" and args.all_namespaces and args.peering == "strata"
    args = build_parser().parse_args(["run", "-n", "a", "--namespace=b", "--standalone"])
    assert args.namespace == ["a", "b"] and args.standalone and not args.all_namespaces


def test_uninstall_wants_namespaces_or_all(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["uninstall"]) == 1
    assert "--all-namespaces" in capsys.readouterr().err
    assert main(["uninstall", "-A", "-n", "x"]) == 1


def test_the_servers_command_no_longer_runs_the_operator() -> None:
    for command in (["operator", "--all-namespaces"], ["uninstall", "--all-namespaces"]):
        with pytest.raises(SystemExit):
            server_parser().parse_args(command)


def test_python_m_strata_operator_is_the_command() -> None:
    done = subprocess.run([sys.executable, "-P", "-m", "strata.operator", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "strata-operator" in done.stdout and "uninstall" in done.stdout
