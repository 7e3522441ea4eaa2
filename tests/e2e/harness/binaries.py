"""Where the e2e binaries live (built by tests/e2e/tools/build.sh)."""

from __future__ import annotations

import os
from pathlib import Path

NAMES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "helm",
    "csi-sanity",
    "kubelet",
    "kube-proxy",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
)
CONTROL_PLANE = NAMES[:4]
NODES = NAMES[7:]
BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "build.sh"


def bin_dir() -> Path:
    """$STRATA_E2E_BIN, else ~/.cache/strata/e2e-bin."""
    env = os.environ.get("STRATA_E2E_BIN")
    return Path(env) if env else Path.home() / ".cache" / "strata" / "e2e-bin"


def find(name: str) -> Path | None:
    """The built binary `name`, or None when it has not been built."""
    path = bin_dir() / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def missing(names: tuple[str, ...] = CONTROL_PLANE) -> list[str]:
    return [n for n in names if find(n) is None]


def require(name: str) -> Path:
    path = find(name)
    if path is None:
        raise FileNotFoundError(
            f"{name} is not built in {bin_dir()}: run {BUILD_SCRIPT} "
            f"(or set STRATA_E2E_BIN to a folder holding it)"
        )
    return path
