"""The `strata` command as a newcomer uses it: local up, mount an S3 bucket, read, report, down."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import free_port_range

pytestmark = pytest.mark.timeout(180)


def strata(env: dict[str, str], *args: str, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    result = subprocess.run([sys.executable, "-P", "-m", "strata.cacheserver", *args], env=env, input=input,
                            capture_output=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"strata {' '.join(args)} failed ({result.returncode}):\n{result.stderr.decode()}")
    return result


@pytest.fixture
def local_env(tmp_path: Path) -> Any:
    env = {**os.environ, "STRATA_HOME": str(tmp_path / "home"), "PYTHONSAFEPATH": "1"}
    for name in ("STRATA_MASTER", "STRATA_TOKEN", "STRATA_TOKEN_FILE"):
        env.pop(name, None)
    yield env
    strata(env, "local", "down", check=False)


def test_local_cluster_mount_read_report(local_env: dict[str, str], s3: Any, bucket: str, tmp_path: Path) -> None:
    master_port, worker_port = free_port_range(2), free_port_range(6)
    up = strata(local_env, "local", "up", "--workers", "2", "--mem", "64Mi", "--ssd", f"{tmp_path / 'ssd'}:128Mi",
                "--master-port", str(master_port), "--worker-port", str(worker_port))
    assert b"Strata is up" in up.stdout
    assert b"running" in strata(local_env, "local", "status").stdout

    data = os.urandom(5 * 1024 * 1024)
    s3.put_object(bucket, "logs/day-1.txt", data)
    opts = s3.storage_options()
    strata(local_env, "mount", "add", "/logs", f"s3://{bucket}/logs",
           "--option", f"endpoint_url={opts['endpoint_url']}", "--option", f"region={opts['region']}",
           "--credential", f"key={opts['key']}", "--credential", f"secret={opts['secret']}")
    listing = strata(local_env, "mount", "ls").stdout.decode()
    assert "/logs" in listing and f"s3://{bucket}/logs" in listing
    assert opts["secret"] not in listing

    assert "/logs/day-1.txt" in strata(local_env, "fs", "ls", "/logs").stdout.decode()
    assert strata(local_env, "fs", "cat", "/logs/day-1.txt").stdout == data
    load = strata(local_env, "fs", "load", "/logs")
    assert b"loaded 1/1 files" in load.stdout
    report = strata(local_env, "report").stdout.decode()
    assert "local-worker-0" in report and "local-worker-1" in report and "hit ratio" in report

    strata(local_env, "fs", "put", "-", "/logs/new.txt", input=b"written through strata")
    assert strata(local_env, "fs", "cat", "/logs/new.txt").stdout == b"written through strata"
    assert s3.get_object(bucket, "logs/new.txt") == b"written through strata"

    # Python client finds the local cluster without flags
    code = "import fsspec; print(fsspec.filesystem('strata').cat_file('/logs/new.txt').decode())"
    result = subprocess.run([sys.executable, "-P", "-c", code], env=local_env, capture_output=True, timeout=60)
    assert result.stdout.decode().strip() == "written through strata", result.stderr.decode()

    missing = strata(local_env, "fs", "cat", "/logs/missing.txt", check=False)
    assert missing.returncode == 1 and b"missing.txt" in missing.stderr
    assert b"stopped" in strata(local_env, "local", "down").stdout
    assert strata(local_env, "local", "status", check=False).returncode == 1


def test_local_down_and_up_keep_a_must_cache_write(local_env: dict[str, str], tmp_path: Path) -> None:
    # MEM alone (the default of `local up`): the MUST_CACHE file's blocks are its only copy,
    # in the workers' MEM folders, which `local down` deleted with the rest.
    master_port, worker_port = free_port_range(2), free_port_range(3)
    ports = ("--master-port", str(master_port), "--worker-port", str(worker_port))
    source = tmp_path / "source"
    source.mkdir()
    strata(local_env, "local", "up", "--mem", "64Mi", *ports)
    strata(local_env, "mount", "add", "/w", f"file://{source}")
    data = os.urandom(3 * 1024 * 1024 + 5)
    strata(local_env, "fs", "put", "--write-type", "MUST_CACHE", "-", "/w/must.bin", input=data)
    down = strata(local_env, "local", "down").stdout.decode()
    assert "kept /dev/shm/strata-" in down and "not in the store yet" in down, down
    strata(local_env, "local", "up", "--mem", "64Mi", *ports)
    # The cluster's tokens are kept with its journal: the mount is usable as it was.
    assert "UNUSABLE" not in strata(local_env, "mount", "ls").stdout.decode()
    assert strata(local_env, "fs", "cat", "/w/must.bin").stdout == data
    assert not (source / "must.bin").exists()
    strata(local_env, "fs", "rm", "/w/must.bin")
    assert "kept" not in strata(local_env, "local", "down").stdout.decode()


def test_errors_are_one_clear_line(local_env: dict[str, str]) -> None:
    result = strata(local_env, "fs", "ls", "/", check=False)
    assert result.returncode == 1
    assert b"strata local up" in result.stderr and b"Traceback" not in result.stderr


@pytest.mark.parametrize("config,message", [
    ("tiers: [{medium: MEM, quota: 0}]", b"quota"),
    ("tiers: []", b"no cache tiers"),
    ("tiers: [{medium: SSD, quota: 1Gi}, {medium: MEM, quota: 1Gi}]", b"fastest first"),
])
def test_a_worker_with_a_bad_config_says_why_and_exits(local_env: dict[str, str], tmp_path: Path, config: str,
                                                       message: bytes) -> None:
    path = tmp_path / "worker.yaml"
    path.write_text(config)
    result = strata({**local_env, "STRATA_TOKEN": "t"}, "worker", "--config", str(path), "--data-dir", str(tmp_path / "w"),
                    "--port", "0", "--http-port", "0", check=False)
    assert result.returncode == 1
    assert message in result.stderr and b"Traceback" not in result.stderr
