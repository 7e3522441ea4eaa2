"""The near cache's records and folder (client/nearcache.py), on real files."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from strata.cacheserver.client import nearcache
from strata.cacheserver.client.nearcache import FANOUT, NearCache, NearRecord, RecordError, decode_parts, encode, sizes
from strata.contract.proto import strata_pb2 as pb


def status(path: str = "/ds/a.bin", length: int = 200_000, version: str = "v1") -> pb.FileInfo:
    return pb.FileInfo(path=path, length=length, version=version, mount_id=7, block_size=1 << 24, persisted=True,
                       valid_for_ms=120_000)


def decode(blob: bytes, path: str) -> NearRecord:
    """The record of `path` that `blob` holds whole."""
    start = sizes(blob)[0]
    return decode_parts(blob[:start], blob[start:], path)


def used(cache: NearCache) -> int:
    """Bytes the cache's folder holds."""
    return sum(f.stat().st_size for folder in cache.root.iterdir() if folder.is_dir() for f in folder.iterdir())


def record_file(cache: NearCache, path: str) -> Path:
    return Path(cache._where(path)[1])


def test_a_record_gives_back_its_status_and_bytes() -> None:
    data = os.urandom(200_000)
    until = time.monotonic() + 60
    record = decode(encode(status(), until, data, chunk_size=4096), "/ds/a.bin")
    assert record.data == data and record.info == status()
    reused = record.reusable()
    assert reused is not None and 59_000 < reused.valid_for_ms <= 60_000
    assert record.holds(status()) and not record.holds(status(version="v2"))
    assert not record.holds(status(length=199_999))


def test_a_status_past_its_time_or_from_another_boot_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"x" * 10
    assert decode(encode(status(length=10), time.monotonic() - 1, data), "/ds/a.bin").reusable() is None
    blob = encode(status(length=10), time.monotonic() + 60, data)
    monkeypatch.setattr(nearcache, "boot_id", lambda: b"\1" * 16)
    record = decode(blob, "/ds/a.bin")
    assert record.reusable() is None and record.data == data  # the bytes still serve their version


@pytest.mark.parametrize("where", ["head", "status", "checksums", "head crc", "bytes", "last byte"])
def test_every_flipped_bit_fails_a_check(where: str) -> None:
    data = os.urandom(150_000)
    blob = bytearray(encode(status(length=len(data)), time.monotonic() + 60, data))
    start = len(blob) - len(data)
    at = {"head": 20, "status": nearcache._HEAD.size + 3, "checksums": start - 8, "head crc": start - 2,
          "bytes": start + 70_000, "last byte": len(blob) - 1}[where]
    blob[at] ^= 0x10
    with pytest.raises(RecordError):
        decode(bytes(blob), "/ds/a.bin")


def test_a_short_or_misplaced_record_fails_a_check() -> None:
    blob = encode(status(length=1000), 0.0, b"y" * 1000)
    for cut in (0, 10, len(blob) - 1):
        with pytest.raises(RecordError):
            decode(blob[:cut], "/ds/a.bin")
    with pytest.raises(RecordError, match="not of '/ds/b.bin'"):
        decode(blob, "/ds/b.bin")


def test_the_cache_keeps_finds_and_removes_damaged_records(tmp_path: Path) -> None:
    cache = NearCache(tmp_path / "near", 1 << 30, "master:1")
    data = os.urandom(100_000)
    cache.keep(status(length=len(data)), time.monotonic() + 60, data)
    assert cache.flush(10)
    found = cache.find("/ds/a.bin")
    assert found is not None and found.data == data
    assert found.holds(status(length=len(data))) and not found.holds(status(length=len(data), version="v2"))
    assert NearCache(tmp_path / "near", 1 << 30, "master:2").find("/ds/a.bin") is None  # another cluster's
    where = record_file(cache, "/ds/a.bin")
    with open(where, "r+b") as f:
        f.seek(-5000, os.SEEK_END)
        f.write(b"\0")
    assert cache.find("/ds/a.bin") is None and not where.exists()
    cache.keep(status(length=len(data)), time.monotonic() + 60, data)
    assert cache.flush(10)
    os.truncate(where, where.stat().st_size - 1)
    assert cache.find("/ds/a.bin") is None and not where.exists()


def test_forget_removes_only_the_version_named(tmp_path: Path) -> None:
    cache = NearCache(tmp_path, 1 << 30, "m")
    cache.keep(status(length=3), 0.0, b"abc")
    assert cache.flush(10)
    cache.forget("/ds/a.bin", "v0")
    assert cache.find("/ds/a.bin") is not None
    cache.forget("/ds/a.bin", "v1")
    assert cache.find("/ds/a.bin") is None


def test_the_quota_holds_across_many_inserts_and_processes(tmp_path: Path) -> None:
    quota = FANOUT * 16 * 1024  # 16 KiB a subfolder
    writers = [NearCache(tmp_path, quota, "m") for _ in range(2)]  # two processes sharing the folder
    for i in range(3000):
        data = os.urandom(2000)
        writers[i % 2].keep(status(f"/ds/{i}.bin", length=len(data)), 0.0, data)
        writers[i % 2].flush(10)  # two processes' writes interleaved, as they come
    used_bytes = used(writers[0])
    assert 0.5 * quota < used_bytes <= quota * 1.2, (used_bytes, quota)  # each writer's unswept part: at most one record a subfolder
    assert writers[0].find("/ds/2999.bin") is not None  # the newest stay


def test_a_file_larger_than_a_share_is_not_kept(tmp_path: Path) -> None:
    cache = NearCache(tmp_path, 1 << 20, "m")  # 4 KiB a subfolder
    cache.keep(status(length=5000), 0.0, b"z" * 5000)
    assert cache.flush(10) and cache.find("/ds/a.bin") is None


