"""Prometheus's promtool (Debian package `prometheus`, installed by
scripts/install-system-deps.sh) run on text: metrics, rules, rule tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: run scripts/install-system-deps.sh (Debian package prometheus)")
    return found


def run(*args: str | Path, stdin: str | None = None, cwd: Path | None = None) -> tuple[int, str]:
    """promtool's exit code and what it said."""
    done = subprocess.run([promtool(), *map(str, args)], input=stdin, capture_output=True, text=True, timeout=60,
                          cwd=cwd)
    return done.returncode, (done.stdout + done.stderr).strip()


def metrics_problems(exposition: str) -> str:
    """What `promtool check metrics` says of a /metrics answer (empty: clean)."""
    code, said = run("check", "metrics", stdin=exposition)
    return said if code or said else ""
