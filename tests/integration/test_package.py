"""The package as pip installs it: a wheel and an sdist built from the tracked sources alone
(no stubs made by `make`), installed into a clean venv outside the source tree, whose `strata`
command and `strata://` filesystem work against a running cluster.

Slow-ish (a build and an install of the dependencies; pip's cache makes it a couple of
minutes), kept in the suite: a package that cannot be installed is a broken product."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO, TOKEN

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STUBS = ["strata/contract/proto/strata_pb2.py", "strata/contract/proto/strata_pb2_grpc.py",
         "strata/cacheserver/csi/proto/csi_pb2.py", "strata/cacheserver/csi/proto/csi_pb2_grpc.py"]


def run(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed ({result.returncode}):\n"
                             f"{result.stdout.decode()[-3000:]}\n{result.stderr.decode()[-5000:]}")
    return result.stdout.decode()


def tracked_sources(dest: Path) -> Path:
    """The files git tracks, as they are in the work tree: what a clone or `pip install
    git+...` gets (no generated stubs, no .venv)."""
    files = run("git", "ls-files", "-z", cwd=REPO).split("\0")
    for name in filter(None, files):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    assert not list(dest.rglob("*_pb2.py")), "generated stubs must not be tracked"
    return dest


def test_a_wheel_and_an_sdist_carry_the_stubs_and_the_installed_command_reads(
        tmp_path: Path, start_cluster: Any, bucket: str) -> None:
    started = time.monotonic()
    source = tracked_sources(tmp_path / "src")
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "STRATA_"))}
    # Packages that are not under test go in with uv, from its cache (pip took ~30 s of the
    # test for them); the builds and the install of the package itself are pip's.
    uv = Path(sys.executable).with_name("uv")
    assert uv.is_file(), f"no uv at {uv} (`make venv` puts it in the venv)"
    uv_install = [uv, "pip", "install", "--python", python]
    # A current pip: the one bundled with the interpreter may be too old to resolve the
    # dependencies in reasonable time (the project's lock file is what makes installs
    # reproducible for every pip).
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    run(*uv_install, "pip", env=env, cwd=tmp_path)
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    # The builds take their tools at the lock's versions, as `make venv` and the images do:
    # stubs made by a grpcio-tools newer than the grpcio installed below refuse to import
    # (their version check), and the install below is held to this venv's grpcio.
    build_pins = ("--build-constraint", REPO / "requirements.lock")

    dist = tmp_path / "dist"
    run(*pip, "wheel", "--no-deps", *build_pins, "-w", dist, source, env=env, cwd=tmp_path)
    wheel = next(dist.glob("strata-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert set(STUBS) <= names, f"the wheel lacks {set(STUBS) - names}"
    assert "strata/cacheserver/native.abi3.so" in names, "the wheel lacks the compiled core"

    # The sdist from the same tracked files carries the stubs too, and builds a wheel.
    run(*uv_install, "-c", REPO / "requirements.lock", "setuptools>=68", "wheel", "grpcio-tools>=1.62",
        "setuptools-rust>=1.11", env=env, cwd=tmp_path)
    run(python, "-P", "setup.py", "-q", "sdist", "-d", dist, cwd=source, env=env)
    sdist = next(dist.glob("strata-*.tar.gz"))
    with tarfile.open(sdist) as tf:
        members = {m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name}
    for stub in STUBS:
        folder = stub.removeprefix("strata/")
        assert folder in members, f"the sdist lacks {folder}"
    assert {"native/Cargo.toml", "native/Cargo.lock", "native/src/lib.rs"} <= members, "the sdist lacks the core's crate"
    from_sdist = tmp_path / "from-sdist"
    run(*pip, "wheel", "--no-deps", *build_pins, "-w", from_sdist, sdist, env=env, cwd=tmp_path)
    with zipfile.ZipFile(next(from_sdist.glob("strata-*.whl"))) as zf:
        assert set(STUBS) | {"strata/cacheserver/native.abi3.so"} <= set(zf.namelist())

    # The dependencies at the versions this test runs with (resolving them afresh can take
    # pip many minutes of backtracking; the project's lock file pins them for users).
    constraints = tmp_path / "constraints.txt"
    frozen = run(sys.executable, "-m", "pip", "freeze", "--exclude-editable", cwd=tmp_path)
    constraints.write_text("\n".join(line for line in frozen.splitlines() if not line.startswith(("strata", "-e"))))
    # uv puts in the wheel's dependencies; pip then installs the wheel, each requirement met.
    run(*uv_install, "-c", constraints, wheel, env=env, cwd=tmp_path)
    run(uv, "pip", "uninstall", "--python", python, "strata", env=env, cwd=tmp_path)
    run(*pip, "install", "-c", constraints, wheel, env=env, cwd=tmp_path)
    strata = venv / "bin" / "strata"
    assert "usage: strata" in run(strata, "--help", env=env, cwd=tmp_path)
    assert "usage: strata-operator" in run(venv / "bin" / "strata-operator", "--help", env=env, cwd=tmp_path)

    cluster = start_cluster(workers=1)
    data = os.urandom(300_000)
    cluster.s3.put_object(bucket, "pkg/data.bin", data)
    cluster.mount_bucket("/pkg", bucket)
    read = ("import sys, fsspec; fs = fsspec.filesystem('strata', master=sys.argv[1], token=sys.argv[2]); "
            "sys.stdout.buffer.write(fs.cat_file('strata:///pkg/pkg/data.bin'))")
    got = subprocess.run([venv / "bin" / "python", "-P", "-c", read, cluster.master_address, TOKEN],
                         cwd=tmp_path, env=env, capture_output=True, timeout=120)
    assert got.returncode == 0, got.stderr.decode()[-3000:]
    assert got.stdout == data
    cat = subprocess.run([strata, "fs", "cat", "/pkg/pkg/data.bin"], cwd=tmp_path, capture_output=True, timeout=120,
                         env={**env, "STRATA_MASTER": cluster.master_address, "STRATA_TOKEN": TOKEN})
    assert cat.returncode == 0, cat.stderr.decode()[-3000:]
    assert cat.stdout == data
    print(f"wheel + sdist built, installed and read in {time.monotonic() - started:.0f} s")
