"""Rendering charts/strata with the real helm binary (built by tests/e2e/tools/build.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "strata"
RELEASE = "strata"
NAMESPACE = "strata-system"
# helm built from source assumes Kubernetes 1.20 without --kube-version; the chart needs 1.25+.
KUBE_VERSION = "1.34.0"

Obj = dict[str, Any]


def find_helm() -> str | None:
    """$HELM, the e2e build of helm, or helm on PATH."""
    folder = Path(os.environ.get("STRATA_E2E_BIN") or Path.home() / ".cache" / "strata" / "e2e-bin")
    for candidate in (os.environ.get("HELM"), str(folder / "helm"), shutil.which("helm")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="session")
def helm() -> str:
    found = find_helm()
    if found is None:
        pytest.skip("helm is not built: run tests/e2e/tools/build.sh (or set HELM)")
    return found


def run_helm(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HELM_CACHE_HOME": "/tmp/strata-helm-cache",
                               "HELM_CONFIG_HOME": "/tmp/strata-helm-config", "HELM_DATA_HOME": "/tmp/strata-helm-data"})
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def sets(values: dict[str, str]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def render_text(helm: str, values: dict[str, str] | None = None, *, release: str = RELEASE,
                namespace: str = NAMESPACE, extra: Iterable[str] = ()) -> str:
    return run_helm(helm, "template", release, str(CHART), "--namespace", namespace,
                    "--kube-version", KUBE_VERSION, *sets(values or {}), *extra).stdout


def load_all(text: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


Render = Callable[..., list[Obj]]


@pytest.fixture(scope="session")
def render(helm: str) -> Render:
    """render(values) -> the manifests helm template makes (cached per values)."""
    cache: dict[tuple[Any, ...], list[Obj]] = {}

    def _render(values: dict[str, str] | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE) -> list[Obj]:
        key = (tuple(sorted((values or {}).items())), release, namespace)
        if key not in cache:
            cache[key] = load_all(render_text(helm, values, release=release, namespace=namespace))
        return cache[key]

    return _render


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def kinds(objs: list[Obj]) -> list[str]:
    return sorted(o["kind"] for o in objs)
