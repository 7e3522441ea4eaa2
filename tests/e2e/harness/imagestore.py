"""Every node's containerd starts with the e2e images already in its store.

Importing the archives of tests/e2e/images/build.sh takes minutes (about 1.6 GB, digested and
unpacked); doing that once per node and run would dominate a warm start. So a containerd
root holding all of them is made once per set of archives, cached in
~/.cache/strata/e2e-containerd/<hash of the archive names> (the names carry the hash of the
images' inputs), and each node's root is a copy of it: hard links for the content blobs and
unpacked layers (never written: a container writes to its own upper layer), real copies of
the metadata databases. containerd finds everything relative to its root, so the copy works
wherever it is.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from harness import binaries
from harness.hostside import RUN
from harness.processes import spawn, stop, tail, wait_for


def cache_dir() -> Path:
    env = os.environ.get("STRATA_E2E_CONTAINERD_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "strata" / "e2e-containerd"


def _key(archives: list[Path]) -> str:
    stamp = (binaries.require("containerd").with_suffix(".stamp"))
    text = "\n".join(a.name for a in archives) + "\n" + (stamp.read_text() if stamp.exists() else "")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def template(archives: list[Path]) -> tuple[Path, float]:
    """The cached containerd root with `archives` imported (made when missing), and the
    seconds spent making it (0 when it was cached)."""
    root = cache_dir() / _key(archives)
    if (root / "complete").exists():
        return root, 0.0
    t0 = time.monotonic()
    cache_dir().mkdir(parents=True, exist_ok=True)
    work = cache_dir() / f".making-{root.name}"
    shutil.rmtree(work, ignore_errors=True)
    run = RUN / "template"
    run.mkdir(parents=True, exist_ok=True)
    socket = run / "containerd.sock"
    config = run / "containerd.toml"
    config.write_text(f"""\
version = 3
root = "{work}"
state = "{run / 'state'}"
imports = []
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins."io.containerd.nri.v1.nri"]
  disable = true
""")
    proc = spawn([str(binaries.require("containerd")), "--config", str(config), "--log-level", "warn"],
                 run / "containerd.log")
    ctr = [str(binaries.require("ctr")), "--address", str(socket), "--namespace", "k8s.io"]
    try:
        wait_for(lambda: proc.poll() is None and subprocess.run([*ctr, "version"], capture_output=True).returncode == 0,
                 timeout=60, what="the template containerd", diagnose=lambda: tail(run / "containerd.log"))
        for archive in archives:
            out = subprocess.run([*ctr, "images", "import", str(archive)], capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"importing {archive}: {out.stderr.strip()}")
    finally:
        stop(proc, grace=10.0)
    (work / "complete").write_text("\n".join(a.name for a in archives) + "\n")
    shutil.rmtree(root, ignore_errors=True)
    work.rename(root)
    for old in cache_dir().iterdir():  # one template at a time: drop the others
        if old != root:
            shutil.rmtree(old, ignore_errors=True)
    return root, time.monotonic() - t0


def copy_root(template_root: Path, dest: Path) -> None:
    """dest as a containerd root equal to template_root: hard links, except databases."""
    if dest.exists():
        shutil.rmtree(dest)
    proc = subprocess.run(["cp", "-al", str(template_root), str(dest)], capture_output=True, text=True)
    if proc.returncode != 0:  # another file system: a full copy
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(template_root, dest, symlinks=True)
        return
    for db in dest.rglob("*.db"):
        data = db.read_bytes()
        db.unlink()
        db.write_bytes(data)
