"""Session fixtures of the e2e suite.

The suite takes $KUBECONFIG when it is set (kind, a real cluster). Otherwise it
starts the harness (tests/e2e/harness: etcd, kube-apiserver, controller-manager,
scheduler, and three real kubelet nodes with containerd, kube-proxy and CoreDNS)
in a child process for the session, and stops it at the end, also when tests
fail. STRATA_E2E_HARNESS=1 forces the harness even with $KUBECONFIG set.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from kit import REPO, Cluster, make_namespace, wait_until  # noqa: E402

from harness import binaries  # noqa: E402

# The first start after an image changed imports every image into containerd (minutes on
# 2 busy cores); later starts copy that store.
HARNESS_START_TIMEOUT = 900.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


def _use_existing() -> Path | None:
    if os.environ.get("STRATA_E2E_HARNESS") == "1":
        return None
    kubeconfig = os.environ.get("KUBECONFIG")
    return Path(kubeconfig) if kubeconfig else None


def _term_with_parent() -> None:
    """In the harness child: own session, and SIGTERM (a clean teardown) if
    pytest dies without stopping it."""
    os.setsid()
    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def _start_harness(tmp: Path) -> tuple[subprocess.Popen[bytes], dict[str, object], Path]:
    missing = binaries.missing(binaries.CONTROL_PLANE + binaries.NODES)
    if missing:
        pytest.skip(
            f"no KUBECONFIG and the harness binaries are not built ({', '.join(missing)} missing in "
            f"{binaries.bin_dir()}): run {binaries.BUILD_SCRIPT}"
        )
    if os.geteuid() != 0:
        pytest.skip("the harness runs kubelets, containerd and mounts: it needs root (or set KUBECONFIG)")
    ready = tmp / "ready.json"
    log = tmp / "harness.log"
    env = {**os.environ, "PYTHONPATH": str(HERE), "STRATA_E2E_STATE": str(tmp / "state")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "harness", "up", "--ready-file", str(ready),
             *(["--keep-state"] if os.environ.get("STRATA_E2E_KEEP") else [])],
            cwd=str(HERE), env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_term_with_parent,
        )

    def started() -> dict[str, object] | None:
        if ready.exists():
            info: dict[str, object] = json.loads(ready.read_text())
            return info
        if proc.poll() is not None:
            raise RuntimeError(f"harness exited {proc.returncode}")
        return None

    try:
        info = wait_until(started, timeout=HARNESS_START_TIMEOUT, what="the e2e harness to start", interval=1.0,
                          diagnose=lambda: log.read_text(errors="replace")[-4000:])
    except (TimeoutError, RuntimeError) as exc:
        _stop_harness(proc)
        raise RuntimeError(f"{exc}\n{log.read_text(errors='replace')[-4000:]}") from exc
    if "error" in info:
        _stop_harness(proc)
        raise RuntimeError(f"the e2e harness could not start: {info['error']}")
    return proc, info, log


def _stop_harness(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=300)  # teardown restores the host: give it time
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    existing = _use_existing()
    if existing is not None:
        yield Cluster(kubeconfig=existing)
        return
    tmp = Path(tempfile.mkdtemp(prefix="strata-e2e-session-"))
    # Test pods run a plain Python image (the Debian base of our images), not ours.
    os.environ.setdefault("STRATA_E2E_PYTHON_IMAGE", "localhost/python:3.11")
    started = time.monotonic()
    proc, info, log = _start_harness(tmp)
    info["startup_seconds"] = round(time.monotonic() - started, 1)
    print(f"\ne2e harness up in {info['startup_seconds']}s: {json.dumps(info.get('timings'))}", file=sys.stderr)
    try:
        yield Cluster(kubeconfig=Path(str(info["kubeconfig"])), harness=info)
    finally:
        _stop_harness(proc)
        if not os.environ.get("STRATA_E2E_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test (deleted afterwards, without waiting)."""
    base = request.node.name.lower().replace("_", "-")
    base = "".join(ch for ch in base if ch.isalnum() or ch == "-")[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    make_namespace(cluster, name)
    yield name
    if os.environ.get("STRATA_E2E_KEEP"):
        return
    cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture(scope="session")
def chart_dir() -> Path:
    """charts/strata, or a skip while the chart does not exist yet."""
    chart = REPO / "charts" / "strata"
    if not (chart / "Chart.yaml").is_file():
        pytest.skip("charts/strata/Chart.yaml does not exist yet (the Helm chart lands with a later issue)")
    return chart