def test_a_sweep_removes_what_killed_writers_left(tmp_path: Path) -> None:
    cache = NearCache(tmp_path, 1 << 30, "m")
    cache.keep(status(length=3), 0.0, b"abc")
    assert cache.flush(10)
    folder = record_file(cache, "/ds/a.bin").parent
    old, new = folder / ".x.12345678.tmp", folder / ".y.12345678.tmp"
    old.write_bytes(b"half")
    new.write_bytes(b"half")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    cache.sweep(folder)
    assert not old.exists() and new.exists()  # a write under way is left alone


def test_the_folder_is_private_and_anyone_elses_is_not_used(tmp_path: Path) -> None:
    cache = NearCache(tmp_path, 1 << 30, "m")
    assert stat.S_IMODE(cache.root.stat().st_mode) == 0o700
    os.chmod(cache.root, 0o777)
    assert NearCache(tmp_path, 1 << 30, "m").usable and stat.S_IMODE(cache.root.stat().st_mode) == 0o700


def test_an_unwritable_folder_never_fails(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = NearCache(tmp_path, 1 << 30, "m")
    paths = [f"/ds/{i}" for i in range(3)]
    for path in paths:  # every subfolder these go to is a file: no write can succeed (as on a full disk)
        record_file(cache, path).parent.write_bytes(b"")
    for path in paths:
        cache.keep(status(path, length=3), 0.0, b"abc")
        assert cache.flush(10) and cache.find(path) is None
    assert sum("cannot be written" in r.message for r in caplog.records) == 1  # said once


def test_a_folder_emptied_meanwhile_is_made_again(tmp_path: Path) -> None:
    cache = NearCache(tmp_path / "near", 1 << 30, "m")
    cache.keep(status(length=3), 0.0, b"abc")
    assert cache.flush(10)
    shutil.rmtree(tmp_path / "near")
    cache.keep(status(length=3), 0.0, b"abd")
    assert cache.flush(10)
    found = cache.find("/ds/a.bin")
    assert found is not None and found.data == b"abd"
    assert stat.S_IMODE(cache.root.stat().st_mode) == 0o700


class HeldWrite:
    """Makes the cache's writing thread wait in its next write until `release` (the disk of
    a busy node, without one)."""

    def __init__(self, cache: NearCache, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started, self.go = threading.Event(), threading.Event()
        write = cache._write

        def held(where: Path, record: bytes) -> None:
            self.started.set()
            assert self.go.wait(10)
            write(where, record)

        monkeypatch.setattr(cache, "_write", held)

    def release(self) -> None:
        self.go.set()


def test_records_are_written_off_the_readers_thread_and_in_order_with_forget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = NearCache(tmp_path, 1 << 30, "m")
    disk = HeldWrite(cache, monkeypatch)
    cache.keep(status("/ds/a", length=3), 0.0, b"abc")  # returns while its record is being written
    assert disk.started.wait(10)
    cache.keep(status("/ds/b", length=3), 0.0, b"abc")  # waits behind it
    cache.keep(status("/ds/c", length=3), 0.0, b"abc")
    cache.forget("/ds/b")  # dropped before it is written (without waiting for another path's write)
    forgot = threading.Thread(target=cache.forget, args=("/ds/a",))
    forgot.start()  # waits for the record being written, then removes it
    forgot.join(0.3)
    assert forgot.is_alive() and not cache.flush(0.1)
    disk.release()
    forgot.join(10)
    assert cache.flush(10)
    assert [cache.find(p) is not None for p in ("/ds/a", "/ds/b", "/ds/c")] == [False, False, True]


def test_records_waiting_are_bounded_and_the_rest_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nearcache, "PENDING_BYTES", 250_000)
    cache = NearCache(tmp_path, 1 << 30, "m")
    disk = HeldWrite(cache, monkeypatch)
    data = os.urandom(100_000)
    cache.keep(status("/ds/0", length=len(data)), 0.0, data)
    assert disk.started.wait(10)  # taken by the writer: no longer waiting
    for i in range(1, 5):
        cache.keep(status(f"/ds/{i}", length=len(data)), 0.0, data)
    disk.release()
    assert cache.flush(10)
    assert [cache.find(f"/ds/{i}") is not None for i in range(5)] == [True, True, True, False, False]


def test_a_process_ending_writes_what_waits(tmp_path: Path) -> None:
    """A loader process that exits at once (no close) leaves every record it kept written,
    as does a forked child (a data loader's workers), with a writing thread of its own."""
    script = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[4])!r})
from strata.contract.proto import strata_pb2 as pb
from strata.cacheserver.client.nearcache import NearCache
cache = NearCache({str(tmp_path)!r}, 1 << 30, "m")
def keep(path):
    cache.keep(pb.FileInfo(path=path, length=100_000, version="v1", mount_id=7, block_size=1 << 24), 0.0,
               os.urandom(100_000))
for i in range(200):
    keep(f"/parent/{{i}}")
pid = os.fork()
if pid == 0:
    for i in range(200):
        keep(f"/child/{{i}}")
    sys.exit(0)
assert os.waitpid(pid, 0)[1] == 0
"""
    subprocess.run([sys.executable, "-P", "-c", script], check=True, timeout=60)
    cache = NearCache(tmp_path, 1 << 30, "m")
    assert all(cache.find(f"/parent/{i}") is not None and cache.find(f"/child/{i}") is not None for i in range(200))
    files = [f for folder in cache.root.iterdir() for f in folder.iterdir()]
    assert len(files) == 400 and not [f for f in files if f.name.endswith(".tmp")]
